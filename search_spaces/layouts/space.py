"""The layout space: every combination of the dimensions below, its legal members, and a quick exploration.

Dimensions (per model / GPU): PP, VPP, TP, CP, EP, ETP, MBS (the parallel *grid*), then the *features*:
precision, recompute, CUDA graphs, dispatcher, routing, cp_comm_type, optimizer offload. GBS is fixed per space
(given, or ~16M tokens per step rounded to a power of two sequences) so layouts compare at the same batch.
An opt-in dimension (routing: token dropping changes what is trained) keeps its default unless `free` names it
or `fixed` sets it; a benchmark-only value (forced balance) is never a member unless fixed.

Enumeration is nested and prunes early: a partial grid that breaks a rule (e.g. TP*CP*PP does not divide
the world) is counted once, times the size of the subtree it cuts, under that rule's name. Feature legality
depends on a grid only through the feature rules that read grid fields (the EP overlap reads EP and the schedule,
the CP communication CP and the heads), so it is computed once per class of grids those rules judge alike.
`explore()` estimates only grids whose static memory can fit, and per grid only a greedy handful of features.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.hardware import GPUSpec, load_gpu
from search_spaces.catalog.models import ModelSpec, load_model
from search_spaces.cost.breakdown import GIB
from search_spaces.cost.costmodel import estimate, legal_peak_memory_gib, tokens_per_sec_per_gpu
from search_spaces.cost.extra_memory import CP_BUFFER_FIELDS, cp_attention_buffers
from search_spaces.cost.packing import LengthHistogram, packed_statistics
from search_spaces.errors import SpecError
from search_spaces.inputs import MAX_GBS, MAX_GPUS, MAX_SEQ_LEN, check_size
from search_spaces.layouts.forked import available_workers, map_forked
from search_spaces.layouts.layout import BY_NAME, DIMENSIONS, PARALLEL_SIZES, SEARCH_DIMENSIONS, Layout
from search_spaces.layouts.rules import (
    LEVELS,
    REGISTRY,
    RULES,
    Situation,
    check,
    hierarchical_cp_violation,
    level_reads,
    level_rules,
    microbatch_rule,
)

TARGET_TOKENS_PER_STEP = 1 << 24
VPP_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)
MBS_CHOICES = (1, 2, 4)
# the figures of each layout `explore` lists (Estimate's fields)
TOP_PREDICTION = ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s", "peak_memory_gib", "fits")
# the router's production modes: dropless, and token dropping at the balanced share (a larger factor only costs
# more in the cost model, which does not see what dropping does to training: a user who wants one fixes it)
ROUTING_CHOICES = ("dropless", "capacity:1.0")
OPT_IN = tuple(d.name for d in DIMENSIONS if d.opt_in)
# the memory levers (search_spaces/cost/offload.py): what `space --free levers` varies
MEMORY_LEVERS = ("activation_offload", "expert_stash", "optimizer_states", "fp8_param_gather")
# the parallel grid (enumerated nested, pruned by rule) and the features tried on each legal grid
GRID_FIELDS = PARALLEL_SIZES + ("mbs",)
FEATURE_FIELDS = tuple(n for n in SEARCH_DIMENSIONS if n not in GRID_FIELDS) + ("distributed_optimizer",)

# the rules decided at each level of the nested enumeration (others cannot fail there), and the grid fields
# those rules read (a probe's verdict is cached per distinct value of them): both from the rules' declarations
_LEVEL_RULES = {level: level_rules(level) for level in LEVELS}
_LEVEL_READS = {level: level_reads(level, GRID_FIELDS) for level in _LEVEL_RULES}
_FEATURE_READS = level_reads(None, GRID_FIELDS)  # the grid fields the feature rules read
_FEATURE_KEY = itemgetter(*_FEATURE_READS)
# the feature rules whose verdict also reads the grid (but the CP hierarchy's, expanded per grid), with those fields
_GRID_FEATURE_RULES = tuple(
    (index, r, tuple(f for f in r.reads if f in GRID_FIELDS)) for index, r in enumerate(REGISTRY)
    if r.level is None and r.name != "hierarchical_cp" and set(r.reads) & set(GRID_FIELDS))
# the rules that read the CP communication (all a candidate's p2p form can break), and the fields they read
_CP_COMM_RULES = tuple(r for r in REGISTRY if {"cp_comm_type", "hierarchical_cp"} & set(r.reads))
_CP_COMM_READS = itemgetter(*sorted({f for r in _CP_COMM_RULES for f in r.reads}))


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
    # the memory levers (search_spaces/cost/offload.py; GPU only): the attention block's inputs offloaded, the routed
    # experts' stashed in pages (HybridEP's rank budget at Bridge's 1.5) or their inputs offloaded, bf16 moments
    v.update(memory_lever_values(model, cpu))
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
    # canonical, so a combination of them is a layout as it stands (Layout.of_canonical): a set lookup per value
    return Dimensions({name: [BY_NAME[name].canonical(value) for value in values] for name, values in v.items()})


def memory_lever_values(model: ModelSpec, cpu: bool) -> dict[str, list[Any]]:
    """The values of the memory levers a space varies when `free` names them (opt-in: held at their defaults
    otherwise)."""
    if cpu:
        return {"activation_offload": [()], "activation_offload_fraction": [1.0], "expert_stash": ["none"],
                "optimizer_states": ["fp32"], "fp8_param_gather": [False]}
    offloads = [(), ("core_attn", "attn_proj")] + ([("expert_fc1", "moe_act")] if model.is_moe else [])
    return {"activation_offload": offloads, "activation_offload_fraction": [1.0],
            "expert_stash": ["none", "paged:1.5"] if model.is_moe else ["none"], "optimizer_states": ["fp32", "bf16"],
            "fp8_param_gather": [False, True]}  # the rules keep fp8 weights to fp8 precisions


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
    """The layout of a combination of the space's values (canonical: dimensions() lists them parsed)."""
    return Layout.of_canonical(values)


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
    probe = _level_probe(model, gpu, num_gpus, seq_len, v)
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
                        rule = microbatch_rule(gbs, mbs, dp, pp, vpp)
                        if rule:
                            if count:
                                count.reject(rule, feat_size)
                            continue
                        yield {"pp": pp, "vpp": vpp, "tp": tp, "cp": cp, "ep": ep, "etp": etp, "mbs": mbs,
                               "gbs": gbs}


