"""Predictions for the reference recipes of shared/notes/long-context-moe.md (and the must-not-fit case), as
published (their routing) and dropless, the routing users train with: when a recipe does not fit dropless, the
first set of memory levers (search_spaces/cost/offload.py) under which it does, tried lightest first.

    .venv/bin/python bench/seed_recipes.py
`run()` returns the rows as dicts.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from search_spaces.cost.costmodel import estimate
from search_spaces.layouts.layout import Layout

DSV3 = dict(tp=1, cp=32, ep=32, etp=1, pp=8, vpp=4, mbs=1, gbs=128, precision="fp8-blockwise", dispatcher="deepep",
            recompute="mla_up_proj,layernorm,moe,mlp", optimizer_offload=1.0)
# Megatron-MoE-ModelZoo's long-context Qwen3-235B command runs --moe-router-force-load-balancing
QWEN = dict(tp=4, cp=4, ep=32, etp=1, pp=4, vpp=12, mbs=1, gbs=64, dispatcher="hybridep",
            recompute="moe_act,layernorm", cuda_graphs="attn,moe_router,moe_preprocess", routing="forced_balance")
RECIPES = [
    ("DeepSeek-V3 128K H100 (cp_comm_type p2p, the default)", "deepseek-v3", "h100", 256, 131072, DSV3),
    ("DeepSeek-V3 128K H100 (cp_comm_type a2a+p2p)", "deepseek-v3", "h100", 256, 131072,
     {**DSV3, "cp_comm_type": "a2a+p2p", "hierarchical_cp": [8, 4]}),  # a2a inside the 8-GPU node, p2p across
    ("DeepSeek-V3 256K H100, EDP=2 (a2a+p2p)", "deepseek-v3", "h100", 512, 262144,
     {**DSV3, "cp": 64, "cp_comm_type": "a2a+p2p", "hierarchical_cp": [8, 8]}),
    ("Qwen3-235B-A22B 128K GB200, BF16", "qwen3-235b-a22b", "gb200", 256, 131072, {**QWEN, "precision": "bf16"}),
    ("Qwen3-235B-A22B 128K GB200, MXFP8", "qwen3-235b-a22b", "gb200", 256, 131072, {**QWEN, "precision": "mxfp8"}),
    ("DeepSeek-V3 128K H100 without offload and recompute", "deepseek-v3", "h100", 256, 131072,
     {**DSV3, "optimizer_offload": 0.0, "recompute": "none"}),
]


# memory levers tried on a recipe that does not fit dropless, lightest first (the paged stash needs HybridEP: the
# rules refuse it elsewhere and the next set is tried)
LEVERS = [
    ("paged stash 1.5", {"expert_stash": "paged:1.5"}),
    ("bf16 moments", {"optimizer_states": "bf16"}),
    ("paged stash 1.5 + bf16 moments", {"expert_stash": "paged:1.5", "optimizer_states": "bf16"}),
    ("attention offload + bf16 moments", {"activation_offload": "core_attn,attn_proj", "optimizer_states": "bf16"}),
    ("attention offload + paged stash 1.5 + bf16 moments",
     {"activation_offload": "core_attn,attn_proj", "expert_stash": "paged:1.5", "optimizer_states": "bf16"}),
]


def _figures(est) -> dict:
    return {"legal": est.legal, "fits": est.fits, "peak_memory_gib": round(est.peak_memory_gib or 0, 1),
            "tflops_per_gpu": round(est.tflops_per_gpu or 0), "mfu": round(est.mfu or 0, 3),
            "tokens_per_sec_per_gpu": round(est.tokens_per_sec_per_gpu or 0)}


def dropless(model: str, gpu: str, n: int, seq: int, fields: dict) -> dict:
    """The recipe with dropless routing; when it does not fit, the first lever set that makes it fit (or none)."""
    est = estimate(model, gpu, n, seq, Layout.from_dict({**fields, "routing": "dropless"}))
    row = {**_figures(est), "levers": ""}
    if est.fits or not est.legal:
        return row
    for name, levers in LEVERS:
        with_levers = estimate(model, gpu, n, seq, Layout.from_dict({**fields, "routing": "dropless", **levers}))
        if with_levers.fits:
            return {**_figures(with_levers), "levers": name, "without_levers_gib": row["peak_memory_gib"]}
    return {**row, "levers": "none fits"}


def run() -> list[dict]:
    rows = []
    for title, model, gpu, n, seq, fields in RECIPES:
        est = estimate(model, gpu, n, seq, Layout.from_dict(fields))
        rows.append({"recipe": title, **_figures(est), "dropless": dropless(model, gpu, n, seq, fields)})
    return rows


def _line(r: dict) -> str:
    return (f"legal={r['legal']!s:5} fits={r['fits']!s:5} peak={r['peak_memory_gib']:6.1f} GiB "
            f"{r['tflops_per_gpu']:5d} TF/s/GPU  MFU {r['mfu']:.1%}  {r['tokens_per_sec_per_gpu']:,} tok/s/GPU")


if __name__ == "__main__":
    for r in run():
        d = r["dropless"]
        print(f"{r['recipe']:58} {_line(r)}")
        without = f" (without: {d['without_levers_gib']} GiB)" if "without_levers_gib" in d else ""
        print(f"{'  dropless' + (' with ' + d['levers'] if d['levers'] else ''):58} {_line(d)}{without}")
