"""Rules of thumb (shared/notes/long-context-moe.md) as starting layouts for a sweep.

1. CP ~ seq_len / 4096 (a 4K shard per rank), a power of two; no CP at 8K and below.
2. Keep DP alive: the smallest PP that fits.
3. Selective recompute first (small modules), full recompute last; 4. never core_attn at long context.
5. On NVL72 trade part of CP for TP (TP2 x CP/2 next to TP1 x CP).
6. GBS: given, or ~16M tokens per step.
7. Optimizer CPU offload for DSV3-class models (> 300B parameters) at 128K and beyond.
8. EP*TP inside the NVLink domain where the experts allow, ETP = 1; PP across nodes.
Candidates are checked by the rules and ranked by the cost model (fitting ones first).
"""

from __future__ import annotations

import math

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.hardware import GPUSpec, load_gpu
from search_spaces.catalog.models import ModelSpec, load_model
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.pipeline import placement
from search_spaces.layouts.layout import Layout, distinct
from search_spaces.layouts.rules import a2a_heads_divide, check
from search_spaces.layouts.space import default_gbs, divisors, recompute_options


def _pow2_floor(x: float) -> int:
    return 2 ** max(0, int(math.floor(math.log2(max(x, 1)))))


def rule_of_thumb_cp(seq_len: int) -> int:
    """Rule 1: one 4K shard per CP rank, not below 8K."""
    if seq_len <= 8192:
        return 1
    return _pow2_floor(seq_len / 4096)


