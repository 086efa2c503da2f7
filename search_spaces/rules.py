"""Legality rules: each has a name and says why, in words, a layout cannot run.

`check()` returns every violation (an empty list = legal). `RULES` lists the names in the order they are
tested, so a space enumeration can count rejections per rule. Cheap rules come first.
"""

from __future__ import annotations

from dataclasses import dataclass

from search_spaces.hardware import GPUSpec
from search_spaces.models import ModelSpec
from search_spaces.layout import Layout
from search_spaces.pipeline import placement

# Features that need a GPU (CUDA kernels, NVSHMEM, host pinned-memory offload). On `cpu` the trainer runs gloo
# and implements context parallelism by all-gathering K/V, whatever cp_comm_type says; p2p (the default) and
# allgather are accepted, a2a variants are not (they need head-sharded attention kernels).
GPU_ONLY_DISPATCHERS = ("deepep", "hybridep")
CPU_CP_COMM_TYPES = ("p2p", "allgather")


@dataclass(frozen=True)
class Violation:
    rule: str
    reason: str

    def to_dict(self) -> dict:
        return {"rule": self.rule, "reason": self.reason}


RULES = (
    "world_dense",        # world = TP*CP*PP*DP
    "world_expert",       # world = ETP*EP*EDP*PP (parallel folding)
    "pipeline_split",     # the model's pieces cover PP*VPP stages
    "vpp_needs_pp",       # interleaving needs PP > 1
    "heads_tp",           # attention heads and KV groups divide by TP
    "experts_ep",         # routed experts divide by EP
    "expert_ffn_etp",     # expert FFN width divides by ETP
    "dense_model_ep",     # a dense model has EP = ETP = 1
    "sequence_cp",        # seq_len divides by 2*CP (*TP with sequence parallel)
    "cp_a2a_heads",       # a2a CP splits heads: heads % CP == 0
    "global_batch",       # GBS divides by MBS*DP
    "moe_tp_needs_sp",    # MoE with TP > 1 needs sequence parallel
    "precision_supported",
    "gpu_only_feature",   # cpu: no fp8, DeepEP/HybridEP, CUDA graphs, optimizer offload, a2a CP
    "graph_recompute_conflict",
    "offload_needs_distopt",
    "tp_in_nvlink",       # TP inside one NVLink domain
    "ep_in_nvlink",       # EP*ETP within 8 NVLink domains; beyond one domain the throughput model charges the
                          # scale-out share of the all-to-all (the soft penalty), beyond 8 it is refused
    # the layer kinds besides full attention, as Megatron-Core 0.19.2 / Transformer Engine support them
    "linear_heads_cp",    # gated delta-net splits its key and value heads over TP*CP
    "linear_fp8_align",   # fp8: the gated delta-net input projection width is a multiple of 16 (mxfp8: 32)
    "expert_bias_etp",    # MoE with linear biases (gpt-oss) needs ETP = 1
    "cp_window_sinks",    # TE's CP: sliding windows need cp_comm_type allgather or a2a, attention sinks a2a
    "hierarchical_cp",    # a2a+p2p needs the CP sizes per level (a2a, p2p): product CP, a2a level splits heads;
                          # no hierarchy otherwise (last: the space expands it per grid, see space._FeatureTable)
)


def _ok(cond: bool, rule: str, reason: str, out: list[Violation]) -> None:
    if not cond:
        out.append(Violation(rule, reason))


