"""The layout space: every combination of the dimensions below, its legal members, and a quick exploration.

Dimensions (per model / GPU): PP, VPP, TP, CP, EP, ETP, MBS (the parallel *grid*), then the *features*:
precision, recompute, CUDA graphs, dispatcher, routing, cp_comm_type, optimizer offload. GBS is fixed per space
(given, or ~16M tokens per step rounded to a power of two sequences) so layouts compare at the same batch.
An opt-in dimension (routing: token dropping changes what is trained) keeps its default unless `free` names it
or `fixed` sets it; a benchmark-only value (forced balance) is never a member unless fixed.

Enumeration is nested and prunes early: a partial grid that breaks a rule (e.g. TP*CP*PP does not divide
the world) is counted once, times the size of the subtree it cuts, under that rule's name. Feature legality
only depends on the GPU and on whether CP > 1 (and a2a can split the heads), so it is computed once per class.
`explore()` estimates only grids whose static memory can fit, and per grid only a greedy handful of features.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Iterator

from search_spaces.breakdown import GIB
from search_spaces.calibration_file import Calibration
from search_spaces.costmodel import Estimate, estimate
from search_spaces.errors import SpecError
from search_spaces.extra_memory import cp_attention_buffers
from search_spaces.hardware import GPUSpec, load_gpu
from search_spaces.inputs import MAX_GBS, MAX_GPUS, MAX_SEQ_LEN, check_size
from search_spaces.layout import BY_NAME, DIMENSIONS, PARALLEL_SIZES, SEARCH_DIMENSIONS, Layout
from search_spaces.models import ModelSpec, load_model
from search_spaces.rules import (LEVELS, RULES, check, hierarchical_cp_violation, level_reads,
                                  level_rules)

TARGET_TOKENS_PER_STEP = 1 << 24
VPP_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)
MBS_CHOICES = (1, 2, 4)
# the figures of each layout `explore` lists (Estimate's fields)
TOP_PREDICTION = ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s", "peak_memory_gib", "fits")
# the router's production modes: dropless, and token dropping at the balanced share (a larger factor only costs
# more in the cost model, which does not see what dropping does to training: a user who wants one fixes it)
ROUTING_CHOICES = ("dropless", "capacity:1.0")
OPT_IN = tuple(d.name for d in DIMENSIONS if d.opt_in)
# the parallel grid (enumerated nested, pruned by rule) and the features tried on each legal grid
GRID_FIELDS = PARALLEL_SIZES + ("mbs",)
FEATURE_FIELDS = tuple(n for n in SEARCH_DIMENSIONS if n not in GRID_FIELDS) + ("distributed_optimizer",)

# the rules decided at each level of the nested enumeration (others cannot fail there), and the grid fields
# those rules read (a probe's verdict is cached per distinct value of them): both from the rules' declarations
_LEVEL_RULES = {level: level_rules(level) for level in LEVELS}
_LEVEL_READS = {level: level_reads(level, GRID_FIELDS) for level in _LEVEL_RULES}
_FEATURE_READS = level_reads(None, GRID_FIELDS)  # the grid fields the feature rules read


def default_gbs(seq_len: int, gpu: GPUSpec | None = None) -> int:
    """~16M tokens per step as a power of two sequences (8 sequences on cpu, where steps must stay short)."""
    if gpu is not None and gpu.is_cpu:
        return 8
    return max(1, 2 ** round(math.log2(max(TARGET_TOKENS_PER_STEP / seq_len, 1))))


def _pow2_upto(n: int) -> list[int]:
    return [2 ** i for i in range(int(math.log2(max(n, 1))) + 1)]


def divisors(n: int, upto: int | None = None) -> list[int]:
    """The divisors of `n` not above `upto`, ascending, in at most min(isqrt(n), upto) trial divisions (a
    divisor above the square root pairs with one below it): bounded by the size ranges (MAX_GPUS: 1,024 steps),
    never by n itself."""
    limit = n if upto is None else min(n, upto)
    small, large = [], []
    for d in range(1, min(math.isqrt(n), limit) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d and n // d <= limit:
                large.append(n // d)
    return small + large[::-1]


@dataclass
class Dimensions:
    """The values each field takes in the space (after `fixed`)."""
    values: dict[str, list[Any]]

    def size(self) -> int:
        return math.prod(len(v) for v in self.values.values())


def dimensions(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int,
               fixed: dict | None = None, gbs: int | None = None, free: Iterable[str] = ()) -> Dimensions:
    """The raw (unfiltered) value lists of the space; the opt-in dimensions vary only when `free` names them."""
    cpu = gpu.is_cpu
    units = model.num_layers + model.mtp_layers + 2
    v: dict[str, list[Any]] = {}
    v["pp"] = divisors(num_gpus, upto=min(units, 64))
    v["vpp"] = list(VPP_CHOICES)
    v["tp"] = [t for t in _pow2_upto(min(gpu.nvlink_domain, num_gpus, 64))]
    # at least 1K tokens per CP rank on GPUs (CP pays from ~8K); 128 on cpu so small test runs can use CP
    v["cp"] = _pow2_upto(min(num_gpus, max(seq_len // (128 if cpu else 1024), 1)))
    if model.is_moe:
        v["ep"] = divisors(model.num_experts, upto=num_gpus)
        v["etp"] = [1, 2, 4, 8] if not cpu else [1, 2]
    else:
        v["ep"], v["etp"] = [1], [1]
    v["mbs"] = list(MBS_CHOICES)
    if cpu:
        precisions = ["fp32", "bf16"]
    elif gpu.supports("mxfp8"):
        precisions = ["bf16", "mxfp8"]
    else:
        precisions = ["bf16", "fp8-blockwise"]
    v["precision"] = precisions
    v["recompute"] = recompute_options(model, cpu)
    if cpu:
        v["cuda_graphs"] = [()]
    else:
        v["cuda_graphs"] = [(), ("attn", "moe_router", "moe_preprocess") if model.is_moe else ("attn", "mlp")]
    if model.is_moe:
        v["dispatcher"] = ["alltoall", "allgather"] if cpu else ["alltoall", "deepep", "hybridep"]
    else:
        v["dispatcher"] = ["alltoall"]
    v["routing"] = list(ROUTING_CHOICES) if model.is_moe else ["dropless"]
    # the EP overlap needs CUDA streams and expert parallelism (the rules refuse it where Megatron does)
    v["ep_overlap"] = [False, True] if model.is_moe and not cpu else [False]
    for name in OPT_IN:
        if name not in free:
            v[name] = [BY_NAME[name].default]
    v["cp_comm_type"] = ["p2p"] if cpu else ["p2p", "a2a", "allgather", "a2a+p2p"]
    # a2a+p2p's (a2a size, p2p size) for every CP of the space (the rules keep those whose product is the CP)
    v["hierarchical_cp"] = [()] if cpu else [()] + hierarchical_options(v["cp"])
    v["optimizer_offload"] = [0.0] if cpu else [0.0, 1.0]
    v["distributed_optimizer"] = [True]
    v["gbs"] = [check_size(gbs, "gbs", MAX_GBS) if gbs is not None else default_gbs(seq_len, gpu)]
    for name, value in (fixed or {}).items():
        if name not in BY_NAME:
            raise SpecError(f"unknown layout field {name!r} in fixed values; allowed: {', '.join(BY_NAME)}")
        v[name] = [BY_NAME[name].parse(value)]  # a SpecError names a bad value
    return Dimensions(v)


def hierarchical_options(cps: list[int]) -> list[tuple[int, int]]:
    """Two-level splits (a2a, p2p), both >= 2, of each CP size, smallest CP first."""
    return [(a, cp // a) for cp in sorted(set(cps)) for a in divisors(cp, upto=cp // 2) if a >= 2]


def recompute_options(model: ModelSpec, cpu: bool = False) -> list[str]:
    """Recompute choices, lightest first (rule of thumb: selective small modules before full)."""
    opts = ["none", "layernorm"]
    if model.is_moe and not cpu:  # on CPU moe_act needs grouped GEMM, which the CPU trainer does not use
        opts.append("moe_act,layernorm")
    if model.is_mla:
        opts.append("mla_up_proj,layernorm")
    heavy = (["mla_up_proj"] if model.is_mla else []) + ["layernorm"] + (["moe"] if model.is_moe else []) + ["mlp"]
    opts.append(",".join(heavy))
    opts += ["core_attn", "full"]
    return list(dict.fromkeys(opts))


def _layout(values: dict[str, Any]) -> Layout:
    return Layout(**values)


@dataclass
class SpaceCount:
    total: int = 0
    legal: int = 0
    rejected_by_rule: dict[str, int] = field(default_factory=dict)

    def reject(self, rule: str, n: int) -> None:
        self.rejected_by_rule[rule] = self.rejected_by_rule.get(rule, 0) + n


def _first(violations, rules) -> str | None:
    names = {v.rule for v in violations}
    for r in RULES:
        if r in names and r in rules:
            return r
    return None


def iter_grids(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, dims: Dimensions,
               count: SpaceCount | None = None) -> Iterator[dict[str, Any]]:
    """Legal parallel grids (dicts of GRID_FIELDS + gbs), pruning by rule as early as possible."""
    v = dims.values
    feat_size = math.prod(len(v[f]) for f in FEATURE_FIELDS)
    base = {f: v[f][0] for f in FEATURE_FIELDS}
    base.update(gbs=v["gbs"][0], **{k: v[k][0] for k in ("sequence_parallel", "recompute_method",
                                                          "recompute_num_layers") if k in v})
    plain = {**base, "recompute": "none", "cuda_graphs": (), "optimizer_offload": 0.0,
             "precision": "fp32" if gpu.is_cpu else "bf16", "dispatcher": "alltoall", "cp_comm_type": "p2p"}
    plain.pop("gbs")

    memo: dict[tuple, str | None] = {}

    def probe(level: str, **grid) -> str | None:  # computed once per distinct value of the fields it reads
        key = (level,) + tuple(grid[k] for k in _LEVEL_READS[level])
        if key not in memo:
            memo[key] = _probe(level, **grid)
        return memo[key]

    def _probe(level: str, **grid) -> str | None:
        layout = Layout(**{**_defaults_grid(), **grid},
                        **{k: plain[k] for k in ("precision", "dispatcher", "cp_comm_type")},
                        gbs=grid.get("mbs", 1) * 1, **({"sequence_parallel": plain["sequence_parallel"]}
                                                       if "sequence_parallel" in plain else {}))
        return _first(check(model, gpu, num_gpus, seq_len, layout), _LEVEL_RULES[level])

    sizes = {k: len(v[k]) for k in GRID_FIELDS}
    for pp, vpp in itertools.product(v["pp"], v["vpp"]):
        rest = sizes["tp"] * sizes["cp"] * sizes["ep"] * sizes["etp"] * sizes["mbs"] * feat_size
        rule = probe("pipe", pp=pp, vpp=vpp)
        if rule:
            if count:
                count.reject(rule, rest)
            continue
        for tp in v["tp"]:
            rest = sizes["cp"] * sizes["ep"] * sizes["etp"] * sizes["mbs"] * feat_size
            rule = probe("tp", pp=pp, vpp=vpp, tp=tp)
            if rule:
                if count:
                    count.reject(rule, rest)
                continue
            for cp in v["cp"]:
                rest = sizes["ep"] * sizes["etp"] * sizes["mbs"] * feat_size
                rule = probe("cp", pp=pp, vpp=vpp, tp=tp, cp=cp)
                if rule:
                    if count:
                        count.reject(rule, rest)
                    continue
                for ep, etp in itertools.product(v["ep"], v["etp"]):
                    rest = sizes["mbs"] * feat_size
                    rule = probe("ep", pp=pp, vpp=vpp, tp=tp, cp=cp, ep=ep, etp=etp)
                    if rule:
                        if count:
                            count.reject(rule, rest)
                        continue
                    dp = num_gpus // (tp * cp * pp)
                    for mbs in v["mbs"]:
                        gbs = v["gbs"][0]
                        if gbs % (mbs * dp):
                            if count:
                                count.reject("global_batch", feat_size)
                            continue
                        yield {"pp": pp, "vpp": vpp, "tp": tp, "cp": cp, "ep": ep, "etp": etp, "mbs": mbs,
                               "gbs": gbs}


def _defaults_grid() -> dict[str, int]:
    return {name: 1 for name in GRID_FIELDS}


class _FeatureTable:
    """Legal feature combinations per class of grid. The feature rules depend on CP > 1 and on whether a2a can
    split the heads; the CP hierarchy (the last rule) on TP and CP, so it is expanded per (TP, CP)."""

    def __init__(self, model, gpu, num_gpus, seq_len, dims: Dimensions):
        self.model, self.gpu, self.num_gpus, self.seq_len, self.dims = model, gpu, num_gpus, seq_len, dims
        self._base: dict[tuple, tuple[list[dict], dict[str, int]]] = {}
        self._cache: dict[tuple, tuple[list[dict], dict[str, int]]] = {}

    def get(self, grid: dict[str, Any]) -> tuple[list[dict], dict[str, int]]:
        key = (grid["tp"], grid["cp"])
        if key not in self._cache:
            legal, rejected = self._base_combos(grid)
            hier = self.dims.values.get("hierarchical_cp", [()])
            expanded: list[dict] = []
            counts = {rule: n * len(hier) for rule, n in rejected.items()}
            allowed = {kind: [sizes for sizes in hier if not hierarchical_cp_violation(
                self.model, Layout(tp=grid["tp"], cp=grid["cp"], cp_comm_type=kind, hierarchical_cp=sizes))]
                for kind in {f["cp_comm_type"] for f in legal}}
            for feats in legal:
                ok = allowed[feats["cp_comm_type"]]
                if len(hier) > len(ok):
                    counts["hierarchical_cp"] = counts.get("hierarchical_cp", 0) + len(hier) - len(ok)
                expanded += [{**feats, "hierarchical_cp": sizes} for sizes in ok]
            self._cache[key] = (expanded, counts)
        return self._cache[key]

    def _base_combos(self, grid: dict[str, Any]) -> tuple[list[dict], dict[str, int]]:
        """Every combination of the features but the hierarchy, checked by every rule but the hierarchy's."""
        key = tuple(grid[f] for f in _FEATURE_READS)
        if key not in self._base:
            legal, rejected = [], {}
            v = self.dims.values
            extra = {k: v[k][0] for k in ("sequence_parallel", "recompute_method", "recompute_num_layers") if k in v}
            fields = [f for f in FEATURE_FIELDS if f != "hierarchical_cp"]
            for combo in itertools.product(*(v[f] for f in fields)):
                feats = dict(zip(fields, combo))
                if grid["cp"] == 1 and feats["cp_comm_type"] != v["cp_comm_type"][0]:
                    # cp_comm_type is meaningless without CP: keep one value
                    rejected["cp_comm_unused"] = rejected.get("cp_comm_unused", 0) + 1
                    continue
                layout = _layout({**grid, **feats, **extra})
                found = [x for x in check(self.model, self.gpu, self.num_gpus, self.seq_len, layout)
                         if x.rule != "hierarchical_cp"]
                rule = _first(found, RULES)
                if rule:
                    rejected[rule] = rejected.get(rule, 0) + 1
                else:
                    legal.append({**feats, **extra})
            self._base[key] = (legal, rejected)
        return self._base[key]


