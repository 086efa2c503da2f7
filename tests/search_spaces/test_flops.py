"""FLOPs per step against Megatron-Bridge's flop_utils formula and the published TF/s of the reference rows."""

import csv
from pathlib import Path

import pytest

from search_spaces.catalog.models import load_model
from search_spaces.cost.flops import flops_per_step, padded_vocab_size

DATA = Path(__file__).parents[1] / "data" / "megatron_bridge_performance_summary.csv"


def bridge_dsv3(seq, gbs):
    """transformer_flops() of megatron/bridge/training/utils/flop_utils.py written out for DeepSeek-V3 (MLA, MTP=1)."""
    h, n, layers, mtp = 7168, 128, 61, 1
    q_lora, kv_lora, qk, rope, v = 1536, 512, 128, 64, 128
    dense, moe = 3, 58 + mtp  # MTP layer counts as MoE (the last layer is MoE)
    num_layers = layers + mtp
    q_term = q_lora * (h + n * (qk + rope) + 1)
    attn = 6 * num_layers * (q_term + kv_lora * (h + n * (qk + v) + 1) + h * rope + n * v * h
                             + seq * n * (qk + rope) / 2 + seq * n * v / 2)
    mlp = 6 * h * (18432 * 3 * dense + 2048 * 8 * 3 * moe + 2048 * 3 * moe)
    mtp_terms = 6 * mtp * (3 * h + 2 * h * h)
    logits = 6 * h * 129280 * (mtp + 1)  # 129280 is already a multiple of 128
    return gbs * seq * (mlp + attn + mtp_terms + logits)


def bridge_qwen3_235b(seq, gbs):
    h, n, g, d, layers = 4096, 64, 4, 128, 94
    qproj = d * n
    proj = h * (qproj + 2 * d * g) + qproj * h
    attn = 6 * layers * (proj + qproj * seq / 2 * 2)
    mlp = 6 * h * (1536 * 8 * 3 * layers)
    logits = 6 * h * 151936
    return gbs * seq * (mlp + attn + logits)


@pytest.mark.parametrize("seq,gbs", [(4096, 1), (131072, 3)])
def test_deepseek_v3_matches_bridge_formula(seq, gbs):
    assert flops_per_step(load_model("deepseek-v3"), seq, gbs) == pytest.approx(bridge_dsv3(seq, gbs), rel=1e-12)


@pytest.mark.parametrize("seq,gbs", [(4096, 2), (32768, 1)])
def test_qwen3_matches_bridge_formula(seq, gbs):
    assert flops_per_step(load_model("qwen3-235b-a22b"), seq, gbs) == pytest.approx(bridge_qwen3_235b(seq, gbs),
                                                                                      rel=1e-12)


def test_padded_vocab():
    assert padded_vocab_size(151936) == 151936 and padded_vocab_size(100) == 128 and padded_vocab_size(129, 2) == 256


@pytest.mark.parametrize("name,model", [("DeepSeekV3", "deepseek-v3"), ("Qwen3_235B_a22B", "qwen3-235b-a22b"),
                                        ("Qwen3_30B_a3B", "qwen3-30b-a3b"), ("Kimi_K2", "kimi-k2"),
                                        ("LLAMA3.1_405B", "llama3.1-405b"), ("GPT OSS 120B", "gpt-oss-120b")])
def test_published_flops_per_token(name, model):
    """TF/s / (tokens/s) of the newest published row = FLOPs per token under the same accounting (<1%)."""
    rows = [r for r in csv.DictReader(open(DATA)) if r["model"] == name and r["release"] in ("26.08", "26.06")]
    assert rows
    for r in rows:
        published = float(r["tflops_per_gpu"].split()[0]) * 1e12 / float(r["tokens_per_sec_per_gpu"].split()[0])
        seq = int(r["seq_len"])
        assert flops_per_step(load_model(model), seq, 1) / seq == pytest.approx(published, rel=0.01)


def test_attention_grows_quadratically_and_sliding_window_does_not():
    dsv3 = load_model("deepseek-v3")
    per_token = [flops_per_step(dsv3, s, 1) / s for s in (4096, 8192, 16384)]
    assert per_token[2] - per_token[1] == pytest.approx(2 * (per_token[1] - per_token[0]), rel=1e-9)
    oss = load_model("gpt-oss-120b")
    short, long_ = flops_per_step(oss, 4096, 1) / 4096, flops_per_step(oss, 65536, 1) / 65536
    assert long_ / short < 2  # half the layers use a 128-token window
