"""Memory model: peak bytes per GPU on the most loaded pipeline rank, as named components.

Static state (per parameter on the rank): weights (4 B fp32, else 2 B bf16; fp8 adds a 1 B cast cache; 1 B alone
when the weights are kept in fp8, fp8_param_gather),
gradients (Megatron DDP main_grad buffers, not sharded: 4 B in fp32 runs, 2 B otherwise), optimizer states (Adam exp_avg
+ exp_avg_sq, 8 B, plus a 4 B fp32 master copy when the weights are not fp32; the distributed optimizer shards the dense
part over DP*CP and the expert part over EDP). Optimizer offload (Megatron-Core's HybridDeviceOptimizer) moves the
offloaded fraction's moments to the host; the distributed optimizer's fp32 master shard stays on the GPU (the host
steps a pinned copy of it and copies the result back): Megatron-Bridge's CPU-offloading card measures Qwen3-30B-A3B
(TP2 PP2 EP4, 16 H100) saving 15.3 GB at fraction 1, the moments' 8 of its 12 B per parameter (about 22.9 GB of
states on that rank).

Activations: the tensors autograd saves for backward, per layer kind, for one microbatch of
mbs*seq_len/CP tokens on this rank (TP shards what Megatron shards; sequence parallel shards the norm/residual
regions), minus what the chosen recompute frees, times the microbatches in flight under 1F1B (min(m, PP-rank))
or the interleaved schedule (Megatron's warm-up count of model chunks). The CPU trainer's layers have terms
of their own (cpu=True: composite norms, RoPE and SwiGLU, unfused attention), each checked against what its
saved-tensor hooks record per module (bench/memory_accuracy.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.breakdown import GIB, MemoryBreakdown, RankCounts, peak_bytes
from search_spaces.cost.flops import padded_vocab_size
from search_spaces.cost.memo import HashOnce, Memo, fields
from search_spaces.cost.offload import RESIDENT_LAYERS, moment_bytes_per_param, optimizer_bytes_per_param, with_levers
from search_spaces.cost.pipeline import EMBEDDING, LOSS, Placement, Unit, placement
from search_spaces.cost.routing import capacity_router_bytes, expert_load
from search_spaces.layouts.layout import Layout, fields_read_by

# Fixed buffers (bytes): DeepEP pre-allocates chunked NVL + RDMA buffers whose size does not grow with the tokens
# (assumed 2 GiB); HybridEP's grow with them (hybridep_buffer_bytes). TE-scoped CUDA graphs keep static
# inputs/outputs and a private pool ("a few GB" per the Megatron-Bridge CUDA-graph skill).
DISPATCHER_BUFFER = {"deepep": 2.0 * GIB}
# HybridEP's scaling factors: one fp32 per 128 hidden elements of a token
HYBRIDEP_SCALE_BLOCK = 128
GRAPH_SCOPE_BUFFER = 1.0 * GIB
# Full-iteration graphs (megatron/core/full_cuda_graph.py FullCudaGraphWrapper): every microbatch's forward and backward
# is captured into one private pool (shared with the optimizer's capture: cuda_graph_use_single_mempool), which reuses
# within the capture what the capture frees, so the activations are held there once, not twice; beside them the graph
# keeps static copies of each microbatch's inputs (token ids, labels, mask, positions: ~28 B a token, megabytes) and
# what the pool cannot hand back between captures (blocks freed on another stream -- the EP overlap's, HybridEP's --
# stay held until the capture ends). That excess is not in the code's terms; the published full-iteration rows that
# ran bound it: with it at 29% of the activations Bridge 26.08's Qwen3-30B-A3B on 8 GB300 (MBS 8) would not fit
# (search_spaces/calibration/reference_memory.py). Charged at 25%, the largest round share every published row allows.
FULL_ITERATION_POOL_EXCESS = 0.25
RUNTIME_OVERHEAD = 2.5 * GIB  # CUDA context, NCCL communicators, cuBLAS/TE workspaces (0 on cpu)
ALLOCATOR_MARGIN = 0.05  # caching-allocator fragmentation, fraction of the rest (0 on cpu)

# The layout fields the memoised terms read (search_spaces/cost/memo.py), as the dimensions declare them
# (Dimension.read_by): one microbatch's saved activations through a chunk; what a pipeline rank holds beside them
# (parameters, optimizer states, microbatches in flight); the breakdown. Each reads what the one it is built on reads.
# Neither reads the CP communication (extra_memory's buffers do) nor the EP overlap.
# the memory levers that change what stays on the GPU, not what is computed (search_spaces/cost/offload.py)
ACTIVATION_LEVER_FIELDS = fields_read_by("activation levers")
CHUNK_FIELDS = fields_read_by("activations") + ACTIVATION_LEVER_FIELDS
RANK_PARTS_FIELDS = CHUNK_FIELDS + fields_read_by("rank memory")
MEMORY_FIELDS = RANK_PARTS_FIELDS + fields_read_by("memory")
_chunk_fields, _parts_fields, _memory_fields = (fields(*names) for names in (
    CHUNK_FIELDS, RANK_PARTS_FIELDS, MEMORY_FIELDS))
_CHUNK, _PARTS = Memo("chunk activations"), Memo("rank parts")
_BREAKDOWN = Memo("memory breakdown")
_CHUNK_KINDS, _PARAMS, _LAYER_PARAMS = Memo("chunk make-up by units"), Memo("rank params"), Memo("layer params")
_SHAPE, _RANK_KINDS, _RANK_CHUNKS = Memo("rank shape"), Memo("chunk make-ups of a rank"), \
    Memo("activations per chunk of a rank")


def act_bytes(layout: Layout) -> int:
    return 4 if layout.precision == "fp32" else 2


def hybridep_buffer_bytes(model: ModelSpec, gpu: GPUSpec, layout: Layout, tokens_rank: float) -> float:
    """What HybridEP's buffer pre-allocates on each rank (deepseek-ai/DeepEP's hybrid-ep NVLCoordinator and
    RDMACoordinator; Megatron-Core's fused_a2a sizes it by the MoE input's tokens per rank, `tokens_rank`):
    for the worst case of every token of the group routed to one rank, tokens_rank x EP tokens of `hidden` BF16
    and their routing probabilities in fp32 (one per expert of the NVLink domain), one buffer shared by the
    dispatch and the combine (HybridEPBuffer's use_shared_buffer default), plus fp32 scaling factors; across
    NVLink domains, staging buffers for tokens_rank x (domains - 1) tokens, dispatch and combine."""
    ranks_in_domain = min(layout.ep, gpu.nvlink_domain)
    domains = max(1, layout.ep // ranks_in_domain)
    experts_in_domain = model.num_experts / layout.ep * ranks_in_domain
    per_token = 2 * model.hidden_size + 4 * experts_in_domain + 4 * model.hidden_size / HYBRIDEP_SCALE_BLOCK
    return tokens_rank * (layout.ep + 2 * (domains - 1)) * per_token


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
def layer_activations(model: ModelSpec, layout: Layout, seq_len: int, index: int, cpu: bool = False) -> dict[str,
                                                                                                             float]:
    """Bytes autograd saves for one microbatch in decoder layer `index` on one rank, keyed by the recompute
    module that frees them ('residual' and 'attention' are kept by every selective choice)."""
    # Only the layer's kind and a few layout fields matter: cache on those (space enumeration calls this a lot).
    key = (layout.tp, layout.cp, layout.etp, layout.mbs, layout.sp, layout.precision, layout.dispatcher, layout.ep,
           layout.routing)
    return _layer_activations(model, key, seq_len, model.attention_kind(index), model.layer_is_moe(index), cpu)


@lru_cache(maxsize=65536)
def _layer_activations(model: ModelSpec, key: tuple, seq_len: int, kind: str, is_moe: bool,
                       cpu: bool) -> dict[str, float]:
    tp_, cp_, etp_, mbs_, sp_, precision_, dispatcher_, ep_, routing_ = key
    L = Layout(tp=tp_, cp=cp_, etp=etp_, mbs=mbs_, gbs=mbs_, precision=precision_, sequence_parallel=sp_,
               dispatcher=dispatcher_, ep=ep_, routing=routing_)
    if cpu:
        return _cpu_layer_activations(model, L, seq_len, is_moe, kind)
    tp = L.tp
    h = model.hidden_size
    t = L.mbs * seq_len / L.cp  # tokens of one microbatch on this CP rank
    tsp = t / tp if L.sp else t  # tokens in sequence-parallel regions
    e, g = act_bytes(L), gemm_input_bytes(L)
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
        attn["core_attn"] = t * n / tp * 4  # flash attention: softmax log-sum-exp (fp32)
    else:
        d = model.head_dim
        kv = model.num_kv_heads
        qkv = (t / tp) * (n + 2 * kv) * d * e  # the QKV projection output (V is a view of it)
        qk = (t / tp) * (n + kv) * d * e  # q and k after RoPE (new tensors), kept by flash attention
        # QK-norm keeps only its rsigma (fp32) beyond the QKV output it reads; the attention output is kept
        # by the out projection (as the flash attention's own output)
        norm = (t / tp) * (n + kv) * 4 if model.qk_layernorm else 0.0
        attn["attention"] = qkv + qk + norm + (t / tp) * n * d * g
        if model.attention_output_gate:
            attn["attention"] += 2 * (t / tp) * n * d * e
        attn["core_attn"] = t * n / tp * 4  # flash attention: softmax log-sum-exp (fp32)
    for k, val in attn.items():
        out[k] = out.get(k, 0.0) + val
    if is_moe:
        out.update(_moe_activations(model, L, tsp, t, e, g))
    else:
        f = model.ffn_hidden_size / tp
        glu = 2 if model.gated_mlp else 1
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


def _cpu_layer_activations(model: ModelSpec, L: Layout, seq_len: int, is_moe: bool, kind: str) -> dict[str, float]:
    """The CPU trainer: PyTorch composite ops (RMSNorm, RoPE, SwiGLU) and unfused attention. Every tensor
    below is one that trainers/measure.py's saved-tensor hooks see, by module, in the trainer's fp32 CPU runs;
    bench/memory_accuracy.py checks each term on its own."""
    h, e = model.hidden_size, act_bytes(L)
    s = seq_len / L.cp  # sequence positions on this CP rank
    t = L.mbs * s  # tokens of one microbatch on this CP rank
    tsp = t / L.tp if L.sp else t  # tokens in sequence-parallel regions
    # Each norm keeps its input (the residual stream), rsqrt [tokens, 1] and the normalised copy; its
    # weighted output is kept by whatever reads it next (QKV or down projection, router, MLP or shared fc1,
    # a recompute checkpoint). The layernorm recompute frees all but the input.
    out = {"residual": 2 * tsp * h * e, "layernorm": 2 * tsp * (2 * h + 1) * e}
    if kind == "linear":  # gated delta-net (cpu_compat's references of the FLA kernels)
        # its input norm is fused into in_proj (TE's layernorm-linear): the same input, rsqrt and normalised
        # copy, kept by the attention module, and not freed by the layernorm recompute
        fused_norm = tsp * h * e + tsp * (2 * h + 1) * e
        out = {"residual": tsp * h * e, "layernorm": tsp * (2 * h + 1) * e}
        attn = {"attention": linear_attention_activations(model, L, t, e, e, True) + fused_norm}
    elif model.is_mla:
        attn = _cpu_mla(model, L, seq_len, e)
    else:  # full or sliding-window attention: the CPU attention masks the window inside S x S
        attn = _cpu_attention(model, L, seq_len, e)
    for k, val in attn.items():
        out[k] = out.get(k, 0.0) + val
    if is_moe:
        out.update(_cpu_moe_activations(model, L, tsp, t, e))
    else:  # fc1 output (both SwiGLU halves), silu output, the linear half's copy (+ glu offset), fc2 input;
        # without a GLU the activation keeps fc1's output and fc2 its input
        out["mlp"] = t * model.ffn_hidden_size / L.tp * e * (5 if model.gated_mlp else 2)
    return out


def _cpu_probs(L: Layout, seq_len: int, heads: float, e: int) -> float:
    """Unfused softmax attention of one microbatch: fp32 probabilities [mbs, heads, S/CP, S] (plus the
    working-dtype copy the context matmul keeps when that is not fp32) and the causal mask, bool
    [S/CP, S] broadcast over microbatch rows and heads."""
    s = seq_len / L.cp
    return L.mbs * heads * s * seq_len * (4 + (e if e != 4 else 0)) + s * seq_len


def _cpu_attention(model: ModelSpec, L: Layout, seq_len: int, e: int) -> dict[str, float]:
    """GQA/MHA with RoPE. CP = 1: Megatron's local DotProductAttention (GQA repeats K and V to every head);
    CP > 1: trainers/cp_attention.py, which all-gathers K and V over the CP group."""
    n, kv, d = model.num_attention_heads / L.tp, model.num_kv_heads / L.tp, model.head_dim
    s = seq_len / L.cp
    t = L.mbs * s
    local = L.cp == 1
    attention = t * n * d * e * 2  # q after RoPE (score matmul) and the attention output (out projection)
    attention += 4 * s * d * e  # RoPE cos and sin for q and for k, [S/CP, 1, 1, head_dim]: no batch
    if model.qk_layernorm:  # per-head norms: the QKV output they read, rsqrt per head, normalised q and k;
        # with several KV groups of several heads on the rank, q is regrouped out of the QKV output: a copy
        regrouped = t * n * d * e if 1 < kv < n else 0.0
        attention += t * (n + 2 * kv) * d * e + t * (n + kv) * (d + 1) * e + regrouped
    elif local and kv == n:  # the context matmul reads V, a view of the QKV output
        attention += t * (n + 2 * kv) * d * e
    if local and kv == n:
        attention += t * kv * d * e  # k after RoPE (score matmul)
    if model.attention_output_gate:
        attention += 2 * t * n * d * e
    core = _cpu_probs(L, seq_len, n, e)
    if not local:  # K and V of the whole sequence (all-gathered, GQA-repeated to every head)
        core += 2 * L.mbs * seq_len * n * d * e
    elif kv < n:  # K and V repeated to every head
        core += 2 * t * n * d * e
    return {"attention": attention, "core_attn": core}


def _cpu_mla(model: ModelSpec, L: Layout, seq_len: int, e: int) -> dict[str, float]:
    """MLA on the CPU attention (trainers/cp_attention.py at any CP). The trainer builds the q/kv latent
    norms only when the model has qk_layernorm (no catalog MLA model does: that branch is not measured)."""
    n, qd, vd, rope = model.num_attention_heads / L.tp, model.q_head_dim, model.v_head_dim, model.qk_rope_head_dim
    s = seq_len / L.cp
    t = L.mbs * s
    tsp = t / L.tp if L.sp else t
    latents = model.q_lora_rank + model.kv_lora_rank
    # Down-projection outputs, kept by the up projections (or by the latent norms); under TP the down
    # projections are column-parallel and their outputs all-gathered: q's sequence-parallel share stays a
    # view of the gathered [tokens, q_lora] tensor, kv's share is a copy without the RoPE part (gathered
    # and rotated separately). Then the attention output.
    kv = tsp * model.kv_lora_rank if L.tp > 1 and L.sp else t * (model.kv_lora_rank + rope)
    attention = (t * model.q_lora_rank + kv) * e + t * n * vd * e
    if model.qk_layernorm:  # rsqrt, normalised latents and the norm outputs the up projections keep
        attention += 2 * t * e + 2 * t * latents * e
    # q, k, v built by the up projections (kept by the score/context matmuls; at CP > 1 only q: K and V are
    # all-gathered copies) and RoPE cos/sin for q and k, [S/CP, 1, 1, rope dim]: all freed by mla_up_proj
    up = t * n * (qd if L.cp > 1 else 2 * qd + vd) * e + 4 * s * rope * e
    core = _cpu_probs(L, seq_len, n, e)
    if L.cp > 1:
        core += L.mbs * seq_len * n * (qd + vd) * e
    return {"attention": attention, "mla_up_proj": up, "core_attn": core}


def _moe_activations(model: ModelSpec, L: Layout, tsp: float, t: float, e: int, g: int) -> dict[str, float]:
    k = model.topk
    h = model.hidden_size
    f = model.moe_ffn_hidden_size / L.etp
    # token copies processed on this rank: the balanced share times the routing's load (search_spaces.cost.routing:
    # dropless buffers the busiest rank's copies, capacity pads every expert to its capacity)
    routed = tsp * k * L.etp * expert_load(model, L, tsp, cpu=False)
    # expert input and fc1 output (memory-efficient permutation applies the probabilities before the
    # unpermute, so the expert output is not kept)
    out = {"router": tsp * model.num_experts * 4 * 2  # logits and probabilities, fp32 (token dropping: its mask)
                     + capacity_router_bytes(model, L, tsp),
           "moe": routed * (h * g + 2 * f * e),
           "moe_act": routed * f * g}  # activation output, saved by fc2
    if model.shared_expert_ffn_hidden_size:
        fs = model.shared_expert_ffn_hidden_size / L.tp
        out["shared_experts"] = t * (2 * fs * e + fs * g)
        if model.shared_expert_gate:  # Qwen3-Next: sigmoid(gate) x the shared output keeps both
            out["shared_experts"] += tsp * (h + 1) * e
    return out


def _cpu_moe_activations(model: ModelSpec, L: Layout, tsp: float, t: float, e: int) -> dict[str, float]:
    """Routed experts on the CPU trainer: Megatron's TEGroupedMLP over plain-torch grouped linears."""
    k, h, experts = model.topk, model.hidden_size, model.num_experts
    f = model.moe_ffn_hidden_size / L.etp
    routed = tsp * k * L.etp * expert_load(model, L, tsp, cpu=True)  # as on GPUs (_moe_activations)
    if L.dispatcher == "allgather":  # row index of each local copy; routing map (bool) and probabilities
        dispatch = routed * 8 + tsp * L.tp * experts * 5  # (fp32) of every token gathered over TP x EP
    else:  # alltoall: int64 permutation indices, sorted over the [tokens, experts] routing map and per copy
        dispatch = tsp * (experts + k) * 8
    glu = 2 if model.gated_mlp else 1
    out = {
        # fp32 router: scores [tokens, experts], top-k probabilities, top-k indices (int64) twice
        "router": tsp * (experts * 4 + k * 20) + capacity_router_bytes(model, L, tsp),
        # expert input (fc1), fc1 output (saved by the activation), routing probabilities (fp32)
        "moe": routed * (h * e + glu * f * e + 4) + dispatch,
        # SwiGLU: silu output, the linear half's copy (+ glu offset), the product, and the
        # probability-weighted product saved by fc2
        "moe_act": routed * f * e * (4 if model.gated_mlp else 2),
    }
    if model.linear_bias:
        # gpt-oss's GLU, unfused on CPU (clamped gate through quick-GELU times clamped linear + 1): two more
        # token-copy x ffn tensors (measured on tiny-gpt-oss); fused on GPU (bias_activation_fusion)
        out["moe_act"] += 2 * routed * f * e
    if model.shared_expert_ffn_hidden_size:  # the dense MLP's five [tokens, ffn] tensors
        out["shared_experts"] = t * model.shared_expert_ffn_hidden_size / L.tp * e * (5 if model.gated_mlp else 2)
        if model.shared_expert_gate:  # Qwen3-Next: sigmoid(gate) x the shared output keeps both
            out["shared_experts"] += tsp * (h + 1) * e
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


def saved_terms(acts: dict[str, float], layout: Layout) -> dict[str, float]:
    """The terms of one layer that stay saved after selective recompute (full recompute is handled per chunk)."""
    freed: set[str] = set()
    if layout.recompute_granularity == "selective":
        for m in layout.recompute_modules:
            freed.update(_SELECTIVE_FREES.get(m, ()))
    return {k: v for k, v in acts.items() if k not in freed}


def layer_saved_bytes(acts: dict[str, float], layout: Layout) -> float:
    """What stays saved for one layer after selective recompute (full recompute is handled per chunk)."""
    return sum(saved_terms(acts, layout).values())


def head_activations(model: ModelSpec, layout: Layout, seq_len: int, cpu: bool = False) -> float:
    """Final norm, output layer and cross-entropy of one microbatch (per output head)."""
    t = layout.mbs * seq_len / layout.cp
    tsp = t / layout.tp if layout.sp else t
    e = act_bytes(layout)
    vocab = padded_vocab_size(model.vocab_size, layout.tp) / layout.tp
    if cpu:
        # composite norm (input, rsqrt, normalised), its output kept by the output layer, the fp32 softmax
        # of the vocab-parallel cross-entropy, labels (int64) and loss mask (bool)
        return tsp * (3 * model.hidden_size + 1) * e + t * vocab * 4 + t * 9
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


def rank_params(model: ModelSpec, layout: Layout, units: tuple[Unit, ...]) -> RankParams:
    """Dense (TP-sharded) and expert (EP*ETP-sharded) parameters held by the rank that holds `units` (kept per
    units object, e.g. Placement.rank_units', and TP, EP, ETP)."""
    by_sizes = _PARAMS.get_for((model,), units, dict)
    sizes = (layout.tp, layout.ep, layout.etp)
    if sizes not in by_sizes:
        by_sizes[sizes] = _rank_params(model, *sizes, tuple(units))
    return by_sizes[sizes]


@lru_cache(maxsize=65536)
def _rank_params(model: ModelSpec, tp: int, ep: int, etp: int, units: tuple[Unit, ...]) -> RankParams:
    h = model.hidden_size
    vocab = padded_vocab_size(model.vocab_size, tp)
    dense = expert = 0.0
    has_embedding = False
    layer_params = _layer_params(model)
    for u in units:
        if u == EMBEDDING:
            dense += vocab * h / tp
            has_embedding = True
        elif u == LOSS:
            dense += h + (0 if model.tie_embeddings and has_embedding else vocab * h / tp)
        else:
            norms, layer_dense, moe = layer_params[u.layer]
            dense += (layer_dense - norms) / tp + norms
            if moe:
                expert += model.expert_params_per_layer() / (ep * etp)
            if u.is_mtp:
                dense += model.mtp_extra_params() / tp
    if any(u.is_mtp for u in units) and not has_embedding:
        dense += vocab * h / tp  # MTP needs the embedding on its stage
    return RankParams(dense, expert)


def _layer_params(model: ModelSpec) -> list[tuple[int, int, bool]]:
    """Per decoder and MTP layer: (norms and router: not TP-sharded, dense parameters, MoE), once per model."""
    def layer(index: int) -> tuple[int, int, bool]:
        moe = model.layer_is_moe(index)
        return 2 * model.hidden_size + (model.router_params() if moe else 0), model.dense_params_per_layer(index), moe
    return _LAYER_PARAMS.get((model,), None, lambda: [layer(i) for i in range(model.num_layers + model.mtp_layers)])


# ---- the memory estimate ------------------------------------------------------------------------------
def inflight_per_chunk(layout: Layout, rank: int, microbatches: int) -> list[int]:
    """Microbatches whose activations each model chunk of pipeline rank `rank` holds at the peak.

    1F1B: min(m, PP - rank). Interleaved: Megatron runs (PP-rank-1)*2 + (VPP-1)*PP warm-up forwards, then
    one more before the first backward; forwards go through the chunks in groups of PP microbatches.
    """
    return list(_inflight(layout.pp, layout.vpp, rank, max(microbatches, 1)))


@lru_cache(maxsize=65536)
def _inflight(pp: int, vpp: int, rank: int, m: int) -> tuple[int, ...]:
    if vpp == 1:
        return (min(m, pp - rank),)
    remaining = min(m * vpp, (pp - rank - 1) * 2 + (vpp - 1) * pp + 1)
    counts = [0] * vpp
    group = 0
    while remaining > 0 and any(c < m for c in counts):
        c = group % vpp
        add = min(pp, remaining, m - counts[c])
        counts[c] += add
        remaining -= add
        group += 1
    return tuple(counts)


def chunk_activations(model: ModelSpec, layout: Layout, seq_len: int, units: tuple[Unit, ...], cpu: bool) -> float:
    """Saved bytes of one microbatch through one model chunk, after recompute (memoised on CHUNK_FIELDS and the
    chunk's make-up: chunks of different ranks and pipelines that hold the same kinds of layers share it)."""
    return _chunk_sum(model, _chunk_fields(layout), chunk_kinds(model, units), layout, seq_len, units, cpu)


def _chunk_sum(model: ModelSpec, fields_read: tuple, kinds: HashOnce, layout: Layout, seq_len: int,
               units: tuple[Unit, ...], cpu: bool) -> float:
    """chunk_activations, `fields_read` the layout's CHUNK_FIELDS and `kinds` the chunk's make-up (both found
    once for all the chunks of a rank)."""
    return _CHUNK.get((model,), (fields_read, seq_len, kinds, cpu),
                      lambda: sum(chunk_activation_terms(model, layout, seq_len, units, cpu).values()))


def chunk_kinds(model: ModelSpec, units: tuple[Unit, ...]) -> HashOnce:
    """What chunk_activation_terms reads of `units`: each layer's attention kind, MoE and MTP, in order, and
    whether the embedding and the loss are there (found by the units object's identity)."""
    return _CHUNK_KINDS.get_for((model,), units, lambda: HashOnce((
        tuple((model.attention_kind(u.layer), model.layer_is_moe(u.layer), u.is_mtp) for u in units if u.is_layer),
        EMBEDDING in units, LOSS in units)))


def chunk_activation_terms(model: ModelSpec, layout: Layout, seq_len: int, units: tuple[Unit, ...],
                           cpu: bool) -> dict[str, float]:
    """chunk_activations by term: the layer terms summed over the chunk's layers after recompute (and the memory
    levers: search_spaces/cost/offload.py), plus `recompute_inputs` (layer inputs kept by full recompute), `mtp`,
    `embedding` and `head`."""
    return _chunk_terms(model, layout, seq_len, units, cpu)[0]


def chunk_offloaded_bytes(model: ModelSpec, layout: Layout, seq_len: int, units: tuple[Unit, ...],
                          cpu: bool) -> tuple[float, float]:
    """(bytes one microbatch through the chunk keeps on the host under the activation offload, the most one of
    its layers offloads)."""
    _, host, layer_max = _chunk_terms(model, layout, seq_len, units, cpu)
    return host, layer_max


def _chunk_terms(model: ModelSpec, layout: Layout, seq_len: int, units: tuple[Unit, ...],
                 cpu: bool) -> tuple[dict[str, float], float, float]:
    terms: dict[str, float] = {}
    host = layer_max = 0.0
    levers = layout.activation_offload or layout.expert_stash != "none"
    layer_units = [u for u in units if u.is_layer]
    t = layout.mbs * seq_len / layout.cp
    tsp = t / layout.tp if layout.sp else t
    layer_input = tsp * model.hidden_size * act_bytes(layout)
    recomputed = 0
    if layout.recompute_granularity == "full":
        n = layout.recompute_num_layers
        if layout.recompute_method == "uniform":
            recomputed = len(layer_units)
            terms["recompute_inputs"] = math.ceil(len(layer_units) / n) * layer_input
        else:  # block: the first n layers of the chunk are recomputed
            recomputed = min(n, len(layer_units))
            terms["recompute_inputs"] = recomputed * layer_input
    # a layer's terms depend on its attention kind and whether it is MoE: computed once per kind (and added
    # layer by layer, in order, as always)
    saved_by_kind: dict[tuple[str, bool], dict[str, float]] = {}
    host_by_kind: dict[tuple[str, bool], float] = {}
    for i, u in enumerate(layer_units):
        if i >= recomputed:
            kind = (model.attention_kind(u.layer), model.layer_is_moe(u.layer))
            saved = saved_by_kind.get(kind)
            if saved is None:
                saved = saved_by_kind[kind] = saved_terms(layer_activations(model, layout, seq_len, u.layer, cpu),
                                                          layout)
                if levers:
                    saved_by_kind[kind], host_by_kind[kind] = with_levers(
                        model, layout, seq_len, kind[0], kind[1], saved, act_bytes(layout), gemm_input_bytes(layout))
                    saved = saved_by_kind[kind]
            if levers:
                host += host_by_kind[kind]
                layer_max = max(layer_max, host_by_kind[kind])
            for k, v in saved.items():
                terms[k] = terms.get(k, 0.0) + v
            if u.is_mtp:
                terms["mtp"] = terms.get("mtp", 0.0) + mtp_activations(model, layout, seq_len)
    if EMBEDDING in units:  # the token ids (int64) the lookup keeps; under TP the vocab-range mask (bool) too
        terms["embedding"] = t * 8 + (t if layout.tp > 1 else 0)
    if LOSS in units:
        terms["head"] = head_activations(model, layout, seq_len, cpu) * (1 + sum(1 for u in units if u.is_mtp))
    return terms, host, layer_max


def memory_breakdown(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout
                     ) -> MemoryBreakdown:
    """Memory components in bytes on the most loaded pipeline rank (the one with the highest peak); the CP
    attention buffers and the host process are extra_memory's (0 here). Memoised on MEMORY_FIELDS."""
    return _BREAKDOWN.get((model, gpu), (_memory_fields(layout), num_gpus, seq_len),
                          lambda: _most_loaded(model, gpu, num_gpus, seq_len, layout))


def _most_loaded(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout) -> MemoryBreakdown:
    best: tuple[float, RankMemory] | None = None
    for parts in _ranks_parts(model, gpu, num_gpus, seq_len, layout):
        mem = parts.memory(layout, gpu.is_cpu)
        peak = peak_bytes(*mem[:8])
        if best is None or peak > best[0]:
            best = (peak, mem)
    assert best is not None
    return best[1].breakdown()


def _candidate_ranks(place: Placement) -> list[int]:
    # Rank 0 holds the most microbatches in flight, the last rank the output head; the others only matter
    # when the split is uneven. Checking every rank is cheap enough for PP <= 16, sample beyond.
    if place.pp <= 4 or place.method == "even" and place.pp <= 8:
        return list(range(place.pp))
    return sorted({0, 1, place.pp // 2, place.pp - 2, place.pp - 1})


class RankHolds(NamedTuple):
    """What a pipeline rank holds that its features beyond the activations' (graphs, offload, the optimizer's
    sharding) do not change: parameters and the activations in flight."""
    params: RankParams
    per_microbatch: float  # saved activations of one microbatch through all the rank's chunks
    activations: float  # every microbatch in flight, with full recompute's re-materialised group
    head: float  # the output head's share
    counts: RankCounts
    host_activations: float = 0.0  # what the activation offload keeps on the host (every microbatch in flight)


def rank_chunk_activations(model: ModelSpec, layout: Layout, seq_len: int, place: Placement, rank: int,
                           cpu: bool) -> list[float]:
    """chunk_activations of each of the rank's chunks, in order (ranks whose chunks hold the same kinds of layers
    share them: memoised on CHUNK_FIELDS and the chunks' make-ups)."""
    units = place.rank_units(rank)
    kinds = _RANK_KINDS.get_for((model,), units,
                                lambda: HashOnce(chunk_kinds(model, c) for c in place.rank_stages(rank)))
    key = _chunk_fields(layout)
    return _RANK_CHUNKS.get((model,), (key, seq_len, cpu, kinds), lambda: [
        _chunk_sum(model, key, chunk_kind, layout, seq_len, chunk, cpu)
        for chunk_kind, chunk in zip(kinds, place.rank_stages(rank))])


class RankShape(NamedTuple):
    """What a pipeline rank holds whatever the activations' fields: its parameters, the microbatches in flight per
    chunk, whether the output head is there, and these counted."""
    params: RankParams
    inflight: tuple[int, ...]
    has_loss: bool
    counts: RankCounts


def _rank_shape(model: ModelSpec, layout: Layout, place: Placement, rank: int, microbatches: int) -> RankShape:
    """Memoised on (TP, EP, ETP, PP, VPP, rank, microbatches)."""
    def compute() -> RankShape:
        chunks = place.rank_stages(rank)
        params = rank_params(model, layout, place.rank_units(rank))
        counts = _inflight(layout.pp, layout.vpp, rank, max(microbatches, 1))
        held = RankCounts(pipeline_rank=rank, inflight_microbatches=sum(counts) / len(chunks),
                          params_on_rank=params.dense + params.expert, dense_params_on_rank=params.dense,
                          expert_params_on_rank=params.expert)
        return RankShape(params, counts, any(LOSS in c for c in chunks), held)
    return _SHAPE.get((model,), (layout.tp, layout.ep, layout.etp, layout.pp, layout.vpp, rank, microbatches), compute)


def _rank_holds(model: ModelSpec, cpu: bool, num_gpus: int, seq_len: int, layout: Layout, place: Placement,
                rank: int) -> RankHolds:
    shape = _rank_shape(model, layout, place, rank, layout.grad_accum(num_gpus) or 1)
    per_chunk = rank_chunk_activations(model, layout, seq_len, place, rank, cpu)
    activations = sum(n * a for n, a in zip(shape.inflight, per_chunk))
    if layout.recompute_granularity == "full":
        # the recomputed group's activations are re-materialised during its backward
        biggest = max((layer_saved_bytes(layer_activations(model, layout, seq_len, i, cpu), layout)
                       for i in range(min(model.num_layers, 4))), default=0.0)
        activations += biggest * min(layout.recompute_num_layers, 4)
    head = head_activations(model, layout, seq_len, cpu) if shape.has_loss else 0.0
    if not layout.activation_offload:
        return RankHolds(shape.params, sum(per_chunk), activations, head, shape.counts)
    # the offloaded inputs of every microbatch in flight are on the host; the layers in transit are on the GPU too
    offloads = [chunk_offloaded_bytes(model, layout, seq_len, chunk, cpu) for chunk in place.rank_stages(rank)]
    host = sum(n * chunk_host for n, (chunk_host, _) in zip(shape.inflight, offloads))
    in_transit = RESIDENT_LAYERS * max((layer for _, layer in offloads), default=0.0)
    return RankHolds(shape.params, sum(per_chunk), activations + in_transit, head, shape.counts, host)


class RankParts(NamedTuple):
    """What a pipeline rank's memory is before the features that only add to it (CUDA graphs, optimizer
    offload): bytes of weights, gradients, optimizer states (all of them; `moments` of them Adam's moments, what
    optimizer offload moves), the dispatcher's buffers, the runtime, and what it holds."""
    weights: float
    gradients: float
    optimizer: float
    moments: float
    dispatcher: float
    runtime: float
    holds: RankHolds

    def memory(self, layout: Layout, cpu: bool) -> RankMemory:
        """The rank's components with the layout's CUDA graphs and optimizer offload."""
        activations = self.holds.activations
        offloaded = self.moments * layout.optimizer_offload  # the fp32 master shard stays on the GPU
        host = self.optimizer * layout.optimizer_offload + self.holds.host_activations  # moments + the master's copy
        graphs = 0.0
        if layout.cuda_graphs:
            if "full_iteration" in layout.cuda_graphs:
                graphs = full_iteration_graph_bytes(activations)
            else:
                graphs = GRAPH_SCOPE_BUFFER * len(layout.cuda_graphs)
        base = self.weights + self.gradients + (self.optimizer - offloaded) + activations + self.dispatcher + graphs
        margin = 0.0 if cpu else ALLOCATOR_MARGIN * base
        return RankMemory(self.weights, self.gradients, self.optimizer - offloaded, activations, self.dispatcher,
                          graphs, self.runtime, margin, host, self.holds)


def full_iteration_graph_bytes(activations: float) -> float:
    """What a full-iteration CUDA graph holds beyond the activations it captures (FULL_ITERATION_POOL_EXCESS)."""
    return FULL_ITERATION_POOL_EXCESS * activations


class RankMemory(NamedTuple):
    """One pipeline rank's memory components (bytes), the peak's first (breakdown.peak_bytes' order), before a
    MemoryBreakdown is built for the most loaded rank."""
    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    dispatcher_buffers: float
    cuda_graphs: float
    runtime_overhead: float
    allocator_margin: float
    offloaded_to_host: float
    holds: RankHolds

    def breakdown(self) -> MemoryBreakdown:
        return MemoryBreakdown(weights=self.weights, gradients=self.gradients, optimizer_states=self.optimizer_states,
                               activations=self.activations, dispatcher_buffers=self.dispatcher_buffers,
                               cuda_graphs=self.cuda_graphs, runtime_overhead=self.runtime_overhead,
                               allocator_margin=self.allocator_margin,
                               activations_per_microbatch=self.holds.per_microbatch,
                               embedding_logits=self.holds.head, offloaded_to_host=self.offloaded_to_host,
                               counts=self.holds.counts)


def _ranks_parts(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout
                 ) -> tuple[RankParts, ...]:
    """The parts of every pipeline rank that can be the most loaded (memoised on RANK_PARTS_FIELDS: a space's
    candidates of one grid and recompute differ in graphs and offload)."""
    def compute() -> tuple[RankParts, ...]:
        place = placement(model, layout.pp, layout.vpp)
        if place is None:
            raise ValueError("layout has no pipeline placement (check rules first)")
        return tuple(_rank_parts(model, gpu, num_gpus, seq_len, layout, place, rank)
                     for rank in _candidate_ranks(place))
    return _PARTS.get((model, gpu), (_parts_fields(layout), num_gpus, seq_len), compute)


def _rank_parts(model, gpu, num_gpus, seq_len, layout, place, rank) -> RankParts:
    cpu = gpu.is_cpu
    holds = _rank_holds(model, cpu, num_gpus, seq_len, layout, place, rank)
    params = holds.params
    wb = weight_bytes(layout)
    fp8 = gemm_input_bytes(layout) == 1
    # fp8 parameters: the fp8 copy is the weight (the fp32 master stays in the optimizer's share)
    weights = (params.dense + params.expert) * (1 if layout.fp8_param_gather else wb + (1 if fp8 else 0))
    gradients = (params.dense + params.expert) * grad_bytes(layout)
    opt_per_param = optimizer_bytes_per_param(layout, wb)
    dp = max(layout.dp(num_gpus), 1)
    edp = max(layout.edp(num_gpus), 1)
    if layout.distributed_optimizer:
        opt = opt_per_param * (params.dense / (dp * layout.cp) + params.expert / edp)
    else:
        opt = opt_per_param * (params.dense + params.expert)
    dispatcher = _dispatcher_bytes(model, gpu, layout, seq_len) if model.is_moe else 0.0
    moments = opt * moment_bytes_per_param(layout) / opt_per_param
    return RankParts(weights, gradients, opt, moments, dispatcher, 0.0 if cpu else RUNTIME_OVERHEAD, holds)


def _rank_memory(model, gpu, num_gpus, seq_len, layout, place, rank) -> MemoryBreakdown:
    return _rank_parts(model, gpu, num_gpus, seq_len, layout, place, rank).memory(layout, gpu.is_cpu).breakdown()


def _dispatcher_bytes(model: ModelSpec, gpu: GPUSpec, layout: Layout, seq_len: int) -> float:
    """The MoE dispatcher's buffers on a rank."""
    cpu = gpu.is_cpu
    t = layout.mbs * seq_len / layout.cp
    tsp = t / layout.tp if layout.sp else t
    if layout.dispatcher == "hybridep" and not cpu:
        return hybridep_buffer_bytes(model, gpu, layout, tsp)
    if layout.dispatcher in DISPATCHER_BUFFER and not cpu:
        return DISPATCHER_BUFFER[layout.dispatcher]
    if layout.dispatcher == "allgather":
        return tsp * layout.ep * layout.tp * model.hidden_size * act_bytes(layout)
    return 2 * tsp * model.topk * model.hidden_size * act_bytes(layout)  # alltoall: send and receive, transient


def rank_memory_breakdown(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
                          rank: int) -> MemoryBreakdown:
    """The memory components (bytes) of one pipeline rank (memory_breakdown gives the most loaded one; this
    one compares with a measurement of that rank)."""
    place = placement(model, layout.pp, layout.vpp)
    if place is None:
        raise ValueError("layout has no pipeline placement (check rules first)")
    return _rank_memory(model, gpu, num_gpus, seq_len, layout, place, rank)