def rule_of_thumb_cp_comm(model: ModelSpec, gpu: GPUSpec, tp: int, cp: int) -> tuple[str, tuple[int, ...]]:
    """p2p while the TP*CP ranks share an NVLink domain; beyond it a2a over the CP ranks inside the domain and
    p2p across (a2a+p2p), when the heads split that far. Attention that p2p cannot run on a GPU (sinks, sliding
    windows: rules' cp_window_sinks) runs a2a over every CP rank, or allgather (sliding windows alone) where the
    heads do not split that far."""
    if cp > 1 and _p2p_cannot_run(model, gpu, cp):
        if a2a_heads_divide(model, tp, cp) or model.attention_sinks:
            return "a2a", ()
        return "allgather", ()
    inside = gpu.nvlink_domain // tp
    if cp == 1 or tp * cp <= gpu.nvlink_domain or inside < 2 or cp % inside:
        return "p2p", ()
    if not a2a_heads_divide(model, tp, inside):
        return "p2p", ()
    return "a2a+p2p", (inside, cp // inside)


def _p2p_cannot_run(model: ModelSpec, gpu: GPUSpec, cp: int) -> bool:
    """The rules' own verdict (cp_window_sinks) on p2p for this model's attention at this CP size."""
    return any(v.rule == "cp_window_sinks"
               for v in check(model, gpu, cp, 1 << 20, Layout(cp=cp, cp_comm_type="p2p")))


def attention_cp_cap(model: ModelSpec, gpu: GPUSpec, tp: int, cp: int) -> int:
    """`cp`, halved until the model's attention can run it: attention sinks run CP with a2a only, which splits the
    heads of each TP rank over the CP ranks (gpt-oss's 8 KV heads: CP 8 at most at TP 1)."""
    if gpu.is_cpu or not model.attention_sinks:
        return cp
    while cp > 1 and not a2a_heads_divide(model, tp, cp):
        cp //= 2
    return cp


def _precision(gpu: GPUSpec) -> str:
    if gpu.is_cpu:
        return "fp32"
    return "mxfp8" if gpu.supports("mxfp8") else "fp8-blockwise"


def _dispatcher(model: ModelSpec, gpu: GPUSpec) -> str:
    if not model.is_moe or gpu.is_cpu:
        return "alltoall"
    return "hybridep" if gpu.nvlink_domain > 8 else "deepep"


def _vpp_options(model: ModelSpec, pp: int) -> list[int]:
    if pp == 1:
        return [1]
    layers = model.num_layers + model.mtp_layers
    # aim for 2-4 layers per virtual stage
    out = [v for v in (8, 6, 4, 12, 3, 2, 1) if placement(model, pp, v) is not None and 2 <= layers / (pp * v) <= 6]
    return out[:2] or [1]


def seed_layouts(model: ModelSpec | str, gpu: GPUSpec | str, num_gpus: int, seq_len: int, gbs: int | None = None,
                 limit: int = 8, cal: Calibration | None = None) -> list[Layout]:
    """Up to `limit` legal layouts from the rules of thumb, those predicted to fit first, fastest first."""
    model = load_model(model) if isinstance(model, str) else model
    gpu = load_gpu(gpu) if isinstance(gpu, str) else gpu
    gbs = gbs or default_gbs(seq_len, gpu)
    huge = model.total_params() > 300e9
    offload = 1.0 if (huge and seq_len >= 131072 and not gpu.is_cpu) else 0.0
    rcs = [r for r in recompute_options(model, gpu.is_cpu) if r not in ("core_attn",)]
    # rule 3: selective small modules first; the heavy selective set before none when offload is needed
    order = [r for r in rcs if r not in ("none", "full")] + ["none", "full"]
    candidates = _seed_candidates(model, gpu, num_gpus, seq_len, gbs, offload, order)
    return _best_per_grid(model, gpu, num_gpus, seq_len, distinct(candidates), limit, cal)


def _seed_tp_cp(model: ModelSpec, gpu: GPUSpec, seq_len: int) -> list[tuple[int, int]]:
    """The (TP, CP) pairs the rules of thumb try, the rule-of-thumb CP first (each CP capped by what the model's
    attention can run)."""
    cp0 = rule_of_thumb_cp(seq_len)
    tp_cp = [(1, cp0)]
    if gpu.nvlink_domain > 8 and cp0 >= 2:
        tp_cp += [(2, cp0 // 2), (4, max(cp0 // 4, 1))]
    elif cp0 >= 2:
        tp_cp += [(2, cp0 // 2)]
    tp_cp += [(1, max(cp0 // 2, 1)), (1, cp0 * 2)]
    return list(dict.fromkeys((tp, attention_cp_cap(model, gpu, tp, cp)) for tp, cp in tp_cp))


def _seed_candidates(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, gbs: int, offload: float,
                     order: list[str]) -> list[Layout]:
    """Every legal layout of the rules of thumb's (TP, CP), PP, EP and VPP choices with each recompute of `order`."""
    candidates: list[Layout] = []
    for tp, cp in _seed_tp_cp(model, gpu, seq_len):
        if num_gpus % (tp * cp):
            continue
        rest = num_gpus // (tp * cp)
        pps = [p for p in (1, 2, 4, 8, 16, 32) if rest % p == 0 and placement(model, p, 1) is not None]
        for pp in pps:
            dp = rest // pp
            eps = _ep_options(model, gpu, num_gpus, tp, pp)
            for ep in eps[:3]:
                for vpp in _vpp_options(model, pp):
                    for rc in order:
                        cp_comm, sizes = rule_of_thumb_cp_comm(model, gpu, tp, cp)
                        base = dict(tp=tp, cp=cp, ep=ep, etp=1, pp=pp, vpp=vpp, mbs=1, gbs=gbs,
                                    precision=_precision(gpu), dispatcher=_dispatcher(model, gpu),
                                    cp_comm_type=cp_comm, hierarchical_cp=sizes,
                                    optimizer_offload=offload, recompute=rc)
                        if dp and gbs % dp:
                            continue
                        try:
                            layout = Layout.from_dict(base)
                        except Exception:  # noqa: BLE001 - a rule-of-thumb combination the Layout refuses
                            continue
                        if not check(model, gpu, num_gpus, seq_len, layout):
                            candidates.append(layout)
    return candidates


def _best_per_grid(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, candidates: list[Layout],
                   limit: int, cal: Calibration | None) -> list[Layout]:
    """Up to `limit` of the first 400 candidates, those predicted to fit first, fastest first: one layout per
    parallel grid (the best recompute choice for each)."""
    scored = []
    for layout in candidates[:400]:
        est = estimate(model, gpu, num_gpus, seq_len, layout, cal=cal)
        scored.append((not est.fits, -(est.tokens_per_sec_per_gpu or 0.0), layout))
    scored.sort(key=lambda x: (x[0], x[1]))
    seen, out = set(), []
    for _, _, layout in scored:
        grid = (layout.tp, layout.cp, layout.ep, layout.pp, layout.vpp)
        if grid in seen:
            continue
        seen.add(grid)
        out.append(layout)
        if len(out) >= limit:
            break
    return out


def _ep_options(model: ModelSpec, gpu: GPUSpec, num_gpus: int, tp: int, pp: int) -> list[int]:
    """Rule 8: the largest EP inside the NVLink domain (with TP), then the next larger one across it."""
    if not model.is_moe:
        return [1]
    divs = [d for d in divisors(model.num_experts, upto=num_gpus) if num_gpus % (d * pp) == 0]
    inside = [d for d in divs if d * tp <= gpu.nvlink_domain]
    outside = [d for d in divs if d * tp > gpu.nvlink_domain]
    out = ([max(inside)] if inside else []) + outside[:3]
    return out or [1]