def _resolve(model, gpu, num_gpus, seq_len):
    model = load_model(model) if isinstance(model, str) else model
    gpu = load_gpu(gpu) if isinstance(gpu, str) else gpu
    # sizes beyond any cluster are refused by range (search_spaces/inputs.py), so enumerations stay bounded
    return model, gpu, check_size(num_gpus, "num_gpus", MAX_GPUS), check_size(seq_len, "seq_len", MAX_SEQ_LEN)


def candidate_layouts(model: ModelSpec | str, gpu: GPUSpec | str, num_gpus: int, seq_len: int,
                      fixed: dict | None = None, gbs: int | None = None, limit: int | None = None,
                      free: Iterable[str] = ()) -> list[Layout]:
    """Every legal layout of the space (honouring `fixed` field values), grid-major order.

    For large GPU clusters the space has millions of members: pass `limit` (or fix some fields) there.
    """
    model, gpu, num_gpus, seq_len = _resolve(model, gpu, num_gpus, seq_len)
    dims = dimensions(model, gpu, num_gpus, seq_len, fixed, gbs, free)
    table = _FeatureTable(model, gpu, num_gpus, seq_len, dims)
    out: list[Layout] = []
    for grid in iter_grids(model, gpu, num_gpus, seq_len, dims):
        for feats in table.get(grid)[0]:
            out.append(_layout({**grid, **feats}))
            if limit and len(out) >= limit:
                return out
    return out


