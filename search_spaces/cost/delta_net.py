"""Gated delta-net (Qwen3-Next's linear attention) as Megatron-Core runs it at length: flash-linear-attention's
chunked delta rule, its sequential state pass, its saved chunk states, and what CP and recompute do to them.

The kernels (fla-org/flash-linear-attention, fla/ops/gated_delta_rule/chunk.py, `chunk_gated_delta_rule_fwd`):
chunks of CHUNK = 64 tokens (`chunk_local_cumsum(g, chunk_size=64)`); per chunk the WY representation (k k^T,
a triangular solve, w = A k beta, u = A v beta) and the output (intra-chunk q k^T and its product with the new
values, plus q times the chunk's state) run in parallel over chunks; the state pass
(`chunk_gated_delta_rule_fwd_h`, grid `(V / BV, N * H)`) walks the chunks one after another, per sequence, head and
BV-wide slice of the value width. The backward recomputes the state pass and runs its reverse (`..._bwd_dhu`): three
sequential passes per layer and microbatch. The states `h = k.new_empty(B, NT, H, K, V)` (one K x V matrix per chunk
and head, in the activations' dtype) live while a pass runs, with their gradients in the backward.
Under CP Megatron-Core all-to-alls the layer's inputs from sequence to heads (throughput.linear_attention_cp_time):
each rank then runs the whole sequence for H / (TP x CP) heads -- the same parallel work, but the state pass keeps
its full length of sequential chunk steps and has fewer heads to spread over the SMs: at 64K tokens with 2 heads
per rank, 4 thread blocks walk 1,024 chunks while the other SMs idle. That, not FLOPs, is why a hybrid model
scales CP badly (Megatron-Bridge's long-context card: Qwen3-Next 80B ~270 TF/s at 8K/CP1, ~100 at 64K/CP16).
Full recompute repeats the forward: the parallel kernels and one more state pass.
Pure functions of (model, layout, GPU, length) returning seconds or bytes.
"""

from __future__ import annotations

import math

from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.layouts.layout import Layout

CHUNK = 64  # FLA's chunk size
STATE_BLOCK_V = 64  # BV: the value width one state-pass block carries (FLA autotunes 32 or 64)
# sequential passes over the chunks per layer and microbatch: forward; backward = recomputed forward + reverse
STATE_PASSES_FWD, STATE_PASSES_BWD = 1, 2
# one chunk step of one state-pass block (load k, w (64 x 128 each) and u (64 x BV), two 64-deep products with the
# 128 x BV state, store the state and the new values, the next step waiting on them) takes the calibration's
# `delta_net_state_step_s`: no published timing of this kernel exists, so it is fitted on the published Qwen3-Next
# rows, whose CP (1, 4, 16) is what moves it (bench/fit_calibration.py, CALIBRATION.md)
# state-pass blocks resident per SM (small Triton kernels, 4 warps; assumed)
BLOCKS_PER_SM = 2
BACKWARD_FLOPS_RATIO = 2.5  # backward over forward FLOPs of the parallel kernels (as flash attention's)


def heads_per_rank(model: ModelSpec, layout: Layout) -> float:
    """Value heads one rank runs: TP splits them, CP's all-to-all splits them again."""
    return model.linear_num_value_heads / (layout.tp * layout.cp)


def rule_flops_per_token_head(model: ModelSpec) -> float:
    """Forward FLOPs per token and value head of the chunked delta rule alone (FLA's chunk_gated_delta_rule):
    k k^T, the triangular solve, w and u (C (2 dk + dv)), the intra-chunk output (C (dk + dv)), q h, u - w h and
    the state update (3 dk dv); 2 FLOPs per multiply-add."""
    dk, dv, c = model.linear_key_head_dim, model.linear_value_head_dim, CHUNK
    return 2 * (c * (3 * dk + 2 * dv) + c * c / 3 + 3 * dk * dv)


def chunked_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of one delta-net layer's chunked kernels, all value heads: the delta rule and the
    short causal convolution over q, k and v (Bridge counts it with the projections)."""
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    conv = model.linear_conv_kernel_dim * (2 * dk * model.linear_num_key_heads + dv * model.linear_num_value_heads)
    return rule_flops_per_token_head(model) * model.linear_num_value_heads + 2 * conv


def parallel_time(model: ModelSpec, layout: Layout, tokens_mb: float, rate: float, recompute: bool) -> float:
    """Seconds of the chunk-parallel kernels of one layer per microbatch on one rank (fwd + bwd; the forward twice
    under full recompute): the rank's share of the tokens times the heads, at `rate` FLOP/s."""
    fwd = chunked_flops_per_token(model) * tokens_mb / (layout.tp * layout.cp) / rate
    return fwd * (1 + BACKWARD_FLOPS_RATIO + (1 if recompute else 0))


def state_pass_time(model: ModelSpec, layout: Layout, gpu: GPUSpec, seq_len: int, recompute: bool,
                    step_s: float) -> float:
    """Seconds of the sequential state passes of one layer per microbatch: chunk steps of the whole sequence
    (`step_s` each), in waves of the blocks the rank's heads give (mbs x heads x value width / BV) over the SMs."""
    passes = STATE_PASSES_FWD + STATE_PASSES_BWD + (1 if recompute else 0)
    return passes * math.ceil(seq_len / CHUNK) * state_waves(model, layout, gpu) * step_s


def state_waves(model: ModelSpec, layout: Layout, gpu: GPUSpec) -> int:
    """Waves of state-pass blocks (mbs x the rank's heads x value width / BV) over the SMs."""
    blocks = layout.mbs * heads_per_rank(model, layout) * model.linear_value_head_dim / STATE_BLOCK_V
    return max(1, math.ceil(blocks / (gpu.sms * BLOCKS_PER_SM)))


def layer_time(model: ModelSpec, layout: Layout, gpu: GPUSpec, seq_len: int, rate: float, step_s: float
               ) -> tuple[float, float]:
    """(fwd + bwd seconds, of which recomputed forward) of one delta-net layer per microbatch on one rank: the
    parallel kernels at `rate` FLOP/s, the state passes at `step_s` per chunk step."""
    recompute = layout.recompute_granularity == "full"
    tokens = layout.mbs * seq_len
    total = parallel_time(model, layout, tokens, rate, recompute) + state_pass_time(model, layout, gpu, seq_len,
                                                                                   recompute, step_s)
    again = 0.0
    if recompute:  # the repeated forward: its parallel kernels and one state pass
        again = parallel_time(model, layout, tokens, rate, False) / (1 + BACKWARD_FLOPS_RATIO) \
            + state_pass_time(model, layout, gpu, seq_len, False, step_s) / (STATE_PASSES_FWD + STATE_PASSES_BWD)
    return total, again


def chunk_state_bytes(model: ModelSpec, layout: Layout, seq_len: int, act_bytes: int) -> float:
    """Peak bytes of one layer's chunk states: the states and, in the backward, their gradients (two K x V
    matrices per chunk and head of the rank, in the activations' dtype); one layer at a time."""
    if "L" not in model.attention_pattern:
        return 0.0
    chunks = layout.mbs * math.ceil(seq_len / CHUNK)
    return 2 * chunks * heads_per_rank(model, layout) * model.linear_key_head_dim * model.linear_value_head_dim \
        * act_bytes


__all__ = ["rule_flops_per_token_head", "chunked_flops_per_token", "state_waves", "state_pass_time", "layer_time",
           "chunk_state_bytes", "heads_per_rank"]