def _level_probe(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int,
                 v: dict[str, list[Any]]) -> Callable[..., str | None]:
    """iter_grids' probe: `probe(level, **grid)` is the first of the level's rules (_LEVEL_RULES) that a layout of the
    partial grid, every other field plain, breaks (None: it keeps them); computed once per distinct value of the
    fields the level reads."""
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

    return probe


def _defaults_grid() -> dict[str, int]:
    return {name: 1 for name in GRID_FIELDS}


class _FeatureTable:
    """Legal feature combinations per class of grid. A grid's class is what the feature walk reads of it: the
    verdicts, over every value of the features they read, of the feature rules that also read grid fields (the
    EP overlap's EP and schedule, the CP communication's CP and heads), and whether CP is used. Grids of one class
    have the same walk (a rule reads only its declared fields); the CP hierarchy (the last rule) reads TP and CP,
    so the legal combinations are expanded per (class, TP, CP). The level rules are iter_grids' (every grid it
    yields keeps them)."""

    def __init__(self, model, gpu, num_gpus, seq_len, dims: Dimensions):
        self.model, self.gpu, self.num_gpus, self.seq_len, self.dims = model, gpu, num_gpus, seq_len, dims
        # the values of the grid fields the feature rules read: (the class, TP, CP)
        self._classes: dict[tuple, tuple[int, int, int]] = {}
        self._class_ids: dict[tuple, int] = {}  # a class's verdicts: its int
        self._verdicts: dict[tuple, tuple[bool, ...]] = {}  # (rule index, its grid fields' values): verdicts
        self._base: dict[int, tuple[list[dict], dict[str, int]]] = {}
        self._cache: dict[tuple, tuple[list[dict], dict[str, int]]] = {}
        self._groups: dict[tuple, list[list[dict]]] = {}

    def grid_class(self, grid: dict[str, Any]) -> int:
        """The grid's class (the class docstring), an int."""
        return self.expansion(grid)[0]

    def expansion(self, grid: dict[str, Any]) -> tuple[int, int, int]:
        """(the grid's class, TP, CP): the key of its legal combinations."""
        key = _FEATURE_KEY(grid)
        found = self._classes.get(key)
        if found is None:
            verdicts = (grid["cp"] == 1,) + tuple(self._rule_verdicts(index, r, reads, grid)
                                                  for index, r, reads in _GRID_FEATURE_RULES)
            found = self._classes[key] = (self._class_ids.setdefault(verdicts, len(self._class_ids)), grid["tp"],
                                          grid["cp"])
        return found

    def _rule_verdicts(self, index: int, r: Any, reads: tuple[str, ...], grid: dict[str, Any]) -> tuple[bool, ...]:
        """Rule `r`'s verdict on every combination of the values of the features it reads, on this grid."""
        key = (index,) + tuple(grid[f] for f in reads)
        if key not in self._verdicts:
            v = self.dims.values
            base = {**{f: values[0] for f, values in v.items()}, **grid}
            features = [f for f in r.reads if f not in grid and f in v]  # the others: their defaults, as in a walk
            self._verdicts[key] = tuple(
                bool(r.test(Situation(self.model, self.gpu, self.num_gpus, self.seq_len,
                                      _layout({**base, **dict(zip(features, combo))}))))
                for combo in itertools.product(*(v[f] for f in features)))
        return self._verdicts[key]

    def expanded(self, key: tuple[int, int, int]) -> tuple[list[dict], dict[str, int]]:
        """get() of a grid of this expansion, asked before."""
        return self._cache[key]

    def get(self, grid: dict[str, Any]) -> tuple[list[dict], dict[str, int]]:
        """The grid's legal feature combinations (with the hierarchy), and those refused per rule."""
        key = self.expansion(grid)
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

    def walk_first(self, grids: list[dict[str, Any]]) -> None:
        """The feature walks get() will ask for, one per class among `grids` (its first grid), split over the
        cores (search_spaces/layouts/forked.py): the same walks as asking one by one."""
        todo: dict[int, dict[str, Any]] = {}
        for grid in grids:
            found = self.grid_class(grid)
            if found not in self._base and found not in todo:
                todo[found] = grid
        items = list(todo.items())
        workers = min(available_workers(), len(items))
        parts = [items[w::workers] for w in range(workers)] if workers > 1 else [items]
        for part in map_forked(self._walks, parts):
            self._base.update(part)

    def _walks(self, items: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, tuple[list[dict], dict]]]:
        return [(found, _FeatureWalk(self.model, self.gpu, self.num_gpus, self.seq_len, self.dims, grid).run())
                for found, grid in items]

    def _base_combos(self, grid: dict[str, Any]) -> tuple[list[dict], dict[str, int]]:
        """Every combination of the features but the hierarchy, checked by every rule but the hierarchy's."""
        found = self.grid_class(grid)
        if found not in self._base:
            self._base[found] = _FeatureWalk(self.model, self.gpu, self.num_gpus, self.seq_len, self.dims,
                                             grid).run()
        return self._base[found]

    def groups(self, grid: dict[str, Any]) -> list[list[dict]]:
        """_greedy_features of the grid's legal features (they depend on its class, TP and CP alone)."""
        key = self.expansion(grid)
        if key not in self._groups:
            self._groups[key] = list(_greedy_features(self.get(grid)[0], self.dims, self.gpu))
        return self._groups[key]


