"""Memory terms of the memory levers (issue 29): fine-grained activation offload, the paged expert stash and the
optimizer moments' precision; and the host's pinned-memory budget they draw on.

- Activation offload (Megatron-Core 0.19.2's fine_grained_activation_offloading, `offload_modules`): each named
  module's *input* is copied to pinned host memory in the forward once the module has run and copied back before
  its backward. What one layer's offload removes from one microbatch's saved activations, by memory.py's terms:
  attn_norm / mlp_norm: the residual stream each norm keeps (`residual`, half each); qkv_linear: the attention
  norm's output the QKV (MLA: down) projection keeps (half of `layernorm`); core_attn: the q, k, v core attention
  keeps (`attention`; MLA: `mla_up_proj`); attn_proj: the attention output the out projection keeps
  (`attention`); expert_fc1: the routed tokens' expert input, moe_act: the fc1 output the activation keeps (both
  `moe`); fused_group_mlp: both and the activation output (`moe`, `moe_act`). A term recompute already freed has
  nothing left to offload (the removal is capped at what stays saved); `activation_offload_fraction` of the
  offload groups is offloaded. Gated delta-net layers have no core attention to offload. Every microbatch in
  flight on a rank holds its offloaded inputs on the host; the GPU keeps `RESIDENT_LAYERS` layers' worth in
  transit (the one whose copy-out is draining in the forward, the one prefetched back in the backward).
  Megatron offloads only tensors of at least min_offloaded_tensor_size (1M elements): at the lengths and widths
  of the catalog's models every one of these is larger, so the threshold is not modelled.
- Paged stash (moe_paged_stash): the routed experts' activations (`moe`, `moe_act`) go to one page pool per rank
  that every MoE layer and microbatch in flight takes pages of, sized for the *average* tokens per rank times
  moe_paged_stash_buffer_size_factor_cuda (`STASH_CUDA_FACTOR`, Megatron's default, which the exports write). The
  busiest EP rank differs from layer to layer, so a pool over all of them holds their sum -- the average load --
  where a buffer per layer sized for its own busiest rank (memory.py's dropless `expert_load`) holds the worst
  case of each. The per-rank budget F of `paged:F` (moe_expert_rank_capacity_factor) bounds the rank's tokens
  (HybridEP drops the rest); no host spill buffer (moe_paged_stash_buffer_size_factor_cpu 0, the exports write it).
- Optimizer moments in bf16 (use_precision_aware_optimizer with exp_avg/exp_avg_sq bf16): 2 + 2 B per parameter
  in place of 4 + 4; with bf16 weights (and fp8-delayed) Megatron then keeps the fp32 master copy as the 16-bit
  remainder beside the bf16 weight (store_param_remainders, on by default; distrib_optimizer.py), 2 B in place
  of 4; the other fp8 recipes keep Transformer Engine's fp32 master (4 B).
- Pinned host memory: what the optimizer offload and the activation offload keep on the host, per GPU, times the
  GPUs of a node, against the node's pinned budget (`HOST_NODES`: x86 DGX hosts vs Grace trays).

The time of the copies is not modelled here yet (they run on their own streams, overlapped with the layer's
compute where the host link keeps up): see the module's issue. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.breakdown import GIB
from search_spaces.cost.routing import expert_load
from search_spaces.layouts.layout import BY_NAME, Layout

RESIDENT_LAYERS = 2  # offloaded layers' inputs on the GPU in transit: one copying out, one prefetched back
# the pool's size over the average tokens (moe_paged_stash_buffer_size_factor_cuda, Megatron's default), as the
# exports write it
STASH_CUDA_FACTOR = BY_NAME["expert_stash"].megatron_extra["paged"]["moe_paged_stash_buffer_size_factor_cuda"]
STASH_TERMS = ("moe", "moe_act")  # memory.py's routed-expert terms the stash holds


@dataclass(frozen=True)
class HostNode:
    """The host memory beside one node's GPUs."""
    gpus: int
    memory_gb: float  # GB (1e9 B) of host memory per node
    source: str


# Pinned host memory a node can give to offloaded tensors: half its memory (the rest for the OS, the data loaders,
# the page cache and checkpoint staging; pinned pages cannot be swapped).
PINNED_FRACTION = 0.5
HOST_NODES = {
    "h100": HostNode(8, 2000, "DGX H100 datasheet: 2 TB system memory, 2x Xeon 8480C (PCIe Gen5 to each GPU)"),
    "h200": HostNode(8, 2000, "DGX H200 datasheet: 2 TB system memory"),
    "b200": HostNode(8, 2000, "DGX B200 datasheet: 2 TB system memory (configurable to 4 TB)"),
    "b300": HostNode(8, 2000, "DGX B300 datasheet: 2 TB system memory"),
    # a compute tray: 2 Grace CPUs with 480 GB LPDDR5X each beside 4 GPUs (NVLink-C2C)
    "gb200": HostNode(4, 960, "GB200 NVL72 datasheet: up to 17 TB LPDDR5X over 36 Grace CPUs (480 GB each), "
                              "2 Grace + 4 GPUs per compute tray"),
    "gb300": HostNode(4, 960, "GB300 NVL72: 2 Grace (480 GB LPDDR5X each) + 4 GPUs per compute tray"),
}


def pinned_budget_bytes(gpu: GPUSpec) -> float | None:
    """Pinned host bytes per GPU the node can give (None: no host budget declared, e.g. cpu)."""
    node = HOST_NODES.get(gpu.name)
    return None if node is None else node.memory_gb * 1e9 * PINNED_FRACTION / node.gpus


