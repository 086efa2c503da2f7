"""Layout: one point of the search space, validated at construction (like Megatron-Core's configs).

A Layout says how one training job is split and run. It knows nothing of the model or the cluster:
whether it is *legal* for a given model and world size is the job of `search_spaces.layouts.rules`.
Derived sizes (DP, EDP, gradient accumulation) need the world size, so they are methods.

Every field is a dimension declared once, below, with its doc, flag, Megatron names and legal values
(`search_spaces.layouts.dimensions`); `DIMENSIONS` lists them and everything that spells a layout out (spec keys,
search parameters, CSV columns, MLflow params, trainer and estimate flags, exports) derives from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from search_spaces.errors import SpecError
from search_spaces.layouts.dimensions import Dimension, Primitive, dimension, dimensions_of

RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
# The seed recipes call mla_up_proj "up_proj" and layernorm "norm".
RECOMPUTE_ALIASES = {"up_proj": "mla_up_proj", "norm": "layernorm"}
RECOMPUTE_METHODS = ("uniform", "block")
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")
# fp32 exists for CPU runs only; the fp8 names follow Megatron-Core's fp8_recipe values.
PRECISIONS = ("fp32", "bf16", "fp8-tensorwise", "fp8-delayed", "fp8-blockwise", "mxfp8")
PRECISION_ALIASES = {"fp8": "fp8-blockwise", "fp8-block": "fp8-blockwise", "fp8-cs": "fp8-tensorwise",
                     "fp8-mx": "mxfp8"}
DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
# Megatron-Core 0.19.2's fine-grained activation offload: the modules whose input is copied to pinned host memory
# in the forward and back before the backward (TransformerConfig.offload_modules, its allowed set)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                   "fused_group_mlp")
# the modules inside the routed experts (Megatron-Core's offload_inside_moe)
MOE_OFFLOAD_MODULES = ("expert_fc1", "moe_act", "fused_group_mlp")
EXPERT_STASHES = ("none", "paged")
OPTIMIZER_STATE_DTYPES = ("fp32", "bf16")
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")
ROUTINGS = ("dropless", "capacity", "forced_balance")
# the skill cards and Megatron-MoE-ModelZoo write force_balance / force-balance
ROUTING_ALIASES = {"force_balance": "forced_balance", "force-balance": "forced_balance",
                   "forced-balance": "forced_balance"}

# How Megatron-Core, Transformer Engine and Megatron-Bridge spell the values (tests/orchestrator/test_consumers.py
# checks
# them against the installed packages). FP8 formats and mixed-precision recipes as Megatron-Bridge's own
# recipes pair them (megatron.bridge.training.mixed_precision): hybrid (e4m3 forward, e5m2 backward) but
# for MXFP8. A Bridge recipe's mixed_precision is applied over the model's fields at run time, so the
# precision must be named there too.
_FP8 = {"fp8-tensorwise": ("tensorwise", "hybrid", "bf16_with_fp8_current_scaling_mixed"),
        "fp8-delayed": ("delayed", "hybrid", "bf16_with_fp8_delayed_scaling_mixed"),
        "fp8-blockwise": ("blockwise", "hybrid", "bf16_with_fp8_subchannel_scaling_mixed"),
        "mxfp8": ("mxfp8", "e4m3", "bf16_with_mxfp8_mixed")}
PRECISION_MEGATRON = dict(
    megatron_values={"fp32": None, "bf16": None, **{p: recipe for p, (recipe, _, _) in _FP8.items()}},
    megatron_extra={"fp32": {"bf16": False}, "bf16": {"bf16": True},
                    **{p: {"bf16": True, "fp8": fmt} for p, (_, fmt, _) in _FP8.items()}},
    bridge_extra={"fp32": {"mixed_precision": None}, "bf16": {"mixed_precision": "bf16_mixed"},
                  **{p: {"mixed_precision": mixed} for p, (_, _, mixed) in _FP8.items()}})
# The DeepEP-style dispatchers are Megatron's "flex" dispatcher with a backend.
DISPATCHER_MEGATRON = dict(megatron_values={"deepep": "flex", "hybridep": "flex"},
                           megatron_extra={b: {"moe_flex_dispatcher_backend": b} for b in ("deepep", "hybridep")})
CP_COMM_MEGATRON = dict(megatron_values={"allgather": "all_gather"})  # Transformer Engine's name
# The router's mode in Megatron-Core 0.19.2's TransformerConfig: dropless leaves moe_expert_capacity_factor unset
# (no token dropped; Megatron's default); capacity:F keeps at most F x the balanced share of token copies per
# expert (moe_token_drop_policy probs: the lowest-probability copies are dropped) and pads every expert to that
# capacity (moe_pad_expert_input_to_capacity: static shapes, what the moe CUDA-graph scope needs); forced_balance
# replaces the router's logits with random ones (moe_router_force_load_balancing, "only for benchmark": the
# published MoE rows ran it; the model does not learn its routing). Every field is spelled for every mode, so
# reading a config back (from_megatron) tells them apart.
_NOT_FORCED = {"moe_pad_expert_input_to_capacity": False, "moe_router_force_load_balancing": False}
ROUTING_MEGATRON = dict(
    megatron_values={"dropless": None, "forced_balance": None},  # capacity: its factor
    megatron_extra={"dropless": _NOT_FORCED,
                    "capacity": {**_NOT_FORCED, "moe_pad_expert_input_to_capacity": True,
                                 "moe_token_drop_policy": "probs"},
                    "forced_balance": {**_NOT_FORCED, "moe_router_force_load_balancing": True}},
    parametrised={"capacity": (0.01, 64.0)}, benchmark_only=("forced_balance",))


# The routed experts' saved activations in Megatron-Core 0.19.2's paged stash (moe_paged_stash): one page pool per
# rank, sized for the average tokens, that every MoE layer and microbatch in flight takes pages of, instead of a
# buffer per layer sized for its own. It needs a per-rank token budget (moe_expert_rank_capacity_factor: HybridEP
# drops the tokens above it), which HybridEP takes only with Transformer Engine's op fuser.
EXPERT_STASH_MEGATRON = dict(
    megatron_values={"none": None},  # paged:F: F is the rank capacity factor
    megatron_extra={"none": {"moe_paged_stash": False},
                    "paged": {"moe_paged_stash": True, "use_transformer_engine_op_fuser": True,
                              # the pool the cost model sizes (search_spaces/cost/offload.py): Megatron's defaults,
                              # written over a recipe's own
                              "moe_paged_stash_buffer_size_factor_cuda": 1.1,
                              "moe_paged_stash_buffer_size_factor_cpu": 0.0}},
    parametrised={"paged": (1.0, 64.0)})
# Adam's moments in the precision-aware optimizer (OptimizerConfig.exp_avg_dtype / exp_avg_sq_dtype), spelled as
# Megatron-Bridge writes a torch dtype (str(dtype); its YAML loader reads it back with str_to_dtype); Megatron-LM's
# --exp-avg-dtype takes our names.
OPTIMIZER_STATES_MEGATRON = dict(
    megatron_values={"fp32": "torch.float32", "bf16": "torch.bfloat16"},
    megatron_extra={"fp32": {"exp_avg_sq_dtype": "torch.float32"},
                    "bf16": {"exp_avg_sq_dtype": "torch.bfloat16", "use_precision_aware_optimizer": True}})


# The cost model's memoised terms (search_spaces/cost/memo.py) that read layout fields. A dimension names the terms
# whose value it changes (`read_by`); a term is keyed by the dimensions that name it (`fields_read_by`). The memory
# terms nest (search_spaces/cost/memory.py), each reading what the one it is built on reads, so a dimension names
# the innermost: "activations" (what one microbatch saves through a chunk), "activation levers" (what of that stays
# on the GPU), "rank memory" (what a pipeline rank holds beside: parameters, states, microbatches in flight),
# "memory" (the breakdown's buffers and offload). The step-time terms (search_spaces/cost/throughput.py): the GEMM
# rates, a rank's attention, the CP and the EP communication.
COST_TERMS = ("activations", "activation levers", "rank memory", "memory", "gemm rates", "attention", "cp comm",
              "ep comm")
# read by every term shaped by one microbatch's work on a rank
_MICROBATCH_TERMS = ("activations", "gemm rates", "attention", "cp comm", "ep comm")
_EXPERT_TERMS = ("activations", "gemm rates", "ep comm")


def _size(doc: str, flag: str, megatron: str, megatron_lm: str, searchable: bool = True,
          parallel: bool = True, read_by: tuple[str, ...] = ()) -> Any:
    return dimension(1, doc, kind="int", flag=flag, megatron=megatron, megatron_lm=megatron_lm,
                     searchable=searchable, parallel=parallel, minimum=1, read_by=read_by)


@dataclass(frozen=True)
class Layout:
    """How one training job is split and run. Each field is one dimension (see the module docstring)."""

    tp: int = _size("tensor-parallel size: attention and dense MLP weights split over TP GPUs of one NVLink domain",
                    "--tp", "model.tensor_model_parallel_size", "--tensor-model-parallel-size",
                    read_by=_MICROBATCH_TERMS)
    cp: int = _size("context-parallel size: each sequence split into 2*CP load-balanced chunks over CP GPUs",
                    "--cp", "model.context_parallel_size", "--context-parallel-size",
                    read_by=_MICROBATCH_TERMS)
    ep: int = _size("expert-parallel size: routed experts spread over EP GPUs (token all-to-all)",
                    "--ep", "model.expert_model_parallel_size", "--expert-model-parallel-size",
                    read_by=_EXPERT_TERMS)
    etp: int = _size("expert tensor-parallel size: each expert's FFN split over ETP GPUs",
                     "--etp", "model.expert_tensor_parallel_size", "--expert-tensor-parallel-size",
                     read_by=_EXPERT_TERMS)
    pp: int = _size("pipeline-parallel size: layers split into PP stages",
                    "--pp", "model.pipeline_model_parallel_size", "--pipeline-model-parallel-size",
                    read_by=("rank memory", "ep comm"))
    vpp: int = _size("virtual pipeline stages per pipeline rank (interleaved schedule); 1 = none",
                     "--vpp", "model.virtual_pipeline_model_parallel_size", "--num-virtual-stages-per-pipeline-rank",
                     read_by=("rank memory",))
    mbs: int = _size("micro-batch size in sequences", "--mbs", "train.micro_batch_size", "--micro-batch-size",
                     parallel=False, read_by=_MICROBATCH_TERMS)
    gbs: int = _size("global batch size in sequences per optimizer step (a multiple of MBS*DP)", "--gbs",
                     "train.global_batch_size", "--global-batch-size", searchable=False, parallel=False,
                     read_by=("rank memory", "ep comm"))
    precision: str = dimension(
        "bf16", "GEMM precision: fp32 (CPU only), bf16, an fp8 recipe or mxfp8 (Blackwell)", kind="choice",
        flag="--precision", megatron="model.fp8_recipe", megatron_lm="--fp8-recipe", searchable=True,
        choices=PRECISIONS, aliases=PRECISION_ALIASES, read_by=_MICROBATCH_TERMS, **PRECISION_MEGATRON)
    recompute: str = dimension(
        "none", "activation recompute: none, full (whole layers) or the modules recomputed selectively",
        kind="recompute", flag="--recompute", megatron="model.recompute_modules", megatron_lm="--recompute-modules",
        searchable=True, choices=RECOMPUTE_MODULES, aliases=RECOMPUTE_ALIASES, read_by=("activations", "ep comm"))
    recompute_method: str = dimension(
        "uniform", "full recompute: uniform (every group of N layers) or block (the first N layers per stage)",
        kind="choice", flag="--recompute-method", megatron="model.recompute_method", megatron_lm="--recompute-method",
        choices=RECOMPUTE_METHODS, read_by=("activations",))
    recompute_num_layers: int = dimension(
        1, "full recompute: the N of recompute_method", kind="int", flag="--recompute-num-layers",
        megatron="model.recompute_num_layers", megatron_lm="--recompute-num-layers", minimum=1,
        read_by=("activations",))
    cuda_graphs: tuple[str, ...] = dimension(
        (), "CUDA-graph scopes captured (none, per-layer scopes, or full_iteration alone)", kind="modules",
        flag="--cuda-graphs", megatron="model.cuda_graph_modules", megatron_lm="--cuda-graph-modules", searchable=True,
        choices=CUDA_GRAPH_SCOPES, read_by=("memory",))
    dispatcher: str = dimension(
        "alltoall", "MoE token dispatcher: alltoall, allgather, or the flex dispatcher with DeepEP / HybridEP",
        kind="choice", flag="--dispatcher", megatron="model.moe_token_dispatcher_type",
        megatron_lm="--moe-token-dispatcher-type", searchable=True, choices=DISPATCHERS,
        read_by=("activations", "ep comm"), **DISPATCHER_MEGATRON)
    routing: str = dimension(
        "dropless", "MoE router: dropless (every token reaches its experts), capacity:F (token dropping, each "
        "expert padded to F x its balanced share) or forced_balance (random routing: benchmarks only, promote "
        "refuses it)", kind="choice", flag="--routing", megatron="model.moe_expert_capacity_factor",
        megatron_lm="--moe-expert-capacity-factor", searchable=True, opt_in=True, choices=ROUTINGS,
        aliases=ROUTING_ALIASES, read_by=("activations", "ep comm"), **ROUTING_MEGATRON)
    ep_overlap: bool = dimension(
        False, "overlap one microbatch's MoE token all-to-all with another's compute (Megatron-Core's 1F1B "
        "EP A2A overlap: overlap_moe_expert_parallel_comm); off, the dispatch and combine run exposed",
        kind="bool", flag="--ep-overlap", megatron="model.overlap_moe_expert_parallel_comm",
        megatron_lm="--overlap-moe-expert-parallel-comm", searchable=True, read_by=("ep comm",))
    cp_comm_type: str = dimension(
        "p2p", "context-parallel communication: p2p ring, a2a (Ulysses), allgather, or a2a inside the NVLink "
        "domain with p2p across", kind="choice", flag="--cp-comm-type", megatron="model.cp_comm_type",
        megatron_lm="--cp-comm-type", searchable=True, choices=CP_COMM_TYPES, read_by=("attention", "cp comm"),
        **CP_COMM_MEGATRON)
    hierarchical_cp: tuple[int, ...] = dimension(
        (), "a2a+p2p only: the CP group sizes per level, a2a (inner, consecutive CP ranks) then p2p (outer); "
        "their product is CP (Megatron's hierarchical_context_parallel_sizes); none otherwise", kind="sizes",
        flag="--hierarchical-cp", megatron="model.hierarchical_context_parallel_sizes",
        megatron_lm="--hierarchical-context-parallel-sizes", searchable=True, read_by=("attention", "cp comm"))
    optimizer_offload: float = dimension(
        0.0, "fraction of the optimizer states kept and stepped on the host (0..1)", kind="float",
        flag="--optimizer-offload", megatron="optimizer.optimizer_offload_fraction",
        megatron_lm="--optimizer-offload-fraction", searchable=True, minimum=0.0, maximum=1.0,
        read_by=("memory",))
    distributed_optimizer: bool = dimension(
        True, "shard the optimizer states over data-parallel ranks (ZeRO-1)", kind="bool",
        flag="--distributed-optimizer", megatron="optimizer.use_distributed_optimizer",
        megatron_lm="--use-distributed-optimizer", read_by=("rank memory",))
    sequence_parallel: bool | None = dimension(
        None, "sequence parallelism in the TP regions; auto = what Megatron requires (on whenever TP > 1)",
        kind="bool", flag="--sequence-parallel", megatron="model.sequence_parallel", megatron_lm="--sequence-parallel",
        optional=True, read_by=_MICROBATCH_TERMS)
    # ---- memory levers (issue 29): opt-in, so `space` holds them at their defaults unless `free` names them ----
    activation_offload: tuple[str, ...] = dimension(
        (), "fine-grained activation offload: the modules whose input goes to pinned host memory in the forward "
        "and comes back for the backward (Megatron-Core's offload_modules); none = off", kind="modules",
        flag="--activation-offload", megatron="model.offload_modules", megatron_lm="--offload-modules",
        searchable=True, opt_in=True, quiet_default=True, choices=OFFLOAD_MODULES, read_by=("activation levers",))
    activation_offload_fraction: float = dimension(
        1.0, "fraction of the offload groups of activation_offload that are offloaded (0..1)", kind="float",
        flag="--activation-offload-fraction", megatron="model.activation_offload_fraction",
        megatron_lm="--activation-offload-fraction", searchable=True, opt_in=True, quiet_default=True,
        minimum=0.0, maximum=1.0, read_by=("activation levers",))
    expert_stash: str = dimension(
        "none", "routed-expert activations: none (a buffer per layer, sized for the routed tokens) or paged:F "
        "(Megatron-Core's paged stash: one page pool sized for the average tokens; F the per-rank token budget, "
        "moe_expert_rank_capacity_factor, above which HybridEP drops tokens)", kind="choice",
        flag="--expert-stash", megatron="model.moe_expert_rank_capacity_factor",
        megatron_lm="--moe-expert-rank-capacity-factor", searchable=True, opt_in=True, quiet_default=True,
        choices=EXPERT_STASHES, read_by=("activation levers",), **EXPERT_STASH_MEGATRON)
    optimizer_states: str = dimension(
        "fp32", "Adam's moments: fp32, or bf16 through the precision-aware optimizer (half their bytes)",
        kind="choice", flag="--optimizer-states", megatron="optimizer.exp_avg_dtype", megatron_lm="--exp-avg-dtype",
        searchable=True, opt_in=True, quiet_default=True, choices=OPTIMIZER_STATE_DTYPES, read_by=("rank memory",),
        **OPTIMIZER_STATES_MEGATRON)
    fp8_param_gather: bool = dimension(
        False, "keep the compute weights in fp8 (1 B per parameter, the fp32 master in the optimizer) and all-gather "
        "them in fp8 (Megatron-Core's fp8_param / DDP fp8_param_gather; an fp8 precision with the distributed "
        "optimizer)", kind="bool", flag="--fp8-param-gather", megatron="ddp.fp8_param_gather",
        megatron_lm="--fp8-param-gather", searchable=True, opt_in=True, quiet_default=True,
        read_by=("rank memory",))

    def __post_init__(self) -> None:
        self._canonicalise(_CHECKS)

    def _canonicalise(self, checks: Iterable[tuple[str, set, Dimension]]) -> None:
        """Parse the fields `checks` name to their canonical values (a SpecError names a bad one), then check
        the batch. A value its dimension has seen canonical before costs one set lookup (Dimension.canonical,
        inline: this loop runs for every field of every layout an enumeration builds)."""
        values = self.__dict__
        for name, seen, dim in checks:
            value = values[name]
            try:
                if (type(value), value) in seen:
                    continue
            except TypeError:  # unhashable (a list): parsed
                pass
            object.__setattr__(self, name, dim.canonical(value))
        if self.gbs % self.mbs:
            raise SpecError(f"gbs ({self.gbs}) must be a multiple of mbs ({self.mbs})")

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def sp(self) -> bool:
        """Sequence parallel in effect (Megatron requires it for MoE with TP > 1)."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def cuda_device_max_connections(self) -> int:
        """CUDA_DEVICE_MAX_CONNECTIONS for this layout: 1 orders the kernel launches that TP/SP and CP comm
        overlap need; the EP overlap wants more hardware queues, 32 (Megatron-LM's arguments.py: "set
        CUDA_DEVICE_MAX_CONNECTIONS to 1 or 32, which depends on which parallelization you want to prioritize"),
        used only without TP and CP."""
        return 32 if self.ep_overlap and self.tp == 1 and self.cp == 1 else 1

    def dp(self, world: int) -> int:
        """Data-parallel size of the dense part: world / (TP·CP·PP). 0 if it does not divide."""
        denom = self.tp * self.cp * self.pp
        return world // denom if world % denom == 0 else 0

    def edp(self, world: int) -> int:
        """Expert data-parallel size (parallel folding): world / (ETP·EP·PP). 0 if it does not divide."""
        denom = self.etp * self.ep * self.pp
        return world // denom if world % denom == 0 else 0

    def grad_accum(self, world: int) -> int:
        """Microbatches per step on each pipeline: GBS / (MBS·DP). 0 if it does not divide."""
        dp = self.dp(world)
        if not dp or self.gbs % (self.mbs * dp):
            return 0
        return self.gbs // (self.mbs * dp)

    @property
    def recompute_granularity(self) -> str:
        """none | selective | full (Megatron's recompute_granularity)."""
        return self.recompute if self.recompute in ("none", "full") else "selective"

    @property
    def recompute_modules(self) -> tuple[str, ...]:
        """The selectively recomputed modules (empty unless selective)."""
        return tuple(self.recompute.split(",")) if self.recompute_granularity == "selective" else ()

    # ---- (de)serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field by name, in declaration order (tuples as lists), a quiet_default lever only when it is not at
        its default: the JSON form."""
        d = {name: getattr(self, name) for name in FIELD_NAMES
             if name not in _QUIET or getattr(self, name) != _QUIET[name]}
        for name, value in d.items():
            if isinstance(value, tuple):
                d[name] = list(value)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Layout":
        """Build from a dict of field values (the spellings `parse` accepts; legacy recompute_granularity /
        recompute_modules keys of older records are read too)."""
        data = _legacy_recompute(dict(data))
        unknown = sorted(set(data) - set(FIELD_NAMES))
        if unknown:
            raise SpecError(f"unknown layout field {unknown[0]!r}; allowed: {', '.join(FIELD_NAMES)}")
        return cls(**data)

    @classmethod
    def from_params(cls, params: dict[str, Any], base: "Layout | None" = None) -> "Layout":
        """Decode encoded values (Optuna params, CSV cells, MLflow params, flag text) over `base`."""
        unknown = sorted(set(params) - set(FIELD_NAMES))
        if unknown:
            raise SpecError(f"unknown layout field {unknown[0]!r}; allowed: {', '.join(FIELD_NAMES)}")
        decoded = {name: BY_NAME[name].decode(value) for name, value in params.items()}
        return (base or cls()).replace(**decoded)

    def params(self, names: Iterable[str] | None = None) -> dict[str, Primitive]:
        """Encoded values of the named dimensions (all by default), e.g. as Optuna params or MLflow params."""
        return {name: BY_NAME[name].encode(getattr(self, name)) for name in (names or FIELD_NAMES)}

    def benchmark_only(self) -> list[str]:
        """The settings of this layout that are for benchmarks only (`routing=forced_balance`): not for production."""
        return [f"{d.name}={getattr(self, d.name)}" for d in DIMENSIONS
                if d.benchmark_only and d.mode(getattr(self, d.name)) in d.benchmark_only]

    @classmethod
    def of_canonical(cls, values: dict[str, Any]) -> "Layout":
        """A layout of field values that are each canonical already (its dimension's parse returned it: the layout
        space's value lists are), the other fields at their defaults, built without parsing them again (`space`
        builds a hundred thousand). Only the batch is checked: a value that is not canonical would make a layout
        unequal to the one Layout() builds (tests/search_spaces/test_layout.py holds the two equal over the space's
        values)."""
        new = object.__new__(cls)
        new.__dict__.update(_CANONICAL_DEFAULTS)
        new.__dict__.update(values)
        if new.gbs % new.mbs:
            raise SpecError(f"gbs ({new.gbs}) must be a multiple of mbs ({new.mbs})")
        return new

    def replace(self, **changes: Any) -> "Layout":
        """This layout with `changes` applied (dataclasses.replace, without parsing the unchanged fields again:
        the cost model replaces fields of layouts hundreds of thousands of times)."""
        changes = _legacy_recompute(changes)
        unknown = [name for name in changes if name not in BY_NAME]
        if unknown:
            raise TypeError(f"Layout has no field {unknown[0]!r}")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        new._canonicalise([_CHECKS_BY_NAME[name] for name in changes])
        return new

    def to_flags(self) -> list[str]:
        """argv for `moe-autotune estimate` and `python -m trainers.megatron_moe` (same flags): every field."""
        argv: list[str] = []
        for dim in DIMENSIONS:
            value = dim.encode(getattr(self, dim.name))
            argv += [dim.flag, str(value).lower() if isinstance(value, bool) else str(value)]
        return argv

    def key(self) -> str:
        """A short stable string naming the layout (for dedup, tables and run names): every searchable
        dimension and the batch, then any other field that is not at its default."""
        parts = []
        for dim in DIMENSIONS:
            value = getattr(self, dim.name)
            # an empty CP hierarchy (every cp_comm_type but a2a+p2p), an opt-in dimension and a switch left off
            # at its default are left out: keys stay as they were
            if value == dim.default and (not (dim.searchable or dim.name == "gbs") or dim.kind == "sizes"
                                         or dim.opt_in or value is False):
                continue
            text = dim.encode(value)
            parts.append(f"{dim.name}{text}" if dim.kind == "int" else f"{dim.name}={text}")
        return "/".join(parts)


DIMENSIONS: tuple[Dimension, ...] = dimensions_of(Layout)
BY_NAME: dict[str, Dimension] = {d.name: d for d in DIMENSIONS}
FIELD_NAMES: tuple[str, ...] = tuple(BY_NAME)
# what a sweep searches over (spec `free`), and the parallel sizes a trainer reports back
SEARCH_DIMENSIONS: tuple[str, ...] = tuple(d.name for d in DIMENSIONS if d.searchable)
# what a sweep varies unless its spec says otherwise (an opt-in dimension only when `free` names it)
DEFAULT_FREE: tuple[str, ...] = tuple(d.name for d in DIMENSIONS if d.searchable and not d.opt_in)
PARALLEL_SIZES: tuple[str, ...] = tuple(d.name for d in DIMENSIONS if d.parallel)
# what Layout._canonicalise runs per field: (name, the canonical values its dimension has seen, the dimension)
_CHECKS: tuple[tuple[str, set, Dimension], ...] = tuple((d.name, d.seen_canonical, d) for d in DIMENSIONS)
_CHECKS_BY_NAME = {check[0]: check for check in _CHECKS}
_QUIET = {d.name: d.default for d in DIMENSIONS if d.quiet_default}  # left out of to_dict at their default
_CANONICAL_DEFAULTS = dict(Layout().__dict__)  # every field at its default, canonical (Layout.of_canonical)
_UNKNOWN_TERMS = sorted({term for d in DIMENSIONS for term in d.read_by} - set(COST_TERMS))
if _UNKNOWN_TERMS:
    raise ValueError(f"Layout dimensions name cost terms that are not in COST_TERMS: {_UNKNOWN_TERMS}")


def fields_read_by(term: str) -> tuple[str, ...]:
    """The layout fields the cost model's memoised `term` reads (one of COST_TERMS; its memo key), in field order:
    the dimensions that name it in their `read_by`."""
    if term not in COST_TERMS:
        raise ValueError(f"{term!r} is not a cost term ({', '.join(COST_TERMS)})")
    return tuple(d.name for d in DIMENSIONS if term in d.read_by)


def _legacy_recompute(data: dict[str, Any]) -> dict[str, Any]:
    """Records written before `recompute` was one field kept granularity and modules apart."""
    granularity = data.pop("recompute_granularity", None)
    modules = data.pop("recompute_modules", None)
    if granularity is not None and "recompute" not in data:
        data["recompute"] = list(modules or ()) if granularity == "selective" else granularity
    return data


def parse_recompute(value: Any) -> str:
    """`none` | `full` | selective modules (comma list or list, aliases allowed) -> the canonical spelling."""
    return BY_NAME["recompute"].parse(value)


def distinct(layouts: Iterable[Layout]) -> list[Layout]:
    """Layouts in order with duplicates removed."""
    return list(dict.fromkeys(layouts))
