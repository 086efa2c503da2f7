"""Legality rules: each is one declared function that names the rule, says why in words, the level of the
space's nested enumeration that decides it and the layout fields it reads.

`check()` returns every violation (an empty list = legal), testing the rules in the order they are declared
here (cheap ones first). Everything else about a rule derives from its declaration: `RULES` (the names, in that
order, for counting rejections per rule), `level_rules()` (which rules a partial grid of the enumeration can
already break) and `level_reads()` (the fields a cached verdict at that level must be keyed by).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.pipeline import placement
from search_spaces.layouts.layout import BY_NAME, FIELD_NAMES, MOE_OFFLOAD_MODULES, Layout

# Features that need a GPU (CUDA kernels, NVSHMEM, host pinned-memory offload). On `cpu` the trainer runs gloo
# and implements context parallelism by all-gathering K/V, whatever cp_comm_type says; p2p (the default) and
# allgather are accepted, a2a variants are not (they need head-sharded attention kernels).
GPU_ONLY_DISPATCHERS = ("deepep", "hybridep")
CPU_CP_COMM_TYPES = ("p2p", "allgather")

# The levels of the space's nested enumeration (search_spaces/layouts/space.py), outermost first; a rule declared at a
# level reads only the grid fields fixed by then. Rules without a level are feature rules.
LEVELS = ("pipe", "tp", "cp", "ep", "mbs")


@dataclass(frozen=True)
class Violation:
    rule: str
    reason: str

    def to_dict(self) -> dict:
        return {"rule": self.rule, "reason": self.reason}


@dataclass(frozen=True)
class Situation:
    """What a rule judges: a layout for a model on a number of GPUs of one kind at a sequence length."""
    model: ModelSpec
    gpu: GPUSpec
    num_gpus: int
    seq_len: int
    layout: Layout


# A rule's test: None when the layout keeps the rule, else the reason (or several) it breaks it.
RuleTest = Callable[[Situation], "str | list[str] | None"]


@dataclass(frozen=True)
class Rule:
    name: str
    """The rule's name, as counted by `space` and shown in every violation."""
    why: str
    """Why the rule exists, in words (the class of layouts it refuses and who refuses them)."""
    level: str | None
    """The enumeration level (one of LEVELS) whose grid fields decide it; None for a feature rule."""
    reads: tuple[str, ...]
    """The Layout fields the test reads (a test checks this): cached verdicts are keyed by them."""
    test: RuleTest

    def __call__(self, situation: Situation) -> list[Violation]:
        return self.violations(self.test(situation))

    def violations(self, found: "str | list[str] | None") -> list[Violation]:
        """The violations of what the test found (none when it found nothing)."""
        if not found:
            return []
        return [Violation(self.name, reason) for reason in ([found] if isinstance(found, str) else found)]


REGISTRY: list[Rule] = []


def rule(name: str, *, why: str, reads: Iterable[str], level: str | None = None) -> Callable[[RuleTest], RuleTest]:
    """Declare a legality rule (the decorated function is its test); rules run in declaration order."""
    reads = tuple(reads)
    unknown = [f for f in reads if f not in FIELD_NAMES]
    if unknown or (level is not None and level not in LEVELS) or any(r.name == name for r in REGISTRY):
        raise ValueError(f"rule {name!r}: unknown fields {unknown}, level {level!r} or a second declaration")

    def declare(test: RuleTest) -> RuleTest:
        REGISTRY.append(Rule(name, why, level, reads, test))
        return test
    return declare


def check(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout) -> list[Violation]:
    """Every rule the layout breaks for this model, GPU, world size and sequence length."""
    situation = Situation(model, gpu, num_gpus, seq_len, layout)
    out: list[Violation] = []
    for r in REGISTRY:
        found = r.test(situation)
        if found:  # (not r(situation): one call less per rule kept, and space checks tens of thousands)
            out += r.violations(found)
    return out


