"""Host launch overhead on GPUs: kernels per layer and per expert, what each CUDA-graph scope removes, and the
part of the host's time the GPU cannot hide.

Why it is first-order on MoE (NVIDIA/Megatron-LM docs/discussions/deepseek-v3-gb200-optimization, @1d9edcf8):
"the biggest performance issue is that there are large gaps between kernels, and the CPU kernel launch speed
cannot keep up"; FP8 and fine-grained MoE "introduce more quantization, router and other kernels"; dropless MoE
keeps "the device-host sync ... to get the tokens per expert" in every MoE layer, so the host cannot run ahead of
the GPU across it; CUDA graphs "bypass repeated work on the CPU side" for the static parts (attention, router,
EP preprocess, shared experts), the routed experts stay eager.

Per layer and microbatch, with h the host's launch time and g the GPU's busy time of a part, and
excess(h, g) = (h^P + g^P)^(1/P) - g the time h adds to g -- max(0, h - g) smoothed, because a part is not uniform:
bursts of small kernels (router, quantisation) drain the GPU's queue even where the host's total is below the GPU's:
  forward of an MoE layer  exposed = sync + max(excess(h_post, g_post), excess(h_fwd, g_fwd))
                           (post = dispatch + experts + combine, launched after the sync, nothing queued ahead)
  forward of a dense layer and every backward   exposed = excess(h, g)   (the host runs ahead of the GPU)
  full_iteration graphs: one launch per step, no host work, no sync (Megatron-Bridge runs them sync-free).
h = kernels x `host_kernel_launch_s`; a captured scope's kernels become one graph launch, and each replay copies
its inputs and outputs into the graph's static buffers (the same blog, 2.3: "static memory buffers for input and
output data") -- why a graph can cost a little where the host was already hidden (Megatron-Bridge's cuda-graphs
card: Qwen3-30B-A3B, H100, alltoall, 42.00 s with graphs against 41.36 s eager).
Recompute re-launches the kernels of what it repeats (and a recomputed MoE layer syncs again) in the backward.
Pure functions of (model, layout, GPU busy times); `layer_host_time` is called by
gpu_terms.GpuTerms.launch_overhead_time.
"""

from __future__ import annotations

from typing import NamedTuple

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.memo import Memo, fields
from search_spaces.layouts.layout import Layout

# ---- kernels per layer and microbatch, forward (each an assumption from the module structure unless noted) -----
# GQA attention as Megatron-Core + TE run it: input norm, QKV GEMM, q/k norms, RoPE on q and k, core attention,
# output GEMM, bias-dropout-add
ATTENTION_KERNELS = 10
# MLA: norm, q down / norm / up, kv down / norm / up, the q/k splits and concats, RoPE twice, core attention,
# output GEMM, bias-dropout-add
MLA_ATTENTION_KERNELS = 16
# gated delta-net: norm, in-projection GEMM, causal conv, l2 norms, gate math, the FLA chunk kernels (cumsum, kkt,
# solve_tril, w/u, state pass, output), gated norm, output GEMM, add (FLA's chunk_gated_delta_rule_fwd)
LINEAR_ATTENTION_KERNELS = 18
# router with Megatron-Core's router fusion: 31 kernels (the blog, 2.1.4: "from 72 to 31", TE PR 1883); its
# alltoall preprocess (token counts, permutation map, count exchange) about 15 more; DeepEP/HybridEP fuse the
# preprocess: "the number of kernels in the router and preprocess parts to 17" (the blog, 2.2.1)
ROUTER_KERNELS = 31
PREPROCESS_KERNELS = {"alltoall": 15, "allgather": 15, "deepep": 0, "hybridep": 0}
FLEX_ROUTER_AND_PREPROCESS_KERNELS = 17
# dispatch + combine: alltoall = global permute, all-to-all, local permute (sort by expert) and back; the flex
# dispatchers fuse the global permute into their kernel ("does not need explicit global permute", 2.2.1)
DISPATCH_COMBINE_KERNELS = {"alltoall": 10, "allgather": 10, "deepep": 4, "hybridep": 4}
# routed experts: TE's grouped GEMM is "multi-stream + cuBLAS" (the blog, 1.3): fc1 and fc2 per local expert,
# plus the activation and the probability scaling over all copies
GEMMS_PER_EXPERT = 2
EXPERT_ELEMENTWISE_KERNELS = 3
# a dense MLP (dense layers, shared experts): norm (dense only), fc1, activation, fc2, add
MLP_KERNELS = 5
# quantisation kernels per GEMM input under each fp8 recipe: current scaling computes the amax, the scale from it
# and then casts (Transformer Engine's Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax,
# nvte_compute_scale_from_amax, nvte_quantize_v2); delayed and blockwise cast in one; MXFP8 casts and swizzles the
# scaling factors ("kernels that swizzle the MXFP8 scaling factors", the blog, 2.1.2-2.1.3)
QUANTISE_KERNELS = {"fp8-tensorwise": 3, "fp8-delayed": 1, "fp8-blockwise": 1, "mxfp8": 2}
# the routed experts' inputs: one quantising kernel per expert split whatever the recipe (TE's split quantize; the
# amax of current scaling assumed fused into it: the published per-tensor-vs-MXFP8 pairs differ by a few per cent,
# knob_effects.csv), and MXFP8's scale swizzles "fused ... of multiple input tensors into a single kernel" (the
# blog, 2.1.3): one more per GEMM
EXPERT_QUANTISE_KERNELS = {"fp8-tensorwise": 1, "fp8-delayed": 1, "fp8-blockwise": 1, "mxfp8": 1}
GROUPED_QUANTISE_KERNELS = {"mxfp8": 1}
# autograd runs a data-gradient and a weight-gradient GEMM per forward GEMM and a backward per element-wise op
BACKWARD_KERNEL_FACTOR = 2.0
# a captured scope: one graph launch forward, one backward
GRAPH_LAUNCHES = 1
# the norm that smooths max(h, g) (assumed: 3 keeps a host at half the GPU's time 4% exposed, at the GPU's 26%)
P = 4.0
# which scope captures which part (the blog, 2.3: moe_router "also capture shared experts unless the shared
# experts overlap is enabled"); the routed experts are captured only by `moe` (token-drop MoE)
SCOPE_PARTS = {"attn": ("attention",), "mlp": ("mlp",), "moe_router": ("router", "shared"),
               "moe_preprocess": ("preprocess",), "moe": ("router", "preprocess", "dispatch", "experts", "shared")}