def count_space(model, gpu, num_gpus, seq_len, fixed=None, gbs=None, free: Iterable[str] = ()) -> SpaceCount:
    model, gpu, num_gpus, seq_len = _resolve(model, gpu, num_gpus, seq_len)
    dims = dimensions(model, gpu, num_gpus, seq_len, fixed, gbs, free)
    return _count(model, gpu, num_gpus, seq_len, dims)[0]


def _count(model, gpu, num_gpus, seq_len, dims) -> tuple[SpaceCount, list[dict]]:
    count = SpaceCount(total=dims.size())
    table = _FeatureTable(model, gpu, num_gpus, seq_len, dims)
    grids = []
    for grid in iter_grids(model, gpu, num_gpus, seq_len, dims, count):
        legal, rejected = table.get(grid)
        count.legal += len(legal)
        for rule, n in rejected.items():
            count.reject(rule, n)
        grids.append(grid)
    return count, grids


def _static_floor_gib(model: ModelSpec, gpu: GPUSpec, grid: dict) -> float:
    """A lower bound of the peak: 6 B/param (2 B weights + 4 B gradients; optimizer fully offloaded)."""
    return _floor(model, gpu.is_cpu, grid["pp"], grid["vpp"], grid["tp"], grid["ep"], grid["etp"])