def level_rules(level: str) -> tuple[str, ...]:
    """The rules a partial grid at `level` of the enumeration can already break."""
    return tuple(r.name for r in REGISTRY if r.level == level)


def level_reads(level: str | None, among: Iterable[str] = FIELD_NAMES) -> tuple[str, ...]:
    """The fields (of `among`, in its order) that the rules at `level` read: a cached verdict's key."""
    read = {f for r in REGISTRY if r.level == level for f in r.reads}
    return tuple(f for f in among if f in read)


def _is_fp8(precision: str) -> bool:
    return precision.startswith("fp8") or precision == "mxfp8"


# ---- the rules, cheap ones first --------------------------------------------------------------------------
@rule("world_dense", level="cp", reads=("tp", "cp", "pp"),
      why="the world must split into TP*CP*PP*DP ranks")
def _world_dense(s: Situation) -> str | None:
    L = s.layout
    if L.dp(s.num_gpus) == 0:
        return f"{s.num_gpus} GPUs is not a multiple of TP*CP*PP = {L.tp}*{L.cp}*{L.pp} = {L.tp * L.cp * L.pp}"
    return None


@rule("world_expert", level="ep", reads=("etp", "ep", "pp"),
      why="parallel folding: the world must also split into ETP*EP*EDP*PP ranks")
def _world_expert(s: Situation) -> str | None:
    L = s.layout
    if L.edp(s.num_gpus) == 0:
        return f"{s.num_gpus} GPUs is not a multiple of ETP*EP*PP = {L.etp}*{L.ep}*{L.pp} = {L.etp * L.ep * L.pp}"
    return None


@rule("pipeline_split", level="pipe", reads=("pp", "vpp"),
      why="the model's layers (with MTP, embedding and loss) must fill PP*VPP stages")
def _pipeline_split(s: Situation) -> str | None:
    L, m = s.layout, s.model
    if placement(m, L.pp, L.vpp) is None:
        return (f"{m.num_layers} layers (+{m.mtp_layers} MTP, embedding, loss) cannot fill "
                f"PP*VPP = {L.pp * L.vpp} stages")
    return None


@rule("vpp_needs_pp", level="pipe", reads=("vpp", "pp"), why="interleaving (VPP > 1) needs PP > 1")
def _vpp_needs_pp(s: Situation) -> str | None:
    return f"VPP={s.layout.vpp} needs PP > 1" if s.layout.vpp > 1 and s.layout.pp == 1 else None


@rule("heads_tp", level="tp", reads=("tp",), why="attention heads, KV groups and delta-net heads divide by TP")
def _heads_tp(s: Situation) -> str | None:
    m, tp = s.model, s.layout.tp
    ok = m.num_attention_heads % tp == 0 and (m.is_mla or m.num_kv_heads % tp == 0)
    if "L" in m.attention_pattern:
        ok = ok and m.linear_num_key_heads % tp == 0 and m.linear_num_value_heads % tp == 0
    return None if ok else f"{m.num_attention_heads} heads / {m.num_kv_heads} KV groups do not divide by TP={tp}"


@rule("experts_ep", level="ep", reads=("ep",), why="routed experts divide by EP")
def _experts_ep(s: Situation) -> str | None:
    m, ep = s.model, s.layout.ep
    return f"{m.num_experts} experts do not divide by EP={ep}" if m.is_moe and m.num_experts % ep else None


@rule("expert_ffn_etp", level="ep", reads=("etp",), why="the expert FFN width divides by ETP")
def _expert_ffn_etp(s: Situation) -> str | None:
    m, etp = s.model, s.layout.etp
    if m.is_moe and m.moe_ffn_hidden_size % etp:
        return f"expert FFN width {m.moe_ffn_hidden_size} does not divide by ETP={etp}"
    return None


