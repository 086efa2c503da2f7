"""Memory model: peak bytes per GPU on the most loaded pipeline rank, as named components.

Static state (per parameter on the rank): weights (4 B fp32, else 2 B bf16; fp8 adds a 1 B cast cache),
gradients (Megatron DDP main_grad buffers, not sharded: 4 B in fp32 runs, 2 B otherwise), optimizer states (Adam exp_avg + exp_avg_sq,
8 B, plus a 4 B fp32 master copy when the weights are not fp32; the distributed optimizer shards the dense
part over DP*CP and the expert part over EDP; the offloaded fraction lives in host memory).

Activations: the tensors autograd saves for backward, per layer kind, for one microbatch of
mbs*seq_len/CP tokens on this rank (TP shards what Megatron shards; sequence parallel shards the norm/residual
regions), minus what the chosen recompute frees, times the microbatches in flight under 1F1B (min(m, PP-rank))
or the interleaved schedule (Megatron's warm-up count of model chunks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from search_spaces.flops import padded_vocab_size
from search_spaces.hardware import GPUSpec
from search_spaces.layout import Layout
from search_spaces.models import ModelSpec
from search_spaces.pipeline import EMBEDDING, LOSS, Placement, Unit, placement

GIB = float(1 << 30)
# Fixed buffers (bytes): DeepEP/HybridEP pre-allocate NVL + RDMA buffers; TE-scoped CUDA graphs keep static
# inputs/outputs and a private pool ("a few GB" per the Megatron-Bridge CUDA-graph skill).
DISPATCHER_BUFFER = {"deepep": 2.0 * GIB, "hybridep": 2.0 * GIB}
GRAPH_SCOPE_BUFFER = 1.0 * GIB
FULL_ITERATION_GRAPH_FACTOR = 0.5  # full-iteration graphs: +50% of the activations (notes: 1.5-2x peak)
RUNTIME_OVERHEAD = 2.5 * GIB  # CUDA context, NCCL communicators, cuBLAS/TE workspaces (0 on cpu)
ALLOCATOR_MARGIN = 0.05  # caching-allocator fragmentation, fraction of the rest (0 on cpu)


def act_bytes(layout: Layout) -> int:
    return 4 if layout.precision == "fp32" else 2


def gemm_input_bytes(layout: Layout) -> int:
    """Saved inputs of GEMMs are kept in fp8 under fp8 recipes (TE saves the quantised copy)."""
    if layout.precision.startswith("fp8") or layout.precision == "mxfp8":
        return 1
    return act_bytes(layout)


def weight_bytes(layout: Layout) -> int:
    return 4 if layout.precision == "fp32" else 2


def grad_bytes(layout: Layout) -> int:
    """main_grad buffer bytes per parameter: fp32 for fp32 runs; bf16 otherwise (Bridge's MoE recipes reduce
    gradients in bf16: with 4 B the Qwen3-30B 16 x H100 skill-card run would need 6 GiB more than measured)."""
    return 4 if layout.precision == "fp32" else 2


# ---- activations per layer ---------------------------------------------------------------------------
def layer_activations(model: ModelSpec, layout: Layout, seq_len: int, index: int, cpu: bool = False) -> dict[str, float]:
    """Bytes autograd saves for one microbatch in decoder layer `index` on one rank, keyed by the recompute
    module that frees them ('residual' and 'attention' are kept by every selective choice)."""
    # Only the layer's kind and a few layout fields matter: cache on those (space enumeration calls this a lot).
    key = (layout.tp, layout.cp, layout.etp, layout.mbs, layout.sp, layout.precision)
    return _layer_activations(model, key, seq_len, model.attention_kind(index), model.layer_is_moe(index), cpu)


@lru_cache(maxsize=65536)
def _layer_activations(model: ModelSpec, key: tuple, seq_len: int, kind: str, is_moe: bool,
                       cpu: bool) -> dict[str, float]:
    tp_, cp_, etp_, mbs_, sp_, precision_ = key
    L = Layout(tp=tp_, cp=cp_, etp=etp_, mbs=mbs_, gbs=mbs_, precision=precision_, sequence_parallel=sp_)
    tp = L.tp
    h = model.hidden_size
    t = L.mbs * seq_len / L.cp  # tokens of one microbatch on this CP rank
    tsp = t / tp if L.sp else t  # tokens in sequence-parallel regions
    e, g = act_bytes(L), gemm_input_bytes(L)
    if cpu:
        # PyTorch composite RMSNorm (no fused kernel) keeps its input and the normalised tensor; the next
        # linear keeps the weighted output (measured with the CPU trainer's saved-tensor hooks)
        out = {"residual": 2 * tsp * h * e, "layernorm": 2 * tsp * h * e + tsp * h * e}
    else:
        out = {"residual": 2 * tsp * h * e,  # inputs of the two norms (the residual stream)
               "layernorm": 2 * tsp * h * g}  # norm outputs, saved by the following linear
    n = model.num_attention_heads
    attn: dict[str, float] = {}
    if kind == "linear":
        attn["attention"] = linear_attention_activations(model, L, t, e, g, cpu)
    elif model.is_mla:
        qd, vd = model.q_head_dim, model.v_head_dim
        # down projections (saved by the q/kv norms) and the norm outputs (saved by the up projections)
        attn["attention"] = t * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim) * e
        out["layernorm"] += t * (model.q_lora_rank + model.kv_lora_rank) * g
        attn["mla_up_proj"] = (t / tp) * n * (2 * qd + vd) * e  # q, k, v saved by core attention
        attn["attention"] += (t / tp) * n * vd * g  # attention output, saved by the out projection
        attn["core_attn"] = _core_attn(t, seq_len, L, n, qd, vd, e, cpu)
    else:
        d = model.head_dim
        kv = model.num_kv_heads
        qkv = (t / tp) * (n + 2 * kv) * d * e  # the QKV projection output (V is a view of it)
        qk = (t / tp) * (n + kv) * d * e
        if cpu:
            # q/k after RoPE saved by the score matmul, plus the QK-norm input/normalised/weighted copies
            attn["attention"] = qkv + qk + (2 * qk if model.qk_layernorm else 0.0) + (t / tp) * n * d * e
        else:
            attn["attention"] = qkv + (qk if model.qk_layernorm else 0.0) + (t / tp) * n * d * g
        if model.attention_output_gate:
            attn["attention"] += 2 * (t / tp) * n * d * e
        attn["core_attn"] = _core_attn(t, seq_len, L, n, d, d, e, cpu, kv_heads=kv)
    for k, val in attn.items():
        out[k] = out.get(k, 0.0) + val
    if is_moe:
        out.update(_moe_activations(model, L, tsp, t, e, g, cpu))
    else:
        f = model.ffn_hidden_size / tp
        glu = 2 if model.gated_mlp else 1
        if cpu:  # composite SwiGLU keeps both halves, silu's output and the product; fc1 keeps its input
            out["mlp"] = t * f * e * (4 if model.gated_mlp else 2) + t * f * e + tsp * h * e
        else:
            out["mlp"] = t * (glu * f * e + f * g)
    return out


def linear_attention_activations(model: ModelSpec, L: Layout, t: float, e: int, g: int, cpu: bool) -> float:
    """What one gated delta-net layer (Megatron-Core's GatedDeltaNet, Qwen3-Next) saves beyond its input norm,
    for t tokens on this CP rank. TP splits every head-wise tensor; CP all-to-alls the sequence back
    together and splits heads, so per rank it is still t tokens' worth of width / TP."""
    qk = model.linear_key_head_dim * model.linear_num_key_heads
    v = model.linear_value_head_dim * model.linear_num_value_heads
    nk, nv = model.linear_num_key_heads, model.linear_num_value_heads
    kernel_qk = 2 * nv * model.linear_key_head_dim  # q and k repeated to the value heads (GQA-style)
    in_proj = 2 * qk + 2 * v + 2 * nv  # q, k, v, gate z, beta, alpha: the causal conv keeps it (via a view)
    tl = t / L.tp
    if cpu:
        # measured on the CPU trainer (cpu_compat's FLA references): in the activation dtype the conv output
        # with its w-1 causal pad, the kernel's saved q, k, v, beta, the gate, product and out projection input;
        # in fp32 (Megatron and the references upcast) the l2norm input and rsqrt, the decay g and its two
        # inputs, the gated norm's silu and normalised output, the norm's input, output and rsqrt
        pad = L.mbs * (model.linear_conv_kernel_dim - 1) / L.cp
        return (tl * (e * (in_proj + kernel_qk + v + nv + 2 * v) + 4 * (2 * qk + 2 * nk + 3 * nv + 4 * v + nv))
                + e * (t + pad) * (2 * qk + v) / L.tp)
    # GPU (TE + flash-linear-attention): FLA's conv and l2norm keep their input / output and rsqrt, its chunk
    # kernel keeps q, k, v, g and beta plus the fp32 WY matrix A (64 per token and head); TE's norm keeps the
    # input and rsqrt, the gate and its product are kept for the out projection.
    return tl * (e * (in_proj + (2 * qk + v) + 2 * qk + kernel_qk + v + 3 * v) + g * v
                 + 4 * (2 * nk + 2 * nv + 64 * nv + nv))


def _core_attn(t, seq_len, L, heads, qd, vd, e, cpu, kv_heads=None) -> float:
    """What core attention itself keeps beyond its q/k/v inputs."""
    n = heads / L.tp
    if cpu:
        # CPU trainer: unfused attention over all-gathered K/V: probabilities (fp32) + causal mask (1 B),
        # and the gathered (GQA-repeated) K and V of the whole sequence.
        s = L.mbs * seq_len
        probs = t * seq_len * n * 4 + t * seq_len
        gathered = s * n * (qd + vd) * e if (L.cp > 1 or (kv_heads and kv_heads < heads)) else 0.0
        return probs + gathered
    return t * n * 4  # flash attention: softmax log-sum-exp (fp32); output is saved by the out projection


def _moe_activations(model: ModelSpec, L: Layout, tsp: float, t: float, e: int, g: int, cpu: bool) -> dict[str, float]:
    k = model.topk
    h = model.hidden_size
    f = model.moe_ffn_hidden_size / L.etp
    routed = tsp * k * L.etp  # token copies processed on this rank (balanced routing)
    if cpu:
        # measured on the CPU trainer (grouped experts): fp32 router input copy, expert input, fc2 input and
        # the expert output with its probability-weighted copy in the unpermute; the activation function keeps
        # four token-copy x ffn tensors (both SwiGLU halves, silu output, product) - all freed by moe_act
        # recompute (measured: 4 such tensors per layer on tiny-moe and tiny-mla-moe)
        out = {"router": tsp * h * e + tsp * model.num_experts * 4 * 2,
               "moe": routed * h * e + routed * f * e + 2 * routed * h * e,
               "moe_act": 4 * routed * f * e}
        if model.linear_bias:
            # gpt-oss's GLU, unfused on CPU (clamped gate through quick-GELU times clamped linear + 1): two
            # more token-copy x ffn tensors (measured on tiny-gpt-oss); fused on GPU (bias_activation_fusion)
            out["moe_act"] += 2 * routed * f * e
    else:
        # expert input and fc1 output (memory-efficient permutation applies the probabilities before the
        # unpermute, so the expert output is not kept)
        out = {"router": tsp * model.num_experts * 4 * 2,  # logits and probabilities, fp32
               "moe": routed * (h * g + 2 * f * e),
               "moe_act": routed * f * g}  # activation output, saved by fc2
    if model.shared_expert_ffn_hidden_size:
        fs = model.shared_expert_ffn_hidden_size / L.tp
        out["shared_experts"] = t * (2 * fs * e + fs * g) if not cpu else t * fs * e * 5 + tsp * h * e
    return out


_SELECTIVE_FREES = {
    "core_attn": ("core_attn",),
    "layernorm": ("layernorm",),
    "mla_up_proj": ("mla_up_proj",),
    "mlp": ("mlp",),
    "moe_act": ("moe_act",),
    # whole-MoE-layer recompute checkpoints the shared experts too (they run inside MoELayer.forward)
    "moe": ("moe", "moe_act", "router", "shared_experts"),
    "shared_experts": ("shared_experts",),
}


def layer_saved_bytes(acts: dict[str, float], layout: Layout) -> float:
    """What stays saved for one layer after selective recompute (full recompute is handled per chunk)."""
    freed: set[str] = set()
    if layout.recompute_granularity == "selective":
        for m in layout.recompute_modules:
            freed.update(_SELECTIVE_FREES.get(m, ()))
    return sum(v for k, v in acts.items() if k not in freed)


def head_activations(model: ModelSpec, layout: Layout, seq_len: int, cpu: bool = False) -> float:
    """Final norm, output layer and cross-entropy of one microbatch (per output head)."""
    t = layout.mbs * seq_len / layout.cp
    tsp = t / layout.tp if layout.sp else t
    e = act_bytes(layout)
    vocab = padded_vocab_size(model.vocab_size, layout.tp) / layout.tp
    if cpu:  # composite norm (input + normalised), output-layer input, fp32 softmax of the cross-entropy
        return 3 * tsp * model.hidden_size * e + t * vocab * 4
    return tsp * model.hidden_size * (e + gemm_input_bytes(layout)) + t * vocab * (e + 4)


def mtp_activations(model: ModelSpec, layout: Layout, seq_len: int) -> float:
    """One MTP block beyond its transformer layer: two norms, concat and eh projection."""
    t = layout.mbs * seq_len / layout.cp
    tsp = t / layout.tp if layout.sp else t
    return tsp * model.hidden_size * act_bytes(layout) * 5


# ---- parameters per rank --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankParams:
    dense: float
    expert: float


def rank_params(model: ModelSpec, layout: Layout, units: list[Unit]) -> RankParams:
    """Dense (TP-sharded) and expert (EP*ETP-sharded) parameters held by the rank that holds `units`."""
    return _rank_params(model, layout.tp, layout.ep, layout.etp, tuple(units))


@lru_cache(maxsize=65536)
def _rank_params(model: ModelSpec, tp: int, ep: int, etp: int, units: tuple[Unit, ...]) -> RankParams:
    h = model.hidden_size
    vocab = padded_vocab_size(model.vocab_size, tp)
    dense = expert = 0.0
    has_embedding = False
    for u in units:
        if u == EMBEDDING:
            dense += vocab * h / tp
            has_embedding = True
        elif u == LOSS:
            dense += h + (0 if model.tie_embeddings and has_embedding else vocab * h / tp)
        else:
            norms = 2 * h + (model.router_params() if model.layer_is_moe(u.layer) else 0)  # not TP-sharded
            dense += (model.dense_params_per_layer(u.layer) - norms) / tp + norms
            if model.layer_is_moe(u.layer):
                expert += model.expert_params_per_layer() / (ep * etp)
            if u.is_mtp:
                dense += model.mtp_extra_params() / tp
    if any(u.is_mtp for u in units) and not has_embedding:
        dense += vocab * h / tp  # MTP needs the embedding on its stage
    return RankParams(dense, expert)


# ---- the memory estimate ------------------------------------------------------------------------------
def inflight_per_chunk(layout: Layout, rank: int, microbatches: int) -> list[int]:
    """Microbatches whose activations each model chunk of pipeline rank `rank` holds at the peak.

    1F1B: min(m, PP - rank). Interleaved: Megatron runs (PP-rank-1)*2 + (VPP-1)*PP warm-up forwards, then
    one more before the first backward; forwards go through the chunks in groups of PP microbatches.
    """
    pp, vpp, m = layout.pp, layout.vpp, max(microbatches, 1)
    if vpp == 1:
        return [min(m, pp - rank)]
    remaining = min(m * vpp, (pp - rank - 1) * 2 + (vpp - 1) * pp + 1)
    counts = [0] * vpp
    group = 0
    while remaining > 0 and any(c < m for c in counts):
        c = group % vpp
        add = min(pp, remaining, m - counts[c])
        counts[c] += add
        remaining -= add
        group += 1
    return counts


def chunk_activations(model: ModelSpec, layout: Layout, seq_len: int, units: tuple[Unit, ...], cpu: bool) -> float:
    """Saved bytes of one microbatch through one model chunk, after recompute."""
    total = 0.0
    layer_units = [u for u in units if u.is_layer]
    full = layout.recompute_granularity == "full"
    t = layout.mbs * seq_len / layout.cp
    tsp = t / layout.tp if layout.sp else t
    layer_input = tsp * model.hidden_size * act_bytes(layout)
    recomputed = 0
    if full:
        n = layout.recompute_num_layers
        if layout.recompute_method == "uniform":
            recomputed = len(layer_units)
            total += math.ceil(len(layer_units) / n) * layer_input
        else:  # block: the first n layers of the chunk are recomputed
            recomputed = min(n, len(layer_units))
            total += recomputed * layer_input
    for i, u in enumerate(layer_units):
        if i >= recomputed:
            total += layer_saved_bytes(layer_activations(model, layout, seq_len, u.layer, cpu), layout)
            if u.is_mtp:
                total += mtp_activations(model, layout, seq_len)
    if LOSS in units:
        total += head_activations(model, layout, seq_len, cpu) * (1 + sum(1 for u in units if u.is_mtp))
    return total


def memory_breakdown(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout) -> dict[str, float]:
    """Memory components in bytes on the most loaded pipeline rank (the one with the highest peak).

    Keys summed into `peak`: weights, gradients, optimizer_states, activations, dispatcher_buffers,
    cuda_graphs, runtime_overhead, allocator_margin. Informational: activations_per_microbatch (one microbatch
    on that rank, all its chunks), embedding_logits (the head's share of it), offloaded_to_host, pipeline_rank,
    inflight_microbatches.
    """
    place = placement(model, layout.pp, layout.vpp)
    if place is None:
        raise ValueError("layout has no pipeline placement (check rules first)")
    best: dict[str, float] | None = None
    for rank in _candidate_ranks(place):
        mem = _rank_memory(model, gpu, num_gpus, seq_len, layout, place, rank)
        if best is None or mem["peak"] > best["peak"]:
            best = mem
    assert best is not None
    return best


def _candidate_ranks(place: Placement) -> list[int]:
    # Rank 0 holds the most microbatches in flight, the last rank the output head; the others only matter
    # when the split is uneven. Checking every rank is cheap enough for PP <= 16, sample beyond.
    if place.pp <= 4 or place.method == "even" and place.pp <= 8:
        return list(range(place.pp))
    return sorted({0, 1, place.pp // 2, place.pp - 2, place.pp - 1})


def _rank_memory(model, gpu, num_gpus, seq_len, layout, place, rank) -> dict[str, float]:
    cpu = gpu.is_cpu
    chunks = place.rank_stages(rank)
    units = [u for c in chunks for u in c]
    params = rank_params(model, layout, units)
    wb = weight_bytes(layout)
    fp8 = gemm_input_bytes(layout) == 1
    weights = (params.dense + params.expert) * (wb + (1 if fp8 else 0))
    gradients = (params.dense + params.expert) * grad_bytes(layout)
    opt_per_param = 8 + (0 if wb == 4 else 4)
    dp = max(layout.dp(num_gpus), 1)
    edp = max(layout.edp(num_gpus), 1)
    if layout.distributed_optimizer:
        opt = opt_per_param * (params.dense / (dp * layout.cp) + params.expert / edp)
    else:
        opt = opt_per_param * (params.dense + params.expert)
    offloaded = opt * layout.optimizer_offload
    per_chunk = [chunk_activations(model, layout, seq_len, c, cpu) for c in chunks]
    per_microbatch = sum(per_chunk)
    m = layout.grad_accum(num_gpus) or 1
    counts = inflight_per_chunk(layout, rank, m)
    activations = sum(n * a for n, a in zip(counts, per_chunk))
    inflight = sum(counts)
    if layout.recompute_granularity == "full":
        # the recomputed group's activations are re-materialised during its backward
        biggest = max((layer_saved_bytes(layer_activations(model, layout, seq_len, i, cpu), layout)
                       for i in range(min(model.num_layers, 4))), default=0.0)
        activations += biggest * min(layout.recompute_num_layers, 4)
    head = head_activations(model, layout, seq_len, cpu) if any(LOSS in c for c in chunks) else 0.0
    t = layout.mbs * seq_len / layout.cp
    tsp = t / layout.tp if layout.sp else t
    dispatcher = 0.0
    if model.is_moe:
        if layout.dispatcher in DISPATCHER_BUFFER and not cpu:
            dispatcher = DISPATCHER_BUFFER[layout.dispatcher]
        elif layout.dispatcher == "allgather":
            dispatcher = tsp * layout.ep * layout.tp * model.hidden_size * act_bytes(layout)
        else:  # alltoall: permuted send and receive buffers, transient
            dispatcher = 2 * tsp * model.topk * model.hidden_size * act_bytes(layout)
    graphs = 0.0
    if layout.cuda_graphs:
        if "full_iteration" in layout.cuda_graphs:
            graphs = FULL_ITERATION_GRAPH_FACTOR * activations
        else:
            graphs = GRAPH_SCOPE_BUFFER * len(layout.cuda_graphs)
    runtime = 0.0 if cpu else RUNTIME_OVERHEAD
    base = weights + gradients + (opt - offloaded) + activations + dispatcher + graphs
    margin = 0.0 if cpu else ALLOCATOR_MARGIN * base
    return {
        "weights": weights,
        "gradients": gradients,
        "optimizer_states": opt - offloaded,
        "activations": activations,
        "dispatcher_buffers": dispatcher,
        "cuda_graphs": graphs,
        "runtime_overhead": runtime,
        "allocator_margin": margin,
        "peak": base + runtime + margin,
        "activations_per_microbatch": per_microbatch,
        "embedding_logits": head,
        "offloaded_to_host": offloaded,
        "pipeline_rank": float(rank),
        "inflight_microbatches": inflight / len(chunks),  # chunk-microbatches / chunks
        "params_on_rank": params.dense + params.expert,
        "dense_params_on_rank": params.dense,
        "expert_params_on_rank": params.expert,
    }


PEAK_KEYS = ("weights", "gradients", "optimizer_states", "activations", "dispatcher_buffers", "cuda_graphs",
             "runtime_overhead", "allocator_margin")


# Breakdown keys that are counts, not bytes: the one place that says which components are memory
# (to_gib leaves them as they are; the report never plots them on a GiB axis).
COUNT_KEYS = ("pipeline_rank", "inflight_microbatches", "params_on_rank", "dense_params_on_rank",
              "expert_params_on_rank")


def to_gib(breakdown: dict[str, float]) -> dict[str, float]:
    return {k: (v if k in COUNT_KEYS else v / GIB) for k, v in breakdown.items()}


def rank_memory_breakdown(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
                          rank: int) -> dict[str, float]:
    """The memory components (bytes) of one pipeline rank (memory_breakdown gives the most loaded one)."""
    place = placement(model, layout.pp, layout.vpp)
    if place is None:
        raise ValueError("layout has no pipeline placement (check rules first)")
    return _rank_memory(model, gpu, num_gpus, seq_len, layout, place, rank)