class _FeatureWalk:
    """The legal feature combinations of one grid (all but the CP hierarchy) in itertools.product order, and the
    combinations each rule rejects, counted under the first rule (in RULES order) each breaks.

    A rule's verdict depends only on the fields it reads (rules.Rule.reads): it is decided once per distinct
    value of the features it reads, at the depth of the product where the last of them is set, and a subtree
    whose first broken rule no deeper rule can precede is counted whole. Combinations that set cp_comm_type
    without CP are `cp_comm_unused`, never checked."""

    def __init__(self, model, gpu, num_gpus, seq_len, dims: Dimensions, grid: dict[str, Any]):
        v = dims.values
        self.situation = (model, gpu, num_gpus, seq_len)
        self.extra: dict[str, Any] = {k: v[k][0] for k in ("sequence_parallel", "recompute_method",
                                                          "recompute_num_layers") if k in v}
        self.names = [f for f in FEATURE_FIELDS if f != "hierarchical_cp"]
        self.values = [v[f] for f in self.names]
        # unset features take their first value: no rule decided at that depth reads them
        self.base = {**grid, **{f: vals[0] for f, vals in zip(self.names, self.values)}, **self.extra}
        depth = len(self.names)
        # per depth: (index, rule, the features it reads, a reader of their values off the combination)
        self.rules_at: list[list[tuple[int, Any, tuple[int, ...], Any]]] = [[] for _ in range(depth + 1)]
        for index, r in enumerate(REGISTRY):
            if r.name != "hierarchical_cp":
                reads = tuple(sorted(self.names.index(f) for f in r.reads if f in self.names))
                reader = itemgetter(*reads) if reads else (lambda combo: ())
                self.rules_at[reads[-1] + 1 if reads else 0].append((index, r, reads, reader))
        self.first_below = [min((rule[0] for level in self.rules_at[d + 1:] for rule in level),
                                default=len(REGISTRY)) for d in range(depth + 1)]
        self.leaves = [math.prod(len(vals) for vals in self.values[d:]) for d in range(depth + 1)]
        self.cpc = self.names.index("cp_comm_type")
        self.cp_unused = grid["cp"] == 1  # cp_comm_type is meaningless without CP: only its first value is kept
        self.verdicts: dict[tuple, bool] = {}
        self.combo: list[Any] = [None] * depth
        self.legal: list[dict] = []
        self.rejected: dict[str, int] = {}

    def run(self) -> tuple[list[dict], dict[str, int]]:
        self._walk(0, len(REGISTRY))
        return self.legal, self.rejected

    def _walk(self, depth: int, first: int) -> None:
        first = self._first_broken(depth, first)
        if first < self.first_below[depth]:  # decided for every combination below
            self._reject(depth, first)
            return
        last = len(self.names) - 1
        for n, value in enumerate(self.values[depth]):
            if depth == self.cpc and self.cp_unused and n > 0:
                self._count("cp_comm_unused", self.leaves[depth + 1])
                continue
            self.combo[depth] = value
            if depth < last:
                self._walk(depth + 1, first)
            else:  # a whole combination (inline: one call less per combination)
                broken = self._first_broken(depth + 1, first)
                if broken < len(REGISTRY):
                    self._count(REGISTRY[broken].name, 1)
                else:
                    self.legal.append({**dict(zip(self.names, self.combo)), **self.extra})

    def _first_broken(self, depth: int, first: int) -> int:
        """The first rule (its index; `first` if none before it) the rules decided at `depth` add."""
        for index, r, reads, reader in self.rules_at[depth]:
            if index < first:
                key = (index, reader(self.combo))
                broken = self.verdicts.get(key)
                if broken is None:
                    broken = self.verdicts[key] = self._broken(r, reads)
                if broken:
                    first = index
        return first

    def _reject(self, depth: int, first: int) -> None:
        """Count the combinations below `depth` under rule `first` (those that set cp_comm_type without CP are
        cp_comm_unused: they come after the first, which keeps its first value, in product order)."""
        n = self.leaves[depth]
        unused = n // len(self.values[self.cpc]) * (len(self.values[self.cpc]) - 1) \
            if self.cp_unused and depth <= self.cpc else 0
        self._count(REGISTRY[first].name, n - unused)
        if unused:
            self._count("cp_comm_unused", unused)

    def _count(self, rule: str, n: int) -> None:
        self.rejected[rule] = self.rejected.get(rule, 0) + n

    def _broken(self, r: Any, reads: tuple[int, ...]) -> bool:
        """Whether rule `r` refuses the combination's values of the features it reads (the others at their first)."""
        layout = _layout({**self.base, **{self.names[i]: self.combo[i] for i in reads}})
        return bool(r.test(Situation(*self.situation, layout)))