@rule("dense_model_ep", level="ep", reads=("ep", "etp"), why="a dense model has no experts to split: EP = ETP = 1")
def _dense_model_ep(s: Situation) -> str | None:
    if not s.model.is_moe and (s.layout.ep > 1 or s.layout.etp > 1):
        return f"{s.model.name} has no experts: EP and ETP must be 1"
    return None


@rule("sequence_cp", level="cp", reads=("cp", "tp", "sequence_parallel"),
      why="the sequence splits into 2*CP load-balanced chunks (times TP with sequence parallel)")
def _sequence_cp(s: Situation) -> str | None:
    L = s.layout
    div = 2 * L.cp * (L.tp if L.sp else 1) if L.cp > 1 else (L.tp if L.sp else 1)
    if s.seq_len % div == 0:
        return None
    return (f"seq_len {s.seq_len} does not divide by {'2*CP' if L.cp > 1 else ''}"
            f"{'*TP' if L.sp and L.cp > 1 else ''}{'TP' if L.sp and L.cp == 1 else ''} = {div}")


@rule("cp_a2a_heads", reads=("cp", "cp_comm_type", "tp"), why="a2a CP splits the heads of each TP rank over CP")
def _cp_a2a_heads(s: Situation) -> str | None:
    L, m = s.layout, s.model
    if L.cp > 1 and L.cp_comm_type == "a2a" and not a2a_heads_divide(m, L.tp, L.cp):
        return (f"a2a context parallel needs heads ({m.num_attention_heads // L.tp}) and KV heads per TP rank "
                f"divisible by CP={L.cp}")
    return None