# the layout fields a layer's launches read (layer_launches; memoised on them: search_spaces/cost/memo.py)
LAUNCH_FIELDS = ("precision", "dispatcher", "ep", "cuda_graphs", "recompute")
_launch_fields = fields(*LAUNCH_FIELDS)
_LAUNCHES = Memo("layer launches")


class LayerBusy(NamedTuple):
    """GPU seconds of one layer for one microbatch on the rank: forward, backward, and (MoE layers) the forward
    part after the sync (dispatch, experts, combine)."""
    fwd: float
    bwd: float
    post_sync_fwd: float = 0.0


def _gemm_kernels(layout: Layout, gemms: float) -> float:
    return gemms * (1 + QUANTISE_KERNELS.get(layout.precision, 0))


def layer_kernels(model: ModelSpec, layout: Layout, index: int) -> dict[str, float]:
    """Forward kernels of decoder layer `index` per microbatch, by part (the SCOPE_PARTS names)."""
    kind = model.attention_kind(index)
    if kind == "linear":
        attention = LINEAR_ATTENTION_KERNELS + _gemm_kernels(layout, 2) - 2
    else:
        base, gemms = (MLA_ATTENTION_KERNELS, 6) if model.is_mla else (ATTENTION_KERNELS, 2)
        attention = base + _gemm_kernels(layout, gemms) - gemms
    parts = {"attention": attention}
    mlp = MLP_KERNELS + _gemm_kernels(layout, 2) - 2
    if not model.layer_is_moe(index):
        parts["mlp"] = mlp
        return parts
    flex = layout.dispatcher in ("deepep", "hybridep")
    parts["router"] = FLEX_ROUTER_AND_PREPROCESS_KERNELS if flex else ROUTER_KERNELS
    parts["preprocess"] = PREPROCESS_KERNELS[layout.dispatcher]
    parts["dispatch"] = DISPATCH_COMBINE_KERNELS[layout.dispatcher]
    local = model.num_experts / layout.ep
    per_expert = GEMMS_PER_EXPERT * (1 + EXPERT_QUANTISE_KERNELS.get(layout.precision, 0))
    parts["experts"] = local * per_expert + GEMMS_PER_EXPERT * GROUPED_QUANTISE_KERNELS.get(layout.precision, 0) \
        + EXPERT_ELEMENTWISE_KERNELS
    if model.shared_expert_ffn_hidden_size:
        parts["shared"] = mlp - 1
    return parts


def _captured(layout: Layout) -> set[str]:
    return {part for scope in layout.cuda_graphs for part in SCOPE_PARTS.get(scope, ())}