def _resolve(model: ModelSpec | str, gpu: GPUSpec | str, num_gpus: int, seq_len: int
             ) -> tuple[ModelSpec, GPUSpec, int, int]:
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


class _Rejections:
    """iter_grids' rejections and grids, in the order they came (replayed into a SpaceCount once the feature walks
    are done: rejected_by_rule keeps the order of its first entries, which ties are broken by)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int] | dict[str, Any]] = []

    def reject(self, rule: str, n: int) -> None:
        self.log.append((rule, n))


def _count(model, gpu, num_gpus, seq_len, dims, table: _FeatureTable | None = None
           ) -> tuple[SpaceCount, list[dict]]:
    count = SpaceCount(total=dims.size())
    table = table or _FeatureTable(model, gpu, num_gpus, seq_len, dims)
    seen = _Rejections()
    for grid in iter_grids(model, gpu, num_gpus, seq_len, dims, seen):  # type: ignore[arg-type]
        seen.log.append(grid)
    grids = [g for g in seen.log if isinstance(g, dict)]
    table.walk_first(grids)
    # grids of one expansion (class, TP, CP) have the same counts: each expansion's are added once, times its
    # grids, after its first grid has placed its rules in the order of first entries
    grids_of: dict[tuple, int] = {}
    for entry in seen.log:
        if isinstance(entry, tuple):
            count.reject(*entry)
            continue
        key = table.expansion(entry)
        if key not in grids_of:
            for rule in table.get(entry)[1]:
                count.reject(rule, 0)
        grids_of[key] = grids_of.get(key, 0) + 1
    for key, n in grids_of.items():
        legal, rejected = table.expanded(key)
        count.legal += len(legal) * n
        for rule, rejections in rejected.items():
            count.reject(rule, rejections * n)
    return count, grids


def _static_floor_gib(model: ModelSpec, gpu: GPUSpec, grid: dict) -> float:
    """A lower bound of the peak: 6 B/param (2 B weights + 4 B gradients; optimizer fully offloaded)."""
    return _floor(model, gpu.is_cpu, grid["pp"], grid["vpp"], grid["tp"], grid["ep"], grid["etp"])


@lru_cache(maxsize=8192)
def _floor(model: ModelSpec, cpu: bool, pp: int, vpp: int, tp: int, ep: int, etp: int) -> float:
    from search_spaces.cost.memory import GIB, rank_params
    from search_spaces.cost.pipeline import placement
    layout = Layout(pp=pp, vpp=vpp, tp=tp, ep=ep, etp=etp)
    place = placement(model, pp, vpp)
    if place is None:  # iter_grids' rules refuse a grid without one
        raise ValueError("grid has no pipeline placement (check rules first)")
    worst = 0.0
    for rank in {0, pp - 1}:
        p = rank_params(model, layout, place.rank_units(rank))
        worst = max(worst, (p.dense + p.expert) * (8 if cpu else 6))
    return worst / GIB


@dataclass
class Exploration:
    """What `explore` found: the space counted, and the fastest fitting layouts among those it estimated."""
    legal_count: int
    """Legal layouts of the space."""
    fitting_count: int
    """Layouts estimated to fit (a lower bound of all fitting members)."""
    rejected_by_rule: dict[str, int]
    """Layouts rejected, per the first rule each breaks."""
    total: int
    """Every combination of the dimensions."""
    top: list[dict[str, Any]]
    """The fastest fitting layouts, fastest first: layout, key and prediction."""
    grids: int
    """Legal parallel grids."""
    estimated: int
    """Layouts whose memory was estimated."""
    seconds: float
    """Wall time of the exploration (the one figure that depends on the machine)."""
    gbs: int
    """The global batch of the space."""
    grids_ranked: int = 0
    """Grids whose layouts were estimated, in rule-of-thumb order (max_grids at most)."""
    cut_short: bool = False
    """The time budget (budget_s) ran out before `grids_ranked` reached max_grids or the grids that can fit: the
    ranking depends on the machine's speed (a count, max_grids, does not)."""

    def to_dict(self) -> dict[str, Any]:
        return {"legal_count": self.legal_count, "fitting_count": self.fitting_count,
                "rejected_by_rule": dict(sorted(self.rejected_by_rule.items())), "total": self.total,
                "legal_grids": self.grids, "estimated": self.estimated, "seconds": round(self.seconds, 3),
                "gbs": self.gbs, "top": self.top, "grids_ranked": self.grids_ranked, "cut_short": self.cut_short}