def microbatch_rule(gbs: int, mbs: int, dp: int, pp: int, vpp: int) -> str | None:
    """The mbs-level rule that (GBS, MBS) breaks on DP data-parallel ranks of a PP x VPP pipeline, or None (the
    enumeration of the space checks these inline, with no Layout built)."""
    if dp and gbs % (mbs * dp):
        return "global_batch"
    if vpp > 1 and dp and (gbs // (mbs * dp)) % pp:
        return "interleaved_microbatches"
    return None


@rule("global_batch", level="mbs", reads=("gbs", "mbs", "tp", "cp", "pp"),
      why="the global batch splits into whole microbatches on every data-parallel rank")
def _global_batch(s: Situation) -> str | None:
    L = s.layout
    dp = L.dp(s.num_gpus)
    if microbatch_rule(L.gbs, L.mbs, dp, L.pp, 1) == "global_batch":
        return f"GBS={L.gbs} is not a multiple of MBS*DP = {L.mbs}*{dp} = {L.mbs * dp}"
    return None


@rule("interleaved_microbatches", level="mbs", reads=("gbs", "mbs", "tp", "cp", "pp", "vpp"),
      why="Megatron-Core's interleaved schedule runs microbatches in groups of PP per virtual stage: their number "
          "must be a multiple of PP (megatron/core/pipeline_parallel/schedules.py, "
          "forward_backward_pipelining_with_interleaving: microbatch_group_size_per_vp_stage defaults to PP)")
def _interleaved_microbatches(s: Situation) -> str | None:
    L = s.layout
    dp = L.dp(s.num_gpus)
    if microbatch_rule(L.gbs, L.mbs, dp, L.pp, L.vpp) == "interleaved_microbatches":
        return (f"VPP={L.vpp} runs {L.gbs // (L.mbs * dp)} microbatches (GBS/(MBS*DP)), not a multiple of "
                f"PP={L.pp}")
    return None


@rule("moe_tp_needs_sp", level="tp", reads=("tp", "sequence_parallel"),
      why="Megatron-Core requires sequence parallel for MoE with TP > 1")
def _moe_tp_needs_sp(s: Situation) -> str | None:
    return "MoE with TP > 1 needs sequence parallel" if s.model.is_moe and s.layout.tp > 1 and not s.layout.sp else None


@rule("precision_supported", reads=("precision",), why="the GPU has the precision's tensor cores")
def _precision_supported(s: Situation) -> str | None:
    if s.gpu.supports(s.layout.precision):
        return None
    return f"{s.gpu.name} does not support {s.layout.precision} (supported: {', '.join(s.gpu.peak_tflops)})"


@rule("gpu_only_feature", reads=("precision", "dispatcher", "cuda_graphs", "optimizer_offload", "cp", "cp_comm_type",
                                 "ep_overlap", "activation_offload", "expert_stash", "optimizer_states"),
      why="fp8, DeepEP/HybridEP, CUDA graphs, optimizer offload, a2a CP, the EP overlap (CUDA streams), activation "
          "offload (pinned host memory, copy streams), the paged stash (its CUDA kernels) and bf16 moments "
          "(Transformer Engine's FusedAdam) need a GPU (cpu runs gloo)")
def _gpu_only_feature(s: Situation) -> str | None:
    if not s.gpu.is_cpu:
        return None
    L, bad = s.layout, []
    if _is_fp8(L.precision):
        bad.append(L.precision)
    if L.dispatcher in GPU_ONLY_DISPATCHERS:
        bad.append(f"dispatcher {L.dispatcher}")
    if L.cuda_graphs:
        bad.append("CUDA graphs")
    if L.optimizer_offload > 0:
        bad.append("optimizer offload")
    if L.cp > 1 and L.cp_comm_type not in CPU_CP_COMM_TYPES:
        bad.append(f"cp_comm_type {L.cp_comm_type} (the CPU trainer all-gathers K/V)")
    if L.ep_overlap:
        bad.append("the EP overlap (it runs the all-to-all on its own CUDA stream)")
    if L.activation_offload:
        bad.append("activation offload (pinned host memory and CUDA copy streams)")
    if L.expert_stash != "none":
        bad.append("the paged expert stash (CUDA kernels)")
    if L.optimizer_states != "fp32":
        bad.append(f"{L.optimizer_states} optimizer moments (the precision-aware optimizer needs Transformer Engine's "
                   "FusedAdam)")
    return f"not available on cpu: {', '.join(bad)}" if bad else None


@rule("graph_recompute_conflict", reads=("cuda_graphs", "recompute", "optimizer_offload"),
      why="a recompute region lies wholly inside or outside a CUDA-graph scope; full_iteration graphs stand alone")
def _graph_recompute_conflict(s: Situation) -> list[str]:
    L = s.layout
    graphs, mods = set(L.cuda_graphs), set(L.recompute_modules)
    out: list[str] = []
    if not graphs:
        return out
    if "moe" in mods and "moe_router" in graphs:
        out.append("whole-moe recompute conflicts with the moe_router graph scope")
    if L.recompute_granularity == "full" and "full_iteration" not in graphs:
        out.append("full recompute needs full_iteration CUDA graphs")
    if "attn" in graphs and "core_attn" in mods:
        out.append("core_attn recompute splits the attn graph scope")
    if "moe" in graphs and ("moe_act" in mods or "shared_experts" in mods):
        out.append("moe_act/shared_experts recompute splits the moe graph scope")
    if "mlp" in graphs and "moe_act" in mods:
        out.append("moe_act recompute splits the mlp graph scope")
    if "full_iteration" in graphs and len(graphs) > 1:
        out.append("full_iteration graphs cannot be combined with other scopes")
    if L.optimizer_offload > 0 and "full_iteration" in graphs:
        out.append("optimizer CPU offload conflicts with full_iteration graphs")
    return out


# ---- the router's mode, as Megatron-Core 0.19.2 validates it (TransformerConfig.__post_init__) -------------------
@rule("routing_needs_experts", reads=("routing",), why="a dense model has no router: its routing stays dropless")
def _routing_needs_experts(s: Situation) -> str | None:
    if not s.model.is_moe and s.layout.routing != "dropless":
        return f"{s.model.name} has no experts to route: routing {s.layout.routing} needs a MoE model"
    return None


@rule("routing_dispatcher", reads=("routing", "dispatcher"),
      why="capacity routing pads every expert's input to its capacity (moe_pad_expert_input_to_capacity), which "
          "Megatron-Core's flex dispatcher refuses with the DeepEP backend; alltoall, allgather and HybridEP pad")
def _routing_dispatcher(s: Situation) -> str | None:
    L = s.layout
    if s.model.is_moe and BY_NAME["routing"].mode(L.routing) == "capacity" and L.dispatcher == "deepep":
        return f"routing {L.routing} pads expert inputs to capacity, which the DeepEP dispatcher does not support"
    return None


@rule("routing_moe_graph", reads=("routing", "cuda_graphs"),
      why="Megatron-Core captures the moe CUDA-graph scope only with drop-and-pad routing (capacity:F): under "
          "dropless and forced-balance routing the experts' inputs change shape every step")
def _routing_moe_graph(s: Situation) -> str | None:
    L = s.layout
    if s.model.is_moe and "moe" in L.cuda_graphs and BY_NAME["routing"].mode(L.routing) != "capacity":
        return f"the moe CUDA-graph scope needs capacity routing (static expert shapes), not {L.routing}"
    return None


@rule("offload_needs_distopt", reads=("optimizer_offload", "distributed_optimizer"),
      why="Megatron offloads the distributed optimizer's shards only")
def _offload_needs_distopt(s: Situation) -> str | None:
    L = s.layout
    if L.optimizer_offload > 0 and not L.distributed_optimizer:
        return "optimizer CPU offload needs the distributed optimizer"
    return None


# ---- the memory levers, as Megatron-Core 0.19.2 validates them (TransformerConfig.__post_init__, OptimizerConfig)
@rule("activation_offload_modules",
      reads=("activation_offload", "activation_offload_fraction", "recompute", "expert_stash", "cuda_graphs"),
      why="Megatron-Core offloads attn_proj's input only with core_attn's (it is core attention's output, needed by "
          "its backward), nothing inside the routed experts while the whole moe is recomputed (the checkpoint "
          "already drops it), fused_group_mlp not with its parts, no expert module under the paged stash (it holds "
          "those activations) and no offload inside the moe CUDA-graph scope; a fraction needs modules to apply to "
          "and expert modules need experts")
def _activation_offload_modules(s: Situation) -> list[str]:
    L = s.layout
    out: list[str] = []
    mods = set(L.activation_offload)
    if not mods:
        if L.activation_offload_fraction != 1.0:
            out.append("activation_offload_fraction applies to the activation_offload modules: none are set")
        return out
    if "attn_proj" in mods and "core_attn" not in mods:
        out.append("attn_proj cannot be offloaded without core_attn: its input is core attention's output, which "
                   "core attention's backward needs")
    inside = sorted(mods & set(MOE_OFFLOAD_MODULES))
    if inside and not s.model.is_moe:
        out.append(f"{s.model.name} has no routed experts to offload ({', '.join(inside)})")
    if inside and "moe" in L.recompute_modules:
        out.append(f"cannot offload {', '.join(inside)} while the whole moe is recomputed (its checkpoint keeps none)")
    if "fused_group_mlp" in mods and mods & {"expert_fc1", "moe_act"}:
        out.append("fused_group_mlp offloads the whole grouped MLP: not with expert_fc1 or moe_act")
    if inside and L.expert_stash != "none":
        out.append(f"the paged stash holds the routed experts' activations: do not also offload {', '.join(inside)}")
    if "moe" in L.cuda_graphs:
        out.append("Megatron-Core does not offload activations with the moe CUDA-graph scope (token-drop MoE)")
    return out


@rule("expert_stash_needs", reads=("expert_stash", "dispatcher"),
      why="the paged stash needs a per-rank token budget (moe_expert_rank_capacity_factor), which Megatron-Core takes "
          "only from the flex dispatcher's HybridEP backend (among our dispatchers)")
def _expert_stash_needs(s: Situation) -> str | None:
    L = s.layout
    if L.expert_stash == "none":
        return None
    if not s.model.is_moe:
        return f"{s.model.name} has no routed experts to stash"
    if L.dispatcher != "hybridep":
        return f"the paged stash needs the HybridEP dispatcher (a per-rank token budget), not {L.dispatcher}"
    return None


@rule("optimizer_states_needs", reads=("optimizer_states", "distributed_optimizer"),
      why="Megatron-Core's precision-aware optimizer (lower-precision moments) runs only as the distributed optimizer")
def _optimizer_states_needs(s: Situation) -> str | None:
    L = s.layout
    if L.optimizer_states != "fp32" and not L.distributed_optimizer:
        return f"{L.optimizer_states} optimizer moments need the distributed optimizer (precision-aware optimizer)"
    return None


@rule("fp8_param_gather_needs", reads=("fp8_param_gather", "precision", "distributed_optimizer", "optimizer_offload"),
      why="fp8 parameters need an fp8 recipe (TransformerConfig: fp8_param only with fp8) and the distributed "
          "optimizer, which keeps their fp32 master and re-quantises after its step (megatron.training's "
          "validate_args); with optimizer offload only the delayed recipe")
def _fp8_param_gather_needs(s: Situation) -> list[str]:
    L = s.layout
    out: list[str] = []
    if not L.fp8_param_gather:
        return out
    if not _is_fp8(L.precision):
        out.append(f"fp8_param_gather needs an fp8 precision, not {L.precision}")
    if not L.distributed_optimizer:
        out.append("fp8_param_gather needs the distributed optimizer (it keeps the fp32 master of the fp8 weights)")
    if L.optimizer_offload > 0 and L.precision != "fp8-delayed":
        out.append(f"fp8_param_gather with optimizer offload runs only with fp8-delayed, not {L.precision}")
    return out


# ---- the EP all-to-all overlap, as Megatron-Core 0.19.2 validates it (TransformerConfig.__post_init__; Bridge's
# CommOverlapConfig repeats the checks) ----------------------------------------------------------------------------
@rule("ep_overlap_needs", reads=("ep_overlap", "ep", "dispatcher", "recompute", "precision"),
      why="Megatron-Core overlaps the EP all-to-all of one microbatch with another's compute only with EP > 1, the "
          "alltoall or flex dispatcher, no full or whole-moe recompute (the replay would repeat the split "
          "schedule), bf16 parameters and at most one MTP layer")
def _ep_overlap_needs(s: Situation) -> list[str]:
    L = s.layout
    out: list[str] = []
    if not L.ep_overlap:
        return out
    if not s.model.is_moe or L.ep <= 1:
        out.append("the EP overlap needs expert parallelism (a MoE model with EP > 1)")
    if L.dispatcher == "allgather":
        out.append("the EP overlap needs the alltoall or a flex (DeepEP/HybridEP) dispatcher, not allgather")
    if L.recompute_granularity == "full" or "moe" in L.recompute_modules:
        out.append("the EP overlap cannot replay a whole layer or MoE block: no full or moe recompute")
    if L.precision == "fp32":
        out.append("the EP overlap needs bf16 parameters, not fp32")
    if (s.model.mtp_layers or 0) > 1:
        out.append(f"the EP overlap allows at most one MTP layer ({s.model.name} has {s.model.mtp_layers})")
    return out


@rule("ep_overlap_schedule", reads=("ep_overlap", "pp", "vpp", "cuda_graphs"),
      why="the EP overlap splits each layer's forward and backward into a combined 1F1B schedule: Megatron-Core "
          "runs it on an interleaved pipeline only (VPP > 1 when PP > 1) and outside moe/mlp CUDA-graph scopes")
def _ep_overlap_schedule(s: Situation) -> list[str]:
    L = s.layout
    out: list[str] = []
    if not L.ep_overlap:
        return out
    if L.pp > 1 and L.vpp <= 1:
        out.append("the EP overlap needs an interleaved schedule (VPP > 1) when PP > 1")
    if {"moe", "mlp"} & set(L.cuda_graphs):
        out.append("the EP overlap does not run inside moe/mlp CUDA-graph scopes")
    return out


@rule("tp_in_nvlink", level="tp", reads=("tp",), why="TP's per-layer collectives need one NVLink domain")
def _tp_in_nvlink(s: Situation) -> str | None:
    if s.layout.tp > s.gpu.nvlink_domain:
        return f"TP={s.layout.tp} spans more than one NVLink domain ({s.gpu.nvlink_domain} GPUs)"
    return None


@rule("ep_in_nvlink", level="ep", reads=("ep", "etp"),
      why="EP*ETP may span up to 8 NVLink domains (beyond one, the throughput model charges the scale-out "
          "all-to-all); beyond 8 it is refused")
def _ep_in_nvlink(s: Situation) -> str | None:
    L = s.layout
    if s.model.is_moe and L.ep * L.etp > s.gpu.nvlink_domain * 8:
        return f"EP*ETP={L.ep * L.etp} spans more than 8 NVLink domains ({s.gpu.nvlink_domain} GPUs each)"
    return None


# ---- the layer kinds besides full attention, as Megatron-Core 0.19.2 / Transformer Engine support them ------
@rule("linear_heads_cp", level="cp", reads=("tp", "cp"),
      why="gated delta-net (Qwen3-Next) all-to-alls its key and value heads over TP*CP")
def _linear_heads_cp(s: Situation) -> str | None:
    m, L = s.model, s.layout
    if "L" not in m.attention_pattern or L.cp == 1:
        return None
    split = L.tp * L.cp
    if m.linear_num_key_heads % split == 0 and m.linear_num_value_heads % split == 0:
        return None
    return (f"gated delta-net all-to-alls its heads over CP: {m.linear_num_key_heads} key / "
            f"{m.linear_num_value_heads} value heads do not divide by TP*CP = {split}")


@rule("linear_fp8_align", reads=("precision",),
      why="fp8 GEMMs need the gated delta-net input projection width a multiple of 16 (mxfp8: 32)")
def _linear_fp8_align(s: Situation) -> str | None:
    m, precision = s.model, s.layout.precision
    if "L" not in m.attention_pattern or not _is_fp8(precision):
        return None
    width = 2 * m.linear_key_head_dim * m.linear_num_key_heads + 2 * (
        m.linear_value_head_dim + 1) * m.linear_num_value_heads
    align = 32 if precision == "mxfp8" else 16
    return None if width % align == 0 else (
        f"{precision} needs the gated delta-net input projection width ({width}) divisible by {align}")


@rule("expert_bias_etp", level="ep", reads=("etp",),
      why="Megatron-Core supports expert biases (gpt-oss) only with ETP = 1")
def _expert_bias_etp(s: Situation) -> str | None:
    if s.model.is_moe and s.model.linear_bias and s.layout.etp != 1:
        return f"Megatron-Core supports expert biases only with ETP = 1, not {s.layout.etp}"
    return None


@rule("cp_window_sinks", reads=("cp", "cp_comm_type"),
      why="Transformer Engine's CP runs sliding windows with allgather or a2a, attention sinks with a2a only "
          "(on cpu the trainer's own CP attention all-gathers K/V and handles both)")
def _cp_window_sinks(s: Situation) -> str | None:
    m, L = s.model, s.layout
    if L.cp == 1 or s.gpu.is_cpu:
        return None
    if m.attention_sinks:
        return None if L.cp_comm_type == "a2a" else (
            f"Transformer Engine runs attention sinks under CP with cp_comm_type a2a only, not {L.cp_comm_type}")
    if "S" in m.attention_pattern and L.cp_comm_type not in ("allgather", "a2a"):
        return ("Transformer Engine runs sliding-window attention under CP with cp_comm_type allgather or a2a only, "
                f"not {L.cp_comm_type}")
    return None


# Transformer Engine @d0067d0 (tests/pytorch/attention/test_attention_with_cp.py): "D=256 CP fused attention is only
# enabled on Blackwell server GPUs ... covered for p2p and all_gather only", and FlashAttention 4 is disabled under
# CP ("does not support context parallelism yet", dot_product_attention/utils.py), so on Blackwell 256-wide heads
# (Qwen3-Next's full attention) run under CP through those two types alone. MLA's unequal Q/K and V widths need no
# rule: the same tests run them with every type on FusedAttention (only the FlashAttention path is "KV P2P" only,
# and TE falls back to FusedAttention there).
CP_WIDE_HEAD_TYPES = ("p2p", "allgather")


@rule("cp_wide_heads", reads=("cp", "cp_comm_type"),
      why="Transformer Engine runs 256-wide attention heads under CP on Blackwell with p2p or allgather only "
          "(fused attention; FlashAttention 4 has no CP)")
def _cp_wide_heads(s: Situation) -> str | None:
    m, L = s.model, s.layout
    if L.cp == 1 or s.gpu.family != "blackwell" or m.is_mla or m.head_dim < 256 or \
            set(m.attention_kinds()) <= {"linear"}:
        return None
    if L.cp_comm_type in CP_WIDE_HEAD_TYPES:
        return None
    return (f"Transformer Engine runs {m.head_dim}-wide heads under CP on {s.gpu.name} with cp_comm_type "
            f"{' or '.join(CP_WIDE_HEAD_TYPES)} only, not {L.cp_comm_type}")


@rule("hierarchical_cp", reads=("hierarchical_cp", "cp_comm_type", "cp", "tp"),
      why="a2a+p2p needs the CP sizes per level (a2a, p2p): product CP, the a2a level splits heads; no hierarchy "
          "otherwise (declared last: the space expands it per grid, see space._FeatureTable)")
def _hierarchical_cp(s: Situation) -> str | None:
    return hierarchical_cp_violation(s.model, s.layout)


RULES: tuple[str, ...] = tuple(r.name for r in REGISTRY)


def a2a_heads_divide(model: ModelSpec, tp: int, size: int) -> bool:
    """Transformer Engine's a2a splits the heads of Q and of K/V of each TP rank over `size` ranks (MLA expands
    K/V to one per head)."""
    heads = model.num_attention_heads // max(tp, 1)
    kv_heads = heads if model.is_mla else model.num_kv_heads // max(tp, 1)
    return heads % size == 0 and kv_heads % size == 0


def hierarchical_cp_violation(model: ModelSpec, L: Layout) -> str | None:
    """Megatron's hierarchical_context_parallel_sizes: [a2a size, p2p size] for cp_comm_type a2a+p2p (their
    product is CP, the a2a level splits heads), and nothing for the other types."""
    sizes = L.hierarchical_cp
    if L.cp_comm_type != "a2a+p2p" or L.cp == 1:
        return None if not sizes else (f"hierarchical_cp {','.join(map(str, sizes))} is only used by "
                                       f"cp_comm_type a2a+p2p with CP > 1")
    if len(sizes) != 2:
        return f"cp_comm_type a2a+p2p needs hierarchical_cp A,P (a2a size, p2p size; A*P = CP={L.cp})"
    if sizes[0] * sizes[1] != L.cp:
        return f"hierarchical_cp {sizes[0]}*{sizes[1]} is not CP={L.cp}"
    if not a2a_heads_divide(model, L.tp, sizes[0]):
        return (f"the a2a level of hierarchical_cp ({sizes[0]}) must divide the heads "
                f"({model.num_attention_heads // L.tp}) and KV heads per TP rank")
    return None
