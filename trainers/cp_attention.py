"""Context-parallel core attention for CPU runs.

Megatron-Core's local DotProductAttention refuses CP (its CP lives in Transformer Engine). This module
follows Megatron's CP semantics so CP layouts can be measured on CPU:
- the sequence is cut into 2·CP chunks and CP rank r holds chunks r and 2·CP-1-r (load balancing for the
  causal mask; `get_batch_on_this_cp_rank` does the cut);
- K and V are all-gathered over the CP group with Megatron's own autograd mapping (the backward is a
  reduce-scatter), which is the `all_gather` cp_comm_type;
- the causal mask is built from global token positions, so the result equals the CP=1 attention.
Packed documents (THD, `packed_seq_params`): a token sees the earlier tokens of its own document only, the pack
laid out as trainers/packed_batches.py describes it (each document's 2*CP chunks under CP).
It also serves MLA on CPU at any CP: Megatron-Core 0.19.2's MLA passes k_channels/v_channels (query/key and
value head widths differ), which the local DotProductAttention does not accept.

And it stands in for Transformer Engine's sliding-window and attention-sink attention (gpt-oss) at any CP:
a query at global position i sees keys in [i - window_size[0], i + window_size[1]] on the layers
`is_layer_window_attention` picks, and `softmax_type` adds a per-head sink logit to the softmax denominator
(learnable: the `softmax_offset` parameter TE and Megatron keep per TP rank). The learnable sinks are drawn
full-size and sliced per TP rank, like every CPU-initialised TP weight, so TP does not change the model.
"""

from __future__ import annotations

import math

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.utils import is_layer_window_attention


def cp_chunk_positions(cp_rank: int, cp_size: int, local_len: int) -> torch.Tensor:
    """Global positions of the tokens CP rank `cp_rank` holds (its two load-balanced chunks)."""
    chunk = local_len // 2
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)
    return torch.cat([first, second])


