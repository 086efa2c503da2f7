"""Layout: one point of the search space, validated at construction (like Megatron-Core's configs).

A Layout says how one training job is split and run. It knows nothing of the model or the cluster:
whether it is *legal* for a given model and world size is the job of `search_spaces.rules`.
Derived sizes (DP, EDP, gradient accumulation) need the world size, so they are methods.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable

from search_spaces.errors import SpecError

RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
# The seed recipes call mla_up_proj "up_proj" and layernorm "norm".
RECOMPUTE_ALIASES = {"up_proj": "mla_up_proj", "norm": "layernorm"}
RECOMPUTE_GRANULARITIES = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")
# fp32 exists for CPU runs only; the fp8 names follow Megatron-Core's fp8_recipe values.
PRECISIONS = ("fp32", "bf16", "fp8-tensorwise", "fp8-delayed", "fp8-blockwise", "mxfp8")
PRECISION_ALIASES = {
    "fp8": "fp8-blockwise",
    "fp8-block": "fp8-blockwise",
    "fp8-cs": "fp8-tensorwise",
    "fp8-mx": "mxfp8",
}
DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")

_INT_FIELDS = ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs")


def _as_tuple(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v for v in value.replace(";", ",").split(",")]
    items = tuple(str(v).strip() for v in value if str(v).strip())
    return () if items in ((), ("none",)) else items


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    pp: int = 1
    vpp: int = 1
    mbs: int = 1
    gbs: int = 1
    recompute_granularity: str = "none"
    recompute_modules: tuple[str, ...] = ()
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    cuda_graphs: tuple[str, ...] = ()
    precision: str = "bf16"
    dispatcher: str = "alltoall"
    cp_comm_type: str = "p2p"
    optimizer_offload: float = 0.0
    distributed_optimizer: bool = True
    # None means "what Megatron requires": on whenever TP > 1.
    sequence_parallel: bool | None = None

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise SpecError(f"layout field {name} must be an integer, got {value!r}") from None
                object.__setattr__(self, name, value)
            if value < 1:
                raise SpecError(f"layout field {name} must be >= 1, got {value}")
        if self.gbs % self.mbs:
            raise SpecError(f"gbs ({self.gbs}) must be a multiple of mbs ({self.mbs})")

        modules = tuple(RECOMPUTE_ALIASES.get(m, m) for m in _as_tuple(self.recompute_modules))
        bad = [m for m in modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise SpecError(f"unknown recompute module {bad[0]!r}; allowed: {', '.join(RECOMPUTE_MODULES)}"
                            f" (aliases: {', '.join(RECOMPUTE_ALIASES)})")
        object.__setattr__(self, "recompute_modules", tuple(dict.fromkeys(modules)))
        gran = self.recompute_granularity
        if gran not in RECOMPUTE_GRANULARITIES:
            raise SpecError(f"recompute granularity {gran!r}; allowed: {', '.join(RECOMPUTE_GRANULARITIES)}")
        if gran == "selective" and not self.recompute_modules:
            raise SpecError("selective recompute needs at least one module")
        if gran != "selective" and self.recompute_modules:
            raise SpecError(f"recompute modules are only for selective recompute, not {gran!r}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise SpecError(f"recompute method {self.recompute_method!r}; allowed: {', '.join(RECOMPUTE_METHODS)}")
        if int(self.recompute_num_layers) < 1:
            raise SpecError("recompute_num_layers must be >= 1")

        graphs = _as_tuple(self.cuda_graphs)
        bad = [g for g in graphs if g not in CUDA_GRAPH_SCOPES]
        if bad:
            raise SpecError(f"unknown CUDA-graph scope {bad[0]!r}; allowed: none, {', '.join(CUDA_GRAPH_SCOPES)}")
        object.__setattr__(self, "cuda_graphs", tuple(dict.fromkeys(graphs)))

        precision = PRECISION_ALIASES.get(str(self.precision).lower(), str(self.precision).lower())
        if precision not in PRECISIONS:
            raise SpecError(f"unknown precision {self.precision!r}; allowed: {', '.join(PRECISIONS)}")
        object.__setattr__(self, "precision", precision)
        if self.dispatcher not in DISPATCHERS:
            raise SpecError(f"unknown dispatcher {self.dispatcher!r}; allowed: {', '.join(DISPATCHERS)}")
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise SpecError(f"unknown cp_comm_type {self.cp_comm_type!r}; allowed: {', '.join(CP_COMM_TYPES)}")
        try:
            offload = float(self.optimizer_offload)
        except (TypeError, ValueError):
            raise SpecError(f"optimizer_offload must be a number in [0, 1], got {self.optimizer_offload!r}") from None
        if not 0.0 <= offload <= 1.0:
            raise SpecError(f"optimizer_offload must be in [0, 1], got {offload}")
        object.__setattr__(self, "optimizer_offload", offload)

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def sp(self) -> bool:
        """Sequence parallel in effect (Megatron requires it for MoE with TP > 1)."""
        return self.tp > 1 if self.sequence_parallel is None else bool(self.sequence_parallel)

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
    def recompute(self) -> str:
        """The --recompute flag value: none, full, or a comma list of modules."""
        if self.recompute_granularity == "selective":
            return ",".join(self.recompute_modules)
        return self.recompute_granularity

    # ---- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["recompute_modules"] = list(self.recompute_modules)
        d["cuda_graphs"] = list(self.cuda_graphs)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Layout":
        """Build from a dict; accepts the flag spellings (`recompute`, `cuda_graphs` as strings)."""
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)}
        if "recompute" in data:
            data.update(parse_recompute(data.pop("recompute"), data.get("recompute_method", "uniform"),
                                        data.get("recompute_num_layers", 1)))
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecError(f"unknown layout field {unknown[0]!r}; allowed: {', '.join(sorted(names | {'recompute'}))}")
        return cls(**data)

    def replace(self, **changes: Any) -> "Layout":
        if "recompute" in changes:
            changes.update(parse_recompute(changes.pop("recompute"),
                                           changes.get("recompute_method", self.recompute_method),
                                           changes.get("recompute_num_layers", self.recompute_num_layers)))
        return dataclasses.replace(self, **changes)

    def to_flags(self) -> list[str]:
        """argv for `moe-autotune estimate` and `python -m trainers.megatron_moe` (same flags)."""
        argv = []
        for name in _INT_FIELDS:
            argv += [f"--{name}", str(getattr(self, name))]
        argv += ["--recompute", self.recompute]
        if self.recompute_granularity == "full":
            argv += ["--recompute-method", self.recompute_method,
                     "--recompute-num-layers", str(self.recompute_num_layers)]
        argv += ["--cuda-graphs", ",".join(self.cuda_graphs) or "none",
                 "--precision", self.precision,
                 "--dispatcher", self.dispatcher,
                 "--cp-comm-type", self.cp_comm_type,
                 "--optimizer-offload", repr(self.optimizer_offload)]
        if not self.distributed_optimizer:
            argv += ["--no-distributed-optimizer"]
        return argv

    def key(self) -> str:
        """A short stable string naming the layout (for dedup, tables and run names)."""
        parts = [f"tp{self.tp}", f"cp{self.cp}", f"ep{self.ep}", f"etp{self.etp}", f"pp{self.pp}",
                 f"vpp{self.vpp}", f"mbs{self.mbs}", f"gbs{self.gbs}", f"rc={self.recompute}",
                 f"g={','.join(self.cuda_graphs) or 'none'}", self.precision, self.dispatcher,
                 f"cpc={self.cp_comm_type}", f"off={self.optimizer_offload:g}"]
        if not self.distributed_optimizer:
            parts.append("nodistopt")
        if self.sequence_parallel is not None:
            parts.append(f"sp={int(self.sequence_parallel)}")
        return "/".join(parts)


def parse_recompute(value: Any, method: str = "uniform", num_layers: int = 1) -> dict[str, Any]:
    """`none` | `full` | `selective` modules as a comma list (or list) -> Layout fields."""
    if isinstance(value, dict):
        return value
    items = _as_tuple(value)
    if not items:
        return {"recompute_granularity": "none", "recompute_modules": ()}
    if items == ("full",):
        return {"recompute_granularity": "full", "recompute_modules": (),
                "recompute_method": method, "recompute_num_layers": num_layers}
    if "full" in items:
        raise SpecError("recompute 'full' cannot be combined with selective modules")
    return {"recompute_granularity": "selective", "recompute_modules": items}


def distinct(layouts: Iterable[Layout]) -> list[Layout]:
    """Layouts in order with duplicates removed."""
    return list(dict.fromkeys(layouts))