def explore(model: ModelSpec | str, gpu: GPUSpec | str, num_gpus: int, seq_len: int, fixed: dict | None = None,
            gbs: int | None = None, top: int = 10, budget_s: float | None = None,
            max_grids: int | None = 1200, cal: Calibration | None = None, free: Iterable[str] = (),
            packing: LengthHistogram | None = None, workers: int | None = None) -> Exploration:
    """Count the space (legal, rejected per rule) and rank fitting layouts by predicted throughput.

    Ranking is greedy per grid: the fastest precision and the rule of thumb's dispatcher are tried with every
    CP communication (cp_comm_type and hierarchy) and routing of the grid, each with the lightest recompute and
    offload that fit; `cal` is the calibration the cost model uses (default: the packaged one); `free` names the
    opt-in dimensions it varies; `fitting_count` counts the layouts estimated to fit (a lower bound
    of all fitting members: the full space is counted, not fully estimated). Estimates the first `max_grids`
    grids in rule-of-thumb order (a count, so the answer does not depend on the machine's speed); `budget_s`,
    when given, is a user's safety net in seconds: where it stops the ranking early, `cut_short` says so.
    `packing`: documents packed into each sequence (search_spaces/cost/packing.py): ranked by real tokens/s.
    `workers`: processes the ranking is split over (default: the cores here, search_spaces/layouts/forked.py); the
    answer is the same for any number.
    """
    started = time.perf_counter()
    model, gpu, num_gpus, seq_len = _resolve(model, gpu, num_gpus, seq_len)
    dims = dimensions(model, gpu, num_gpus, seq_len, fixed, gbs, free)
    table = _FeatureTable(model, gpu, num_gpus, seq_len, dims)
    count, grids = _count(model, gpu, num_gpus, seq_len, dims, table)
    scored = _ranked_grids(model, gpu, num_gpus, seq_len, grids, _attention_length(packing, seq_len))
    limit = len(scored) if max_grids is None else min(max_grids, len(scored))
    work = scored[:limit]
    for grid in work:  # every class's groups found before the work is split
        table.groups(grid)
    ranker = _Ranker(model, gpu, num_gpus, seq_len, cal, packing, table, work, started, budget_s)
    ranked = [row for part in map_forked(ranker.rank, _parts(len(work), workers)) for row in part]
    ranked.sort(key=lambda row: row[0])  # grid order: what one process ranking every grid in turn finds
    cut = min((row[0] for row in ranked if row[1] is None), default=None)  # the first grid the budget stopped
    if cut is not None:
        limit, ranked = cut, [row for row in ranked if row[0] < cut]
    cut_short = cut is not None
    estimated = sum(row[1] or 0 for row in ranked)  # None only at and after the cut, dropped above
    # the first fitting candidate of each group and its tokens/s/GPU
    found: list[tuple[float, Layout]] = [f for row in ranked for f in row[2]]
    fitting = len(found)
    found.sort(key=lambda f: -f[0])  # stable: equal throughputs keep the order they were found in
    top_rows = []
    for _, layout in found[:top]:  # estimated whole: the figures each row shows
        est = estimate(model, gpu, num_gpus, seq_len, layout, cal=cal, packing=packing)
        top_rows.append({"layout": dict(est.layout), "key": Layout.from_dict(est.layout).key(),
                         "prediction": {k: getattr(est, k) for k in TOP_PREDICTION},
                         **({"packing": est.packing} if est.packing is not None else {})})
    return Exploration(legal_count=count.legal, fitting_count=fitting, rejected_by_rule=count.rejected_by_rule,
                       total=count.total, top=top_rows, grids=len(grids), estimated=estimated,
                       seconds=time.perf_counter() - started, gbs=dims.values["gbs"][0], grids_ranked=limit,
                       cut_short=cut_short)