def check(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout) -> list[Violation]:
    """Every rule the layout breaks for this model, GPU, world size and sequence length."""
    v: list[Violation] = []
    L = layout
    _ok(L.dp(num_gpus) > 0, "world_dense",
        f"{num_gpus} GPUs is not a multiple of TP*CP*PP = {L.tp}*{L.cp}*{L.pp} = {L.tp * L.cp * L.pp}", v)
    _ok(L.edp(num_gpus) > 0, "world_expert",
        f"{num_gpus} GPUs is not a multiple of ETP*EP*PP = {L.etp}*{L.ep}*{L.pp} = {L.etp * L.ep * L.pp}", v)
    _ok(placement(model, L.pp, L.vpp) is not None, "pipeline_split",
        f"{model.num_layers} layers (+{model.mtp_layers} MTP, embedding, loss) cannot fill "
        f"PP*VPP = {L.pp * L.vpp} stages", v)
    _ok(L.vpp == 1 or L.pp > 1, "vpp_needs_pp", f"VPP={L.vpp} needs PP > 1", v)
    heads_ok = model.num_attention_heads % L.tp == 0 and (model.is_mla or model.num_kv_heads % L.tp == 0)
    if "L" in model.attention_pattern:
        heads_ok = heads_ok and model.linear_num_key_heads % L.tp == 0 and model.linear_num_value_heads % L.tp == 0
    _ok(heads_ok, "heads_tp", f"{model.num_attention_heads} heads / {model.num_kv_heads} KV groups "
        f"do not divide by TP={L.tp}", v)
    if model.is_moe:
        _ok(model.num_experts % L.ep == 0, "experts_ep",
            f"{model.num_experts} experts do not divide by EP={L.ep}", v)
        _ok(model.moe_ffn_hidden_size % L.etp == 0, "expert_ffn_etp",
            f"expert FFN width {model.moe_ffn_hidden_size} does not divide by ETP={L.etp}", v)
    else:
        _ok(L.ep == 1 and L.etp == 1, "dense_model_ep", f"{model.name} has no experts: EP and ETP must be 1", v)
    div = 2 * L.cp * (L.tp if L.sp else 1) if L.cp > 1 else (L.tp if L.sp else 1)
    _ok(seq_len % div == 0, "sequence_cp",
        f"seq_len {seq_len} does not divide by {'2*CP' if L.cp > 1 else ''}{'*TP' if L.sp and L.cp > 1 else ''}"
        f"{'TP' if L.sp and L.cp == 1 else ''} = {div}", v)
    if L.cp > 1 and L.cp_comm_type == "a2a":
        _ok(a2a_heads_divide(model, L.tp, L.cp), "cp_a2a_heads", f"a2a context parallel needs heads "
            f"({model.num_attention_heads // L.tp}) and KV heads per TP rank divisible by CP={L.cp}", v)
    dp = L.dp(num_gpus)
    if dp:
        _ok(L.gbs % (L.mbs * dp) == 0, "global_batch",
            f"GBS={L.gbs} is not a multiple of MBS*DP = {L.mbs}*{dp} = {L.mbs * dp}", v)
    _ok(not (model.is_moe and L.tp > 1 and not L.sp), "moe_tp_needs_sp",
        "MoE with TP > 1 needs sequence parallel", v)
    _ok(gpu.supports(L.precision), "precision_supported",
        f"{gpu.name} does not support {L.precision} (supported: {', '.join(gpu.peak_tflops)})", v)
    if gpu.is_cpu:
        bad = []
        if L.precision.startswith("fp8") or L.precision == "mxfp8":
            bad.append(L.precision)
        if L.dispatcher in GPU_ONLY_DISPATCHERS:
            bad.append(f"dispatcher {L.dispatcher}")
        if L.cuda_graphs:
            bad.append("CUDA graphs")
        if L.optimizer_offload > 0:
            bad.append("optimizer offload")
        if L.cp > 1 and L.cp_comm_type not in CPU_CP_COMM_TYPES:
            bad.append(f"cp_comm_type {L.cp_comm_type} (the CPU trainer all-gathers K/V)")
        _ok(not bad, "gpu_only_feature", f"not available on cpu: {', '.join(bad)}", v)
    _graph_conflicts(L, v)
    _layer_kind_rules(model, gpu, L, v)
    _ok(L.optimizer_offload == 0 or L.distributed_optimizer, "offload_needs_distopt",
        "optimizer CPU offload needs the distributed optimizer", v)
    _ok(L.tp <= gpu.nvlink_domain, "tp_in_nvlink",
        f"TP={L.tp} spans more than one NVLink domain ({gpu.nvlink_domain} GPUs)", v)
    _ok(L.ep * L.etp <= gpu.nvlink_domain * 8 if model.is_moe else True, "ep_in_nvlink",
        f"EP*ETP={L.ep * L.etp} spans more than 8 NVLink domains ({gpu.nvlink_domain} GPUs each)", v)
    reason = hierarchical_cp_violation(model, L)
    _ok(reason is None, "hierarchical_cp", reason or "", v)
    return v