@lru_cache(maxsize=8192)
def _floor(model: ModelSpec, cpu: bool, pp: int, vpp: int, tp: int, ep: int, etp: int) -> float:
    from search_spaces.memory import GIB, rank_params
    from search_spaces.pipeline import placement
    layout = Layout(pp=pp, vpp=vpp, tp=tp, ep=ep, etp=etp)
    place = placement(model, pp, vpp)
    worst = 0.0
    for rank in {0, pp - 1}:
        p = rank_params(model, layout, place.rank_units(rank))
        worst = max(worst, (p.dense + p.expert) * (8 if cpu else 6))
    return worst / GIB


@dataclass
class Exploration:
    legal_count: int
    fitting_count: int
    rejected_by_rule: dict[str, int]
    total: int
    top: list[dict[str, Any]]
    grids: int
    estimated: int
    seconds: float
    gbs: int

    def to_dict(self) -> dict[str, Any]:
        return {"legal_count": self.legal_count, "fitting_count": self.fitting_count,
                "rejected_by_rule": dict(sorted(self.rejected_by_rule.items())), "total": self.total,
                "legal_grids": self.grids, "estimated": self.estimated, "seconds": round(self.seconds, 3),
                "gbs": self.gbs, "top": self.top}


def explore(model: ModelSpec | str, gpu: GPUSpec | str, num_gpus: int, seq_len: int, fixed: dict | None = None,
            gbs: int | None = None, top: int = 10, budget_s: float = 30.0,
            max_grids: int | None = 1200, cal: Calibration | None = None, free: Iterable[str] = ()) -> Exploration:
    """Count the space (legal, rejected per rule) and rank fitting layouts by predicted throughput.

    Ranking is greedy per grid: the fastest precision and the rule of thumb's dispatcher are tried with every
    CP communication (cp_comm_type and hierarchy) and routing of the grid, each with the lightest recompute and
    offload that fit; `cal` is the calibration the cost model uses (default: the packaged one); `free` names the
    opt-in dimensions it varies; `fitting_count` counts the layouts estimated to fit (a lower bound
    of all fitting members: the full space is counted, not fully estimated). Estimates the first `max_grids`
    grids in rule-of-thumb order (a count, so the answer does not depend on the machine's speed), with
    budget_s as a safety net.
    """
    started = time.perf_counter()
    model, gpu, num_gpus, seq_len = _resolve(model, gpu, num_gpus, seq_len)
    dims = dimensions(model, gpu, num_gpus, seq_len, fixed, gbs, free)
    count, grids = _count(model, gpu, num_gpus, seq_len, dims)
    table = _FeatureTable(model, gpu, num_gpus, seq_len, dims)
    # cheap ordering: fewest hopeless first; prefer grids whose static floor fits, then more DP (rule of thumb 2)
    scored = []
    for g in grids:
        floor = _static_floor_gib(model, gpu, g)
        if floor > gpu.memory_gib:
            continue
        scored.append((_priority(g, model, gpu, num_gpus, seq_len, floor), g))
    scored = [g for _, g in sorted(scored, key=lambda x: x[0])]
    results: list[Estimate] = []
    fitting = 0
    estimated = 0
    seen: set[str] = set()
    probe = _PeakProbe(model, gpu, num_gpus, seq_len, cal)
    for n, grid in enumerate(scored):
        if time.perf_counter() - started > budget_s or (max_grids is not None and n >= max_grids):
            break
        legal = table.get(grid)[0]
        for group in _greedy_features(legal, dims, grid, gpu):
            for feats in group:
                layout = _layout({**grid, **feats})
                key = layout.key()
                if key in seen:
                    continue
                seen.add(key)
                estimated += 1
                if probe.fits(layout):
                    fitting += 1
                    results.append(estimate(model, gpu, num_gpus, seq_len, layout, cal=cal))
                    break  # lighter recompute / no offload fits: heavier ones only cost time
    results.sort(key=lambda e: -(e.tokens_per_sec_per_gpu or 0))
    top_rows = []
    for est in results[:top]:
        top_rows.append({"layout": dict(est.layout), "key": Layout.from_dict(est.layout).key(),
                         "prediction": {k: getattr(est, k) for k in TOP_PREDICTION}})
    return Exploration(legal_count=count.legal, fitting_count=fitting, rejected_by_rule=count.rejected_by_rule,
                       total=count.total, top=top_rows, grids=len(grids), estimated=estimated,
                       seconds=time.perf_counter() - started, gbs=dims.values["gbs"][0])