def host_refusal(gpu: GPUSpec, host_bytes_per_gpu: float) -> str | None:
    """Why a layout's host-resident bytes do not fit the node's pinned memory, or None."""
    budget = pinned_budget_bytes(gpu)
    if budget is None or host_bytes_per_gpu <= budget:
        return None
    node = HOST_NODES[gpu.name]
    return (f"pinned host memory: {host_bytes_per_gpu * node.gpus / GIB:.0f} GiB per node of {node.gpus} "
            f"{gpu.name} GPUs (offloaded optimizer states and activations) exceeds the {PINNED_FRACTION:.0%} of "
            f"{node.memory_gb:.0f} GB host memory pinnable ({node.source})")


# ---- activation offload and the paged stash, per layer and microbatch -------------------------------------------
def _module_inputs(model: ModelSpec, layout: Layout, seq_len: int, kind: str, is_moe: bool,
                   e: int, g: int) -> dict[str, tuple[str, float]]:
    """Offload module -> (memory.py's term it comes out of, bytes of its input for one microbatch)."""
    h, tp = model.hidden_size, layout.tp
    t = layout.mbs * seq_len / layout.cp
    tsp = t / tp if layout.sp else t
    n = model.num_attention_heads
    out: dict[str, tuple[str, float]] = {
        "attn_norm": ("residual", tsp * h * e), "mlp_norm": ("residual", tsp * h * e),
        "qkv_linear": ("layernorm", tsp * h * g)}
    if kind != "linear":
        if model.is_mla:
            out["core_attn"] = ("mla_up_proj", (t / tp) * n * (2 * model.q_head_dim + model.v_head_dim) * e)
            out["attn_proj"] = ("attention", (t / tp) * n * model.v_head_dim * g)
        else:
            d, kv = model.head_dim, model.num_kv_heads
            out["core_attn"] = ("attention", (t / tp) * (n + 2 * kv) * d * e)
            out["attn_proj"] = ("attention", (t / tp) * n * d * g)
    if is_moe:
        f = model.moe_ffn_hidden_size / layout.etp
        routed = tsp * model.topk * layout.etp * expert_load(model, layout, tsp, cpu=False)
        out["expert_fc1"] = ("moe", routed * h * g)
        out["moe_act"] = ("moe", routed * 2 * f * e)
    return out


def offloaded_terms(model: ModelSpec, layout: Layout, seq_len: int, kind: str, is_moe: bool,
                    saved: dict[str, float], e: int, g: int) -> dict[str, float]:
    """memory.py term -> bytes one layer's activation offload moves to the host for one microbatch (capped at
    what stays saved after recompute; times activation_offload_fraction)."""
    if not layout.activation_offload:
        return {}
    inputs = _module_inputs(model, layout, seq_len, kind, is_moe, e, g)
    moved: dict[str, float] = {}
    for module in layout.activation_offload:
        if module == "fused_group_mlp":
            parts = [(term, saved.get(term, 0.0)) for term in STASH_TERMS] if is_moe else []
        elif module in inputs:
            parts = [inputs[module]]
        else:
            parts = []
        for term, amount in parts:
            moved[term] = moved.get(term, 0.0) + amount
    fraction = layout.activation_offload_fraction
    return {term: min(amount, saved.get(term, 0.0)) * fraction for term, amount in moved.items()
            if saved.get(term, 0.0) > 0}


def with_levers(model: ModelSpec, layout: Layout, seq_len: int, kind: str, is_moe: bool,
                saved: dict[str, float], e: int, g: int) -> tuple[dict[str, float], float]:
    """(one layer's saved terms on the GPU with the paged stash and the activation offload, the bytes offloaded
    to the host) for one microbatch."""
    if layout.expert_stash != "none" and is_moe:
        t = layout.mbs * seq_len / layout.cp
        tsp = t / layout.tp if layout.sp else t
        # memory.py sized the terms for the busiest rank's copies without the stash's budget
        scale = STASH_CUDA_FACTOR / expert_load(model, layout.replace(expert_stash="none"), tsp, cpu=False)
        saved = {k: v * scale if k in STASH_TERMS else v for k, v in saved.items()}
    moved = offloaded_terms(model, layout, seq_len, kind, is_moe, saved, e, g)
    if not moved:
        return saved, 0.0
    return {k: v - moved.get(k, 0.0) for k, v in saved.items()}, sum(moved.values())


# ---- the optimizer moments ----------------------------------------------------------------------------------
def moment_bytes_per_param(layout: Layout) -> int:
    """Adam's two moments per parameter: 4 + 4 B, or 2 + 2 B in bf16 (what optimizer offload moves to the host)."""
    return 8 if layout.optimizer_states == "fp32" else 4


def optimizer_bytes_per_param(layout: Layout, weight_bytes: int) -> int:
    """Adam's states per parameter: the moments (4 + 4 B, or 2 + 2 B in bf16) and the fp32 master copy when the
    weights are not fp32 (4 B, or its 16-bit remainder beside bf16 weights under the precision-aware optimizer)."""
    if layout.optimizer_states == "fp32":
        return moment_bytes_per_param(layout) + (0 if weight_bytes == 4 else 4)
    remainder = layout.precision in ("bf16", "fp8-delayed")
    return moment_bytes_per_param(layout) + (0 if weight_bytes == 4 else 2 if remainder else 4)