def _recomputed_parts(layout: Layout) -> set[str]:
    """The parts whose forward the recompute choice repeats in the backward."""
    if layout.recompute_granularity == "full":
        return {"attention", "mlp", "router", "preprocess", "dispatch", "experts", "shared"}
    mods = set(layout.recompute_modules)
    out = set()
    if mods & {"core_attn", "mla_up_proj", "layernorm"}:
        out.add("attention")
    if "mlp" in mods:
        out.add("mlp")
    if "moe" in mods:
        out |= {"router", "preprocess", "dispatch", "experts", "shared"}
    if "shared_experts" in mods:
        out.add("shared")
    return out


def excess(host: float, gpu: float) -> float:
    """Seconds a host time `host` adds to a GPU time `gpu` of one part: (h^P + g^P)^(1/P) - g."""
    if host <= 0:
        return 0.0
    return (host ** P + gpu ** P) ** (1 / P) - gpu


def _launches(parts: dict[str, float], captured: set[str], keep: set[str] | None = None) -> float:
    """Host launches of `parts` (only those in `keep` when given): a captured part is one graph launch."""
    total = 0.0
    for part, n in parts.items():
        if keep is not None and part not in keep:
            continue
        total += GRAPH_LAUNCHES if part in captured else n
    return total


def layer_host_time(model: ModelSpec, layout: Layout, index: int, busy: LayerBusy, cal: Calibration,
                    host: str = "x86") -> float:
    """Seconds the GPU waits for the host in one layer and microbatch (fwd + bwd), see the module docstring;
    `host`: the GPU's host CPU (hardware.HOSTS), whose time per launch the calibration holds."""
    if "full_iteration" in layout.cuda_graphs:
        return 0.0
    t = cal.host_kernel_launch_s.get(host, cal.host_kernel_launch_s["x86"])
    n = _LAUNCHES.get((model,), (_launch_fields(layout), model.attention_kind(index), model.layer_is_moe(index)),
                      lambda: layer_launches(model, layout, index))
    h_fwd = t * n.fwd
    h_bwd = t * n.bwd
    exposed = excess(h_bwd, busy.bwd)
    if model.layer_is_moe(index):
        h_post = t * n.post_sync
        exposed += cal.moe_sync_s * n.syncs + max(excess(h_post, busy.post_sync_fwd), excess(h_fwd, busy.fwd))
    else:
        exposed += excess(h_fwd, busy.fwd)
    return exposed


class LayerLaunches(NamedTuple):
    """Host launches of one layer per microbatch (a captured part is one graph launch) and its MoE syncs."""
    fwd: float
    bwd: float  # twice the forward's kernels, plus the recomputed forwards launched within the backward
    post_sync: float  # an MoE layer's forward after its sync: dispatch and experts
    syncs: int


def layer_launches(model: ModelSpec, layout: Layout, index: int) -> LayerLaunches:
    """The launches of decoder layer `index` (they depend on its attention kind and MoE-ness and LAUNCH_FIELDS)."""
    parts = layer_kernels(model, layout, index)
    captured = _captured(layout)
    recomputed = _recomputed_parts(layout)
    # token-drop MoE captured whole (`moe` scope) has static shapes: no sync. Capacity routing alone would need
    # none either (Megatron-Core 0.19's alltoall dispatcher skips its sync under drop_and_pad), but the fitted
    # moe_sync_s (at its 1 ms bound) holds more than the sync: every MoE layer's fixed cost per microbatch;
    # charged to every mode until a published capacity-vs-dropless pair can tell them apart
    syncs = 0 if "moe" in layout.cuda_graphs else 1 + (1 if "router" in recomputed else 0)
    return LayerLaunches(_launches(parts, captured),
                         BACKWARD_KERNEL_FACTOR * _launches(parts, captured) + _launches(parts, captured, recomputed),
                         _launches(parts, captured, {"dispatch", "experts"}), syncs)


def graph_copy_bytes(model: ModelSpec, layout: Layout, tokens_sp: float, act_bytes: int) -> float:
    """Bytes one layer's graph replays copy into and out of their static buffers per microbatch (fwd + bwd): the
    layer's hidden states in and out of every captured scope, and their gradients."""
    scopes = [s for s in layout.cuda_graphs if s != "full_iteration"]
    return len(scopes) * 2 * 2 * tokens_sp * model.hidden_size * act_bytes


__all__ = ["LayerBusy", "LayerLaunches", "layer_kernels", "layer_launches", "layer_host_time", "graph_copy_bytes"]