def _layer_kind_rules(model: ModelSpec, gpu: GPUSpec, L: Layout, v: list[Violation]) -> None:
    """What Megatron-Core 0.19.2 (TransformerConfig, GatedDeltaNet, MoE) and Transformer Engine refuse for
    gated delta-net layers (Qwen3-Next), sliding windows, attention sinks and linear biases (gpt-oss)."""
    if "L" in model.attention_pattern:
        if L.cp > 1:
            split = L.tp * L.cp
            _ok(model.linear_num_key_heads % split == 0 and model.linear_num_value_heads % split == 0,
                "linear_heads_cp", f"gated delta-net all-to-alls its heads over CP: {model.linear_num_key_heads} "
                f"key / {model.linear_num_value_heads} value heads do not divide by TP*CP = {split}", v)
        if L.precision.startswith("fp8") or L.precision == "mxfp8":
            width = 2 * model.linear_key_head_dim * model.linear_num_key_heads + 2 * (
                model.linear_value_head_dim + 1) * model.linear_num_value_heads
            align = 32 if L.precision == "mxfp8" else 16
            _ok(width % align == 0, "linear_fp8_align",
                f"{L.precision} needs the gated delta-net input projection width ({width}) divisible by {align}", v)
    if model.is_moe and model.linear_bias:
        _ok(L.etp == 1, "expert_bias_etp", f"Megatron-Core supports expert biases only with ETP = 1, not {L.etp}", v)
    # On cpu the trainer's own CP attention handles windows and sinks (it all-gathers K/V): TE's limits only.
    if L.cp > 1 and not gpu.is_cpu:
        if model.attention_sinks:
            _ok(L.cp_comm_type == "a2a", "cp_window_sinks",
                f"Transformer Engine runs attention sinks under CP with cp_comm_type a2a only, not {L.cp_comm_type}", v)
        elif "S" in model.attention_pattern:
            _ok(L.cp_comm_type in ("allgather", "a2a"), "cp_window_sinks", "Transformer Engine runs sliding-window "
                f"attention under CP with cp_comm_type allgather or a2a only, not {L.cp_comm_type}", v)


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


def _graph_conflicts(L: Layout, v: list[Violation]) -> None:
    graphs = set(L.cuda_graphs)
    if not graphs:
        return
    mods = set(L.recompute_modules)
    if "moe" in mods and "moe_router" in graphs:
        v.append(Violation("graph_recompute_conflict", "whole-moe recompute conflicts with the moe_router graph scope"))
    if L.recompute_granularity == "full" and "full_iteration" not in graphs:
        v.append(Violation("graph_recompute_conflict", "full recompute needs full_iteration CUDA graphs"))
    # a recompute region must lie wholly inside or outside a graph scope
    if "attn" in graphs and "core_attn" in mods:
        v.append(Violation("graph_recompute_conflict", "core_attn recompute splits the attn graph scope"))
    if "moe" in graphs and ("moe_act" in mods or "shared_experts" in mods):
        v.append(Violation("graph_recompute_conflict", "moe_act/shared_experts recompute splits the moe graph scope"))
    if "mlp" in graphs and "moe_act" in mods:
        v.append(Violation("graph_recompute_conflict", "moe_act recompute splits the mlp graph scope"))
    if "full_iteration" in graphs and len(graphs) > 1:
        v.append(Violation("graph_recompute_conflict", "full_iteration graphs cannot be combined with other scopes"))
    if L.optimizer_offload > 0 and "full_iteration" in graphs:
        v.append(Violation("graph_recompute_conflict", "optimizer CPU offload conflicts with full_iteration graphs"))


def is_legal(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout) -> bool:
    return not check(model, gpu, num_gpus, seq_len, layout)
