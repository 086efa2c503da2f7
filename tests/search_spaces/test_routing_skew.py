"""Dropless routing skew by expert count and top-k (search_spaces/cost/routing.py: router_skew, CONTEXT_SPAN).

Few-expert routers (Mixtral: 8 experts, top-2) are balanced up to sampling, as their published dropless runs show;
the skews fitted on the fine-grained pairs (Qwen3-235B, DeepSeek-V3) and every catalogue model keep their values.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search_spaces.catalog.models import CATALOG_DIR, load_model
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.routing import (
    EXPERT_SKEW,
    SKEW_CHECKS,
    SKEW_FITTED_MODEL,
    dropless_load,
    expert_load,
    extrapolation_note,
    router_kind,
    router_skew,
    skew_for,
)
from search_spaces.layouts.layout import Layout

HF_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
MIXTRAL_7B = str(HF_CONFIGS / "mixtral-8x7b-v0.1.json")
MIXTRAL_22B = str(HF_CONFIGS / "mixtral-8x22b-v0.1.json")

# Mixtral layouts that ran dropless (4K, H100, BF16, alltoall): Megatron-MoE-ModelZoo runtime_configs/benchmarking/
# runtime.conf (8x7B: 64 GPUs TP1 PP4 VPP8 EP8; 8x22B: 128 GPUs TP2 PP8 EP8, best_practice/Mixtral/
# run_mixtral_8x22B.sh dropless ~455 TF/s), Megatron-LM's MoE README example (8x7B on 32 GPUs, TP1 PP4 EP8) and its
# tuning guide ("EP8TP1 is better than EP4TP2 for 8x7B"); EP4 and EP2 spread each rank over 2 and 4 experts.
MIXTRAL_LAYOUTS = [
    (MIXTRAL_7B, 64, dict(tp=1, pp=4, vpp=8, ep=8, mbs=1, gbs=256)),
    (MIXTRAL_7B, 32, dict(tp=1, pp=4, ep=8, mbs=1, gbs=128)),
    (MIXTRAL_7B, 64, dict(tp=2, pp=4, ep=4, mbs=1, gbs=256)),
    (MIXTRAL_7B, 32, dict(tp=2, pp=4, ep=2, mbs=1, gbs=128)),
    (MIXTRAL_22B, 128, dict(tp=2, pp=8, ep=8, mbs=1, gbs=256)),
    (MIXTRAL_22B, 64, dict(tp=2, pp=4, ep=8, mbs=1, gbs=8)),  # issue 57's reproduction
    (MIXTRAL_22B, 128, dict(tp=2, pp=8, ep=4, mbs=1, gbs=256)),
    (MIXTRAL_22B, 128, dict(tp=4, pp=8, ep=2, mbs=1, gbs=256)),
]


def _mixtral(model: str, gpus: int, layout: dict, routing: str):
    return estimate(model, "h100", gpus, 4096, Layout.from_dict(
        {**layout, "precision": "bf16", "dispatcher": "alltoall", "routing": routing}))


@pytest.mark.parametrize("model,gpus,layout", MIXTRAL_LAYOUTS)
def test_mixtral_layouts_that_ran_dropless_fit_and_cost_what_forced_balance_does(model, gpus, layout):
    forced, dropless = (_mixtral(model, gpus, layout, r) for r in ("forced_balance", "dropless"))
    assert dropless.legal and dropless.fits, (model, layout, dropless.peak_memory_gib)
    assert dropless.tokens_per_sec_per_gpu == pytest.approx(forced.tokens_per_sec_per_gpu, rel=0.10)
    assert dropless.tokens_per_sec_per_gpu <= forced.tokens_per_sec_per_gpu  # the sampling term still costs
    assert dropless.peak_memory_gib == pytest.approx(forced.peak_memory_gib, abs=2.0)


def test_mixtral_8x22b_dropless_against_token_drop_as_published():
    """Megatron-MoE-ModelZoo: 455 TF/s dropless against 470 with token drop padded to capacity 1.0 (0.968; the pair
    CONTEXT_SPAN was chosen with, so this checks the rule's arithmetic, not a held-out figure)."""
    layout = dict(tp=2, pp=8, ep=8, mbs=1, gbs=256)
    dropless, dropped = (_mixtral(MIXTRAL_22B, 128, layout, r) for r in ("dropless", "capacity:1.0"))
    assert dropless.tflops_per_gpu / dropped.tflops_per_gpu == pytest.approx(455 / 470, abs=0.03)


def test_a_context_spans_every_expert_of_a_mixtral_router():
    for path in (MIXTRAL_7B, MIXTRAL_22B):
        mixtral = load_model(path)
        assert (mixtral.num_experts, mixtral.topk) == (8, 2)
        assert router_skew(mixtral, cpu=False) == 0.0
        # the sampling term alone: 2,048 tokens (TP2 + SP) x top-2 copies per rank
        assert expert_load(mixtral, Layout(tp=2, ep=8), 2048, cpu=False) == pytest.approx(1.022, abs=0.005)
        note = extrapolation_note(mixtral, Layout(tp=2, ep=8), cpu=False)
        assert "top-2 of 8 experts" in note and "balanced up to sampling" in note and "0.968" in note


def test_the_fitted_pairs_and_every_catalogue_model_keep_their_skew():
    """Routers at least as fine-grained as the fitted pairs (E / k >= 16 softmax, >= 32 sigmoid) are unchanged."""
    assert router_skew(load_model("qwen3-235b-a22b"), cpu=False) == EXPERT_SKEW["softmax"] == 1.3
    assert router_skew(load_model("deepseek-v3"), cpu=False) == EXPERT_SKEW["sigmoid"] == 0.16
    names = sorted(p.stem for p in CATALOG_DIR.glob("*.json") if not p.stem.startswith("tiny-"))
    moe = [m for m in map(load_model, names) if m.is_moe]
    assert len(moe) >= 5
    for model in moe:
        assert router_skew(model, cpu=False) == EXPERT_SKEW[router_kind(model)], model.name
    # UltraEP's trained-router loads at EP64 (SKEW_CHECKS): within the 12% test_costmodel holds them to
    for kind, (ep, per_rank, copies, published) in SKEW_CHECKS.items():
        assert dropless_load(ep, per_rank, copies, EXPERT_SKEW[kind]) == pytest.approx(published, rel=0.12), kind


def test_the_published_throughput_pairs_hold():
    """Qwen3-235B on 256 H100 (Megatron-MoE-ModelZoo) and DeepSeek-V3 on 1024 H100 (Megatron-Bridge): dropless over
    forced balance within 0.05 of the published ratio (tests/search_spaces/test_costmodel.py holds all four Qwen
    lengths)."""
    for seq, (forced, dropless) in {16384: (295, 237), 131072: (389, 357)}.items():
        ratios = [estimate("qwen3-235b-a22b", "h100", 256, seq, Layout.from_dict(dict(
            tp=4, cp=seq // 16384, ep=8, etp=1, pp=8, vpp=4, mbs=1, gbs=256, precision="bf16", dispatcher="deepep",
            recompute="layernorm,moe", routing=r))).tflops_per_gpu for r in ("forced_balance", "dropless")]
        assert ratios[1] / ratios[0] == pytest.approx(dropless / forced, abs=0.05), seq
    dsv3 = dict(tp=2, pp=8, vpp=4, ep=64, etp=1, mbs=1, gbs=8192, precision="fp8-blockwise", dispatcher="deepep",
                recompute="mla_up_proj,mlp")
    f, d = (estimate("deepseek-v3", "h100", 1024, 4096, Layout.from_dict({**dsv3, "routing": r})).tflops_per_gpu
            for r in ("forced_balance", "dropless"))
    assert d / f == pytest.approx(338 / 370, abs=0.05)


def test_skew_grows_with_experts_per_choice_up_to_the_fit():
    for kind, (experts, topk) in SKEW_FITTED_MODEL.items():
        skews = [skew_for(kind, e, 2) for e in (2, 4, 8, 12, 16, 32, 64, 128, 256, 1024)]
        assert skews == sorted(skews) and skews[0] == 0.0 and skews[-1] == EXPERT_SKEW[kind]
        assert skew_for(kind, experts, topk) == EXPERT_SKEW[kind]
        # top-k: more choices per token over the same experts spread a context wider
        assert skew_for(kind, 64, 1) >= skew_for(kind, 64, 2) >= skew_for(kind, 64, 8)


@pytest.mark.parametrize("model", ["qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", MIXTRAL_7B])
def test_busiest_over_mean_falls_with_more_experts_per_rank(model):
    """One model, EP from its experts down to 1: fewer experts per rank (a wider EP group) never lowers the load."""
    spec = load_model(model)
    eps = [ep for ep in (1, 2, 4, 8, 16, 32, 64, 128, 256) if spec.num_experts % ep == 0]
    loads = [expert_load(spec, Layout(ep=ep), 4096, cpu=False) for ep in eps]
    assert loads == sorted(loads) and loads[0] == 1.0 and all(load >= 1.0 for load in loads)


@settings(max_examples=300, deadline=None)
@given(ep=st.sampled_from([2, 4, 8, 16, 32, 64, 128]), per_rank=st.integers(1, 64), more=st.integers(0, 64),
       copies=st.floats(1.0, 1e7), skew=st.floats(0.0, 5.0))
def test_the_load_never_rises_with_experts_per_rank(ep, per_rank, more, copies, skew):
    low, high = dropless_load(ep, per_rank, copies, skew), dropless_load(ep, per_rank + more, copies, skew)
    assert 1.0 <= high <= low <= ep


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from(["qwen3-30b-a3b", "deepseek-v3"]), ep_log=st.integers(0, 8), per_rank=st.integers(1, 64),
       topk=st.integers(1, 16), tokens=st.floats(1.0, 1e6), etp=st.sampled_from([1, 2]))
def test_dropless_load_lies_between_balance_and_every_copy_on_one_rank(base, ep_log, per_rank, topk, tokens, etp):
    ep = 2 ** ep_log
    experts = ep * per_rank
    spec = dataclasses.replace(load_model(base), num_experts=experts, topk=min(topk, experts))
    load = expert_load(spec, Layout(ep=ep, etp=etp), tokens, cpu=False)
    assert 1.0 <= load <= ep