class _PeakProbe:
    """Does a candidate fit? The CP communication changes only its CP buffers (search_spaces.extra_memory), so
    the rest of the peak is estimated once per layout-but-its-CP-communication."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, cal: Calibration | None):
        self.model, self.gpu, self.num_gpus, self.seq_len, self.cal = model, gpu, num_gpus, seq_len, cal
        self._rest: dict[Layout, float] = {}

    def _buffers(self, layout: Layout) -> float:
        return cp_attention_buffers(self.model, layout, self.seq_len, self.gpu.is_cpu) / GIB

    def fits(self, layout: Layout) -> bool:
        plain = layout.replace(cp_comm_type="p2p", hierarchical_cp=()) if layout.cp > 1 else layout
        if plain not in self._rest:
            est = estimate(self.model, self.gpu, self.num_gpus, self.seq_len, plain, with_time=False, cal=self.cal)
            self._rest[plain] = (est.peak_memory_gib or float("inf")) - self._buffers(plain)
        return self._rest[plain] + self._buffers(layout) <= self.gpu.memory_gib


def _priority(g: dict, model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, floor: float) -> tuple:
    """Order in which grids are estimated (the budget may not reach all): the rules of thumb first."""
    shard = seq_len / (g["cp"] * g["tp"])
    cp_miss = abs(math.log2(max(shard, 1) / 4096)) if seq_len > 8192 else math.log2(g["cp"])
    return (g["etp"] != 1, g["mbs"] != 1 and seq_len >= 16384, round(cp_miss),
            -(num_gpus // (g["tp"] * g["cp"] * g["pp"])), g["vpp"] == 1 and g["pp"] > 2, g["pp"], g["tp"])


def _greedy_features(legal: list[dict], dims: Dimensions, grid: dict, gpu: GPUSpec) -> Iterator[list[dict]]:
    """Feature combos to try on one grid, one group per routing and CP communication (cp_comm_type and hierarchy)
    of the grid: fastest precision, the dispatcher the rules of thumb name (among those the routing allows),
    lightest recompute first and no offload before offload within a group (the caller stops a group at the first
    that fits)."""
    v = dims.values
    prec = v["precision"][-1]  # bf16 < fp8 family; fp32 < bf16 on cpu
    rc_order = {r: i for i, r in enumerate(v["recompute"])}
    pool = [f for f in legal if f["precision"] == prec] or legal
    wide = gpu.nvlink_domain > 8
    for routing in dict.fromkeys(f["routing"] for f in pool):
        routed = [f for f in pool if f["routing"] == routing]
        disp = _pick(routed, "dispatcher", ("hybridep", "deepep", "alltoall") if wide else
                     ("deepep", "hybridep", "alltoall"))
        options = dict.fromkeys((f["cp_comm_type"], f.get("hierarchical_cp", ())) for f in routed)
        for cpc, sizes in options:
            candidates = [f for f in routed if f["dispatcher"] == disp and f["cp_comm_type"] == cpc
                          and f.get("hierarchical_cp", ()) == sizes and f["recompute"] != "core_attn"]
            # graphs first (launch overhead gone) and the EP all-to-all overlapped at each recompute level; offload
            # only when nothing else fits
            candidates.sort(key=lambda f: (f["optimizer_offload"], rc_order.get(f["recompute"], 99),
                                           not f["cuda_graphs"], not f.get("ep_overlap", False)))
            if candidates:
                yield candidates


def _pick(pool: list[dict], field_name: str, preference: tuple) -> Any:
    present = {f[field_name] for f in pool}
    for p in preference:
        if p in present:
            return p
    return next(iter(present))
