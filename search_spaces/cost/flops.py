"""Model FLOPs per training step, counted exactly as Megatron-Bridge's flop_utils counts them.

Published TF/s (../shared/reference) use `num_floating_point_operations` in
megatron/bridge/training/utils/flop_utils.py: fwd+bwd = 3x forward, 2 FLOPs per FMA, causal attention
counts half the square, MTP layers count as extra (MoE) layers plus their eh-projection, the logit layer
is counted once per output head on the vocabulary padded to a multiple of 128. Recompute is NOT counted
(see `recompute_flops_per_step` in throughput.py for the work the GPU really does).
"""

from __future__ import annotations

from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.memo import Memo

_PER_STEP = Memo("flops per step")

MAKE_VOCAB_DIVISIBLE_BY = 128


def padded_vocab_size(vocab: int, tp: int = 1) -> int:
    multiple = MAKE_VOCAB_DIVISIBLE_BY * tp
    return -(-vocab // multiple) * multiple


def _attention_core_per_token(model: ModelSpec, kind: str, seq_len: int) -> float:
    """Forward FMAs per token of the core attention (QK^T and AV) of one layer; causal = half the square."""
    if kind == "linear":
        return 0.0
    if model.is_mla:
        n = model.num_attention_heads
        return seq_len * n * model.q_head_dim / 2 + seq_len * n * model.v_head_dim / 2
    q = model.num_attention_heads * model.head_dim
    if kind == "sliding":
        w = model.sliding_window + 1  # Bridge passes window_size=(W, 0): W previous tokens plus itself
        context = w - w * (w - 1) / (2 * seq_len) if w < seq_len else seq_len / 2
        return q * context * 2
    return q * seq_len / 2 * 2


def _attention_proj_per_token(model: ModelSpec, kind: str) -> float:
    """Forward FMAs per token of the projections of one attention layer (Bridge's terms, incl. norms)."""
    h = model.hidden_size
    if kind == "linear":
        qk = model.linear_key_head_dim * model.linear_num_key_heads
        v = model.linear_value_head_dim * model.linear_num_value_heads
        nv = model.linear_num_value_heads
        return (h * (2 * qk + 2 * v + 2 * nv) + model.linear_conv_kernel_dim * (2 * qk + v)
                + nv * model.linear_value_head_dim ** 2 * 4 + h * v)
    n = model.num_attention_heads
    if model.is_mla:
        qk, rope, vd = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        q = model.q_lora_rank * (h + n * (qk + rope) + 1) if model.q_lora_rank else h * n * (qk + rope)
        kv = model.kv_lora_rank * (h + n * (qk + vd) + 1) + h * rope
        return q + kv + n * vd * h
    q = model.head_dim * n
    kv = model.head_dim * model.num_kv_heads
    gate = q if model.attention_output_gate else 0
    return h * (q + 2 * kv + gate) + q * h


def linear_attention_core_per_token(model: ModelSpec, kind: str) -> float:
    """Forward FMAs per token of a gated delta-net layer that are not its projections (Bridge counts them among
    the projections): the short convolution over q, k, v and the recurrent state update (4 dv^2 per value head).
    They run in the chunked delta-rule kernels, not as GEMMs (the cost terms' `linear_attention_layer_time`)."""
    if kind != "linear":
        return 0.0
    qk = model.linear_key_head_dim * model.linear_num_key_heads
    v = model.linear_value_head_dim * model.linear_num_value_heads
    return (model.linear_conv_kernel_dim * (2 * qk + v)
            + model.linear_num_value_heads * model.linear_value_head_dim ** 2 * 4)


def flops_breakdown(model: ModelSpec, seq_len: int, gbs: int = 1) -> dict[str, float]:
    """Training FLOPs of one step (gbs sequences of seq_len tokens) per component, Bridge accounting."""
    tokens = float(seq_len) * gbs
    h = model.hidden_size
    glu = 3 if model.gated_mlp else 2
    mtp = model.mtp_layers
    n_layers = model.num_layers + mtp
    moe_layers = model.num_moe_layers
    dense_layers = model.num_dense_layers
    if mtp:  # MTP blocks are MoE when the last decoder layer is
        if model.layer_is_moe(model.num_layers - 1):
            moe_layers += mtp
        else:
            dense_layers += mtp
    kinds = [model.attention_kind(i) for i in range(n_layers)]
    out = {
        "mlp_dense": 6 * h * model.ffn_hidden_size * glu * dense_layers,
        "mlp_routed": 6 * h * model.moe_ffn_hidden_size * model.topk * glu * moe_layers,
        "mlp_shared": 6 * h * model.shared_expert_ffn_hidden_size * glu * moe_layers,
        "attention_proj": 6 * sum(_attention_proj_per_token(model, k) for k in kinds),
        "attention_core": 6 * sum(_attention_core_per_token(model, k, seq_len) for k in kinds),
        "mtp_proj": 6 * mtp * (3 * h + 2 * h * h),
        "logits": 6 * h * padded_vocab_size(model.vocab_size) * (mtp + 1),
    }
    return {k: v * tokens for k, v in out.items()}


def flops_per_step(model: ModelSpec, seq_len: int, gbs: int) -> float:
    """Model FLOPs of one optimizer step over gbs sequences of seq_len tokens (recompute not counted; once per
    model, length and batch)."""
    return _PER_STEP.get((model,), (seq_len, gbs), lambda: float(sum(flops_breakdown(model, seq_len, gbs).values())))


def flops_per_token(model: ModelSpec, seq_len: int) -> float:
    return flops_per_step(model, seq_len, 1) / seq_len
