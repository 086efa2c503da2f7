"""Model and hardware catalogs: exact tiny models, known parameter counts, local config.json, errors."""

import json

import pytest

from search_spaces.errors import SpecError
from search_spaces.hardware import GPU_NAMES, load_gpu
from search_spaces.models import MODEL_NAMES, load_model


def test_tiny_moe_is_exactly_the_contract():
    m = load_model("tiny-moe")
    assert (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (64, 4, 4, 4, 16)
    assert (m.ffn_hidden_size, m.moe_ffn_hidden_size, m.num_experts, m.topk, m.vocab_size) == (128, 128, 4, 2, 256)
    assert m.is_moe and not m.is_mla and not m.tie_embeddings and m.first_k_dense == 0
    assert m.hf_config["max_position_embeddings"] == 4096 and m.hf_config["rms_norm_eps"] == 1e-6


def test_tiny_mla_moe_is_deepseek_style():
    m = load_model("tiny-mla-moe")
    assert m.is_mla and m.is_moe
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (32, 32, 16, 8, 16)
    assert (m.num_experts, m.first_k_dense, m.num_shared_experts, m.shared_expert_ffn_hidden_size) == (4, 1, 1, 128)
    assert not m.layer_is_moe(0) and m.layer_is_moe(1)


@pytest.mark.parametrize("name,low,high", [
    ("deepseek-v3", 680e9, 690e9),       # 671B + 14B MTP
    ("kimi-k2", 1.02e12, 1.04e12),
    ("qwen3-235b-a22b", 234e9, 236e9),
    ("qwen3-30b-a3b", 30e9, 31e9),
    ("qwen3-next-80b-a3b", 79e9, 81.5e9),
    ("gpt-oss-120b", 116e9, 121e9),
    ("llama3-70b", 70e9, 71e9),
    ("llama3.1-405b", 405e9, 406.5e9),
])
def test_catalog_parameter_counts_match_the_published_sizes(name, low, high):
    assert low <= load_model(name).total_params() <= high


def test_catalog_contains_the_issue_models_and_layer_patterns():
    for name in ("deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "gpt-oss-120b",
                 "kimi-k2", "llama3-70b", "llama3.1-405b", "tiny-moe", "tiny-mla-moe"):
        assert name in MODEL_NAMES
    nxt = load_model("qwen3-next-80b-a3b").attention_kinds()
    assert nxt[:4] == ("linear", "linear", "linear", "full") and nxt.count("full") == 12
    oss = load_model("gpt-oss-120b").attention_kinds()
    assert oss[:2] == ("sliding", "full")
    dsv3 = load_model("deepseek-v3")
    assert dsv3.mtp_layers == 1 and dsv3.first_k_dense == 3 and dsv3.num_moe_layers == 58
    assert not load_model("llama3-70b").is_moe


def test_local_config_json_path(tmp_path):
    cfg = json.loads((load_model("tiny-moe").hf_config and json.dumps(load_model("tiny-moe").hf_config)))
    cfg["num_hidden_layers"] = 6
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(folder / "config.json"))
    assert m.num_layers == 6 and m.name == "my-model"
    assert load_model(str(folder)).num_layers == 6


def test_bad_models_raise_spec_error(tmp_path):
    with pytest.raises(SpecError, match="unknown model"):
        load_model("no-such-model")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError):
        load_model(str(bad))
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(SpecError, match="lacks"):
        load_model(str(bad))


def test_with_overrides():
    m = load_model("deepseek-v3").with_overrides(num_layers=2, hidden_size=128)
    assert (m.num_layers, m.hidden_size, m.first_k_dense) == (2, 128, 1)
    assert load_model("tiny-moe").with_overrides() is load_model("tiny-moe")
    with pytest.raises(SpecError):
        load_model("tiny-moe").with_overrides(num_layers=0)


def test_gpus():
    assert {"h100", "h200", "b200", "gb200", "gb300", "cpu"} <= set(GPU_NAMES)
    h100 = load_gpu("H100")
    assert h100.peak("bf16") == pytest.approx(989.4) and h100.peak("fp8") == pytest.approx(1978.9)
    assert not h100.supports("mxfp8") and load_gpu("gb200").supports("mxfp8")
    assert load_gpu("gb200").nvlink_domain == 72 and h100.nvlink_domain == 8
    assert load_gpu("h200").memory_gib > h100.memory_gib
    cpu = load_gpu("cpu")
    assert cpu.supports("fp32") and cpu.supports("bf16") and not cpu.supports("fp8")
    with pytest.raises(SpecError, match="does not support"):
        cpu.peak("fp8")
    with pytest.raises(SpecError, match="unknown GPU"):
        load_gpu("tpu")