# grids handed out in blocks of this many consecutive ones (neighbours in ranking order share cost-model terms)
RANK_BLOCK = 8


def _parts(n: int, workers: int | None) -> list[list[int]]:
    """The ranked grids' indices, split into one part per worker, in blocks of RANK_BLOCK taken in turn."""
    count = max(1, available_workers() if workers is None else workers)
    parts: list[list[int]] = [[] for _ in range(count)]
    for i in range(n):
        parts[i // RANK_BLOCK % count].append(i)
    return [p for p in parts if p] or [[]]


class _Ranker:
    """Ranks grids (by their index in `grids`): per grid, the layouts estimated and the first fitting candidate
    of each feature group with its tokens/s/GPU (explore's docstring). A part runs in its own process, so it
    holds its own probe; `budget_s` (seconds since `started`) stops a part before a grid."""

    def __init__(self, model, gpu, num_gpus, seq_len, cal, packing, table: "_FeatureTable", grids: list[dict],
                 started: float, budget_s: float | None):
        self.model, self.gpu, self.num_gpus, self.seq_len = model, gpu, num_gpus, seq_len
        self.cal, self.packing, self.table, self.grids = cal, packing, table, grids
        self.started, self.budget_s = started, budget_s

    def rank(self, indices: list[int]) -> list[tuple[int, int | None, list[tuple[float, Layout]]]]:
        """(grid index, layouts estimated, found) per grid in `indices`; a grid the budget stopped before has
        None estimated, and none after it follows."""
        model, gpu, num_gpus, seq_len, cal, packing = (self.model, self.gpu, self.num_gpus, self.seq_len, self.cal,
                                                       self.packing)
        probe = _PeakProbe(model, gpu, num_gpus, seq_len, cal)
        rows: list[tuple[int, int | None, list[tuple[float, Layout]]]] = []
        for n in indices:
            if self.budget_s is not None and time.perf_counter() - self.started > self.budget_s:
                rows.append((n, None, []))
                break
            grid = self.grids[n]
            estimated = 0
            found: list[tuple[float, Layout]] = []
            for group in self.table.groups(grid):
                for feats in group:  # (the groups split the grid's combinations: none is estimated twice)
                    estimated += 1
                    if probe.fits(grid, feats):
                        layout = _layout({**grid, **feats})
                        found.append((tokens_per_sec_per_gpu(model, gpu, num_gpus, seq_len, layout, cal, packing),
                                      layout))
                        break  # lighter recompute / no offload fits: heavier ones only cost time
            rows.append((n, estimated, found))
        return rows


def _attention_length(packing: LengthHistogram | None, seq_len: int) -> float:
    """The length a full-length document would have for the same attention per sequence as these packed ones
    (seq_len without packing): what the rule of thumb's CP shard is sized by."""
    if packing is None:
        return seq_len
    return seq_len * packed_statistics(packing, seq_len, 1).attention_share


def _ranked_grids(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, grids: list[dict],
                  attention_length: float) -> list[dict]:
    """The grids whose static floor can fit, in the order they are estimated (cheap first: _priority)."""
    floors: dict[tuple, float] = {}
    scored = []
    for g in grids:
        sizes = (g["pp"], g["vpp"], g["tp"], g["ep"], g["etp"])
        if sizes not in floors:
            floors[sizes] = _static_floor_gib(model, gpu, g)
        if floors[sizes] > gpu.memory_gib:
            continue
        scored.append((_priority(g, num_gpus, seq_len, attention_length), g))
    return [g for _, g in sorted(scored, key=lambda x: x[0])]


class _PeakProbe:
    """Does a candidate fit? The CP communication changes only its CP buffers (search_spaces.cost.extra_memory), so
    the rest of the peak is estimated once per layout-but-its-CP-communication, the buffers once per value of
    extra_memory.CP_BUFFER_FIELDS. The rest is measured on the p2p form of the layout, or on the candidate itself
    where p2p is illegal (sliding windows, attention sinks: an illegal layout has no peak). A candidate is a grid
    (iter_grids') and a feature combination (the feature table's), and legal: the table holds legal combinations
    only, so the probe checks no rule but those of the p2p form's CP communication.

    Both memo tables are keyed by small ints: a grid's and a combination's fields are read once (the ranker asks
    for 150,000 candidates, a few thousand grids times the few thousand combinations of their classes)."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, cal: Calibration | None):
        self.model, self.gpu, self.num_gpus, self.seq_len, self.cal = model, gpu, num_gpus, seq_len, cal
        self._rest: dict[tuple[int, int], float] = {}  # (the grid, the combination but its CP communication)
        self._buffers: dict[tuple[int, int], float] = {}  # (the grid's, the combination's CP_BUFFER_FIELDS)
        self._ids: dict[tuple, int] = {}  # each distinct set of (field, value) pairs: its int
        self._grid: dict[str, Any] | None = None  # the grid asked for last, and its two ints
        self._grid_ids = (0, 0)
        self._feats_ids: dict[int, tuple[dict[str, Any], int, int]] = {}  # id(combination): it, and its two ints
        self._buffer_gibs: dict[tuple, float] = {}
        self._p2p_legal: dict[tuple, bool] = {}
        self._buffer_key = itemgetter(*CP_BUFFER_FIELDS)

    def fits(self, grid: dict[str, Any], feats: dict[str, Any]) -> bool:
        """Whether the candidate {**grid, **feats} fits."""
        if grid is not self._grid:
            self._grid = grid
            self._grid_ids = (self._id(sorted(grid.items())),
                              self._id((f, grid[f]) for f in CP_BUFFER_FIELDS if f in grid))
        known = self._feats_ids.get(id(feats))
        if known is None or known[0] is not feats:  # (the table keeps its combinations alive: an id stays theirs)
            known = self._feats_ids[id(feats)] = (
                feats, self._id((f, v) for f, v in feats.items() if f not in ("cp_comm_type", "hierarchical_cp")),
                self._id((f, feats[f]) for f in CP_BUFFER_FIELDS if f in feats))
        key = (self._grid_ids[0], known[1])
        rest = self._rest.get(key)
        if rest is None:
            rest = self._rest[key] = self._rest_gib({**grid, **feats})
        buffer_key = (self._grid_ids[1], known[2])
        buffer = self._buffers.get(buffer_key)
        if buffer is None:
            buffer = self._buffers[buffer_key] = self._buffer_gib({**grid, **feats})
        return rest + buffer <= self.gpu.memory_gib

    def _id(self, pairs: Iterable[tuple[str, Any]]) -> int:
        return self._ids.setdefault(tuple(pairs), len(self._ids))

    def _rest_gib(self, values: dict[str, Any]) -> float:
        """The candidate's peak but its CP buffers."""
        plain = values
        if values["cp"] > 1:  # p2p where it is legal for this model, else the candidate's own form
            p2p = {**values, "cp_comm_type": "p2p", "hierarchical_cp": ()}
            plain = p2p if self._legal_as_p2p(p2p) else values
        return legal_peak_memory_gib(self.model, self.gpu, self.num_gpus, self.seq_len, _layout(plain),
                                     self.cal) - self._buffer_gib(plain)

    def _legal_as_p2p(self, p2p: dict[str, Any]) -> bool:
        """Whether the p2p form of a legal candidate is legal: only the rules that read the CP communication can
        refuse it (the candidate keeps every other), judged once per value of the fields they read."""
        key = _CP_COMM_READS(p2p)
        legal = self._p2p_legal.get(key)
        if legal is None:
            situation = Situation(self.model, self.gpu, self.num_gpus, self.seq_len, _layout(p2p))
            legal = self._p2p_legal[key] = not any(r.test(situation) for r in _CP_COMM_RULES)
        return legal

    def _buffer_gib(self, values: dict[str, Any]) -> float:
        key = self._buffer_key(values)
        if key not in self._buffer_gibs:
            layout = _layout(values)
            self._buffer_gibs[key] = cp_attention_buffers(self.model, layout, self.seq_len, self.gpu.is_cpu) / GIB
        return self._buffer_gibs[key]


def _priority(g: dict, num_gpus: int, seq_len: int, attention_length: float) -> tuple:
    """Order in which grids are estimated (the budget may not reach all): the rules of thumb first, the CP rule
    (a 4K shard of attention per rank) by the attention's length (packed documents attend within each)."""
    shard = attention_length / (g["cp"] * g["tp"])
    cp_miss = abs(math.log2(max(shard, 1) / 4096)) if attention_length > 8192 else math.log2(g["cp"])
    return (g["etp"] != 1, g["mbs"] != 1 and seq_len >= 16384, round(cp_miss),
            -(num_gpus // (g["tp"] * g["cp"] * g["pp"])), g["vpp"] == 1 and g["pp"] > 2, g["pp"], g["tp"])


def _greedy_features(legal: list[dict], dims: Dimensions, gpu: GPUSpec) -> Iterator[list[dict]]:
    """Feature combos to try on a grid with these legal features, one group per routing and CP communication
    (cp_comm_type and hierarchy) of the grid: fastest precision, the dispatcher the rules of thumb name (among
    those the routing allows), lightest recompute first and no offload before offload within a group (the caller
    stops a group at the first that fits)."""
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
            # (optimizer, then activations, whose copies only the host link's spare time hides) and bf16 moments only
            # when nothing else fits; a freed paged stash first (its rank budget caps the dropless load)
            candidates.sort(key=lambda f: (f["optimizer_offload"], bool(f.get("activation_offload")),
                                           f.get("optimizer_states", "fp32") != "fp32",
                                           rc_order.get(f["recompute"], 99), not f["cuda_graphs"],
                                           not f.get("ep_overlap", False), f.get("expert_stash", "none") == "none"))
            # each kind of offload (optimizer, activations) in a group of its own: an offload's copies may cost
            # more than the heavier recompute (or the other offload) it spares, so the first fit of each kind is
            # estimated and the faster ranked; a freed lever then never ranks below the space without it
            kinds = dict.fromkeys((f["optimizer_offload"], bool(f.get("activation_offload"))) for f in candidates)
            for kind in kinds:
                yield [f for f in candidates if (f["optimizer_offload"], bool(f.get("activation_offload"))) == kind]


def _pick(pool: list[dict], field_name: str, preference: tuple) -> Any:
    present = {f[field_name] for f in pool}
    for p in preference:
        if p in present:
            return p
    return next(iter(present))