class ContextParallelDotProductAttention(MegatronModule):
    """Drop-in for the local spec's core_attention (same constructor and forward signature)."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, cp_comm_type=None, pg_collection=None, k_channels=None, v_channels=None):
        super().__init__(config=config)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        self.heads = config.num_attention_heads // tp
        self.query_groups = (config.num_query_groups or config.num_attention_heads) // tp
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(k_channels or config.kv_channels)
        self.cp_group = parallel_state.get_context_parallel_group()
        self.cp_size = parallel_state.get_context_parallel_world_size()
        self.cp_rank = parallel_state.get_context_parallel_rank()
        windowed = is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number)
        self.window_size = tuple(config.window_size) if windowed else None
        if self.window_size is not None and self.window_size[1] not in (0, -1):
            raise NotImplementedError(f"causal attention with a look-ahead window {self.window_size}")
        self.softmax_offset = _softmax_offset(config, tp, parallel_state.get_tensor_model_parallel_rank())

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if attention_bias is not None:
            raise NotImplementedError("CPU context-parallel attention does not support an attention bias")
        if packed_seq_params is not None:
            return self._packed(query, key, value, packed_seq_params)
        local_len = query.shape[0]
        if self.cp_size > 1:
            key = gather_from_sequence_parallel_region(key, True, self.cp_group)
            value = gather_from_sequence_parallel_region(value, True, self.cp_group)
            key_pos = torch.cat([cp_chunk_positions(r, self.cp_size, local_len) for r in range(self.cp_size)])
            query_pos = cp_chunk_positions(self.cp_rank, self.cp_size, local_len)
        else:
            key_pos = query_pos = torch.arange(local_len)
        return self._attend(query, key, value, self._hidden(query_pos, key_pos))

    def _packed(self, query, key, value, packed_seq_params):
        """THD: [tokens, heads, dim] of documents packed back to back (trainers/packed_batches.py's layout);
        a token sees the earlier tokens of its own document only. A pack of several sequences (its `pack_rows`,
        set by the trainer) is attended row by row, as a batch: no document crosses a row, and Transformer
        Engine's THD kernels never form the scores of one row against another (a dense [pack, pack] would
        hold MBS^2 the probabilities). The mask is built per layer, as the unpacked path's is."""
        from trainers.packed_batches import thd_token_positions

        if packed_seq_params.qkv_format != "thd":
            raise NotImplementedError(f"packed sequences in {packed_seq_params.qkv_format} format")
        cu = packed_seq_params.cu_seqlens_q_padded
        cu = (cu if cu is not None else packed_seq_params.cu_seqlens_q).cpu()
        rows = getattr(packed_seq_params, "pack_rows", 1)
        local, heads, dim = query.shape
        width = local // rows  # a row's tokens on this rank: rows are whole sequences, documents padded to 2*CP
        if self.cp_size > 1:
            key = gather_from_sequence_parallel_region(key, True, self.cp_group)
            value = gather_from_sequence_parallel_region(value, True, self.cp_group)
        query_doc, query_pos, _ = thd_token_positions(cu, self.cp_rank, self.cp_size)
        held = [thd_token_positions(cu, r, self.cp_size) for r in range(self.cp_size)]
        key_doc, key_pos = (torch.stack([h[i] for h in held]) for i in (0, 1))  # [CP, tokens of a rank]

        def by_row(t):  # [CP * local, ...] (rank-major) -> [rows, CP * width, ...]: each row's keys of every rank
            t = t.reshape(self.cp_size, rows, width, *t.shape[1:]).transpose(0, 1)
            return t.reshape(rows, self.cp_size * width, *t.shape[3:])

        hidden = self._hidden(query_pos.view(rows, width), by_row(key_pos.reshape(-1)))
        hidden = (hidden | (query_doc.view(rows, width, 1) != by_row(key_doc.reshape(-1)).unsqueeze(1))).unsqueeze(1)
        context = self._attend(query.view(rows, width, heads, dim).transpose(0, 1), by_row(key).transpose(0, 1),
                               by_row(value).transpose(0, 1), hidden)  # [width, rows, heads * dim]
        return context.transpose(0, 1).reshape(local, -1)  # [t, heads * dim], as TE returns THD

    def _attend(self, query, key, value, hidden):
        """Softmax attention of [s, b, heads, dim] queries over keys, `hidden` [queries, keys] masked out."""
        local_len, batch = query.shape[0], query.shape[1]
        if self.heads > self.query_groups:  # grouped-query attention
            key = key.repeat_interleave(self.heads // self.query_groups, dim=2)
            value = value.repeat_interleave(self.heads // self.query_groups, dim=2)
        # [s, b, heads, dim] -> [b, heads, s, dim]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.softmax_scale
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = sink_softmax(scores.float(), self.softmax_offset).to(q.dtype)
        context = torch.matmul(probs, v)
        return context.permute(2, 0, 1, 3).reshape(local_len, batch, -1)

    def _hidden(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """[..., queries, keys] True where a query may not look: the future, and outside its sliding window."""
        distance = query_pos[..., :, None] - key_pos[..., None, :]  # (batched over leading dimensions)
        hidden = distance < 0
        if self.window_size is not None and self.window_size[0] >= 0:
            hidden = hidden | (distance > self.window_size[0])
        return hidden


def sink_softmax(scores: torch.Tensor, sink) -> torch.Tensor:
    """Softmax over the last dimension of [b, heads, q, k] scores with an extra per-head logit `sink` in the
    denominator (no sink: the plain softmax). A fully masked row gives zeros plus the sink's share."""
    if sink is None:
        return torch.softmax(scores, dim=-1)
    column = sink.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def _softmax_offset(config, tp: int, tp_rank: int):
    """The per-head sink logits of this TP rank: a parameter (learnable), zeros (off-by-one) or None."""
    heads = config.num_attention_heads
    if config.softmax_type == "vanilla":
        return None
    if config.softmax_type == "off-by-one":
        return torch.zeros(heads // tp)
    full = torch.empty(heads, dtype=torch.float32)
    if config.perform_initialization:
        config.init_method(full)
    offset = torch.nn.Parameter(full.chunk(tp)[tp_rank].clone().to(config.params_dtype))
    # Megatron's dynamic TP attributes on Parameters (unknown to torch's types)
    offset.tensor_model_parallel = tp > 1  # type: ignore[attr-defined]
    offset.partition_dim, offset.partition_stride = 0, 1  # type: ignore[attr-defined]
    return offset
