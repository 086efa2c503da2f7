"""Packed batches (THD) drawn from a document-length histogram, as Megatron-Core takes them.

Each sequence of seq_len tokens is built by search_spaces.cost.packing.DocumentStream (the cost model's own rule:
whole documents, each padded to a multiple of 2*CP, times TP with sequence parallelism; the unfilled tail pads
the last one). A microbatch of mbs sequences is one THD pack of mbs*seq_len tokens with batch dimension 1:
`PackedSeqParams(qkv_format="thd", cu_seqlens_q/kv` over the real lengths, `cu_seqlens_q/kv_padded` over the
padded ones). Under CP each padded document is cut into 2*CP chunks and CP rank r keeps chunks r and
2*CP-1-r of every document (Transformer Engine's thd_get_partitioned_indices; Megatron's THD RoPE reads the
same layout). Padding tokens have loss mask 0: they are computed, never counted as tokens.

`thd_token_positions` is the one description of that layout: which document and which position in it each
token a rank holds is, from which the CPU core attention builds its mask (trainers/cp_attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from search_spaces.cost.packing import DocumentStream, LengthHistogram, pack_sequence


def packed_capability_gap(model, on_cpu: bool) -> str | None:
    """What this trainer cannot run packed: on CPU the gated delta-net's reference convolution takes no packed
    sequences (trainers/cpu_linear_attention.py); GPUs run Megatron's own kernels."""
    if on_cpu and "linear" in model.attention_kinds():
        return "packed documents with gated delta-net layers need the GPU kernels (the CPU stand-ins take none)"
    return None


def thd_token_positions(cu_seqlens_padded: torch.Tensor, cp_rank: int, cp_size: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(document index, position within the padded document, index in the whole pack) of each token CP rank
    `cp_rank` holds, in its order: document by document, its chunks r and 2*CP-1-r."""
    docs, positions, index = [], [], []
    bounds = cu_seqlens_padded.tolist()
    for doc, (start, end) in enumerate(zip(bounds, bounds[1:])):
        length = end - start
        if cp_size > 1:
            chunk = length // (2 * cp_size)
            local = torch.cat([torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk),
                               torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)])
        else:
            local = torch.arange(length)
        docs.append(torch.full((len(local),), doc, dtype=torch.long))
        positions.append(local)
        index.append(local + start)
    return torch.cat(docs), torch.cat(positions), torch.cat(index)


@dataclass
class PackedStep:
    """One step's global batch: per sequence its real document lengths."""
    documents: list[list[int]]

    @property
    def real_tokens(self) -> int:
        return sum(sum(d) for d in self.documents)


class PackedTokens:
    """The trainer's data when packing: SyntheticTokens' token values, cut into documents drawn from `hist`.
    Every rank draws the same documents for a step (seeded by the step)."""

    def __init__(self, tokens, hist: LengthHistogram, multiple: int):
        self.tokens, self.hist, self.multiple = tokens, hist, multiple
        self.seq_len, self.gbs, self.mbs = tokens.seq_len, tokens.gbs, tokens.mbs
        self._steps: dict[int, PackedStep] = {}

    def step(self, step: int) -> PackedStep:
        if step not in self._steps:
            stream = DocumentStream(self.hist, self.seq_len, self.multiple, seed=self.tokens.seed * 100_003 + step)
            self._steps[step] = PackedStep(stream.next_sequences(self.gbs))
        return self._steps[step]

    def microbatches(self, step: int, dp_rank: int, dp_size: int, device, cp_group=None):
        from megatron.core.packed_seq_params import PackedSeqParams

        rows = self.tokens.global_batch(step).chunk(dp_size)[dp_rank]
        per_rank = self.gbs // dp_size
        docs = self.step(step).documents[dp_rank * per_rank:(dp_rank + 1) * per_rank]
        cp_size = cp_group.size() if cp_group is not None else 1
        cp_rank = cp_group.rank() if cp_group is not None else 0
        for start in range(0, rows.shape[0], self.mbs):
            cu, cu_padded, loss_mask = [0], [0], []
            for row in range(start, start + self.mbs):
                real, padded = pack_sequence(docs[row], self.seq_len, self.multiple)
                offset = cu_padded[-1]
                for (a, b), (pa, pb) in zip(zip(real, real[1:]), zip(padded, padded[1:])):
                    cu.append(cu[-1] + (b - a))
                    cu_padded.append(offset + pb)
                    loss_mask += [1.0] * (b - a) + [0.0] * ((pb - pa) - (b - a))
            tokens = rows[start:start + self.mbs]
            inputs = tokens[:, :-1].reshape(1, -1)
            labels = tokens[:, 1:].reshape(1, -1)
            mask = torch.tensor(loss_mask).view(1, -1)
            cu_padded_t = torch.tensor(cu_padded, dtype=torch.int32)
            doc, position, index = thd_token_positions(cu_padded_t, cp_rank, cp_size)
            lengths = [b - a for a, b in zip(cu_padded, cu_padded[1:])]
            params = PackedSeqParams(
                qkv_format="thd", cu_seqlens_q=torch.tensor(cu, dtype=torch.int32).to(device),
                cu_seqlens_kv=torch.tensor(cu, dtype=torch.int32).to(device),
                cu_seqlens_q_padded=cu_padded_t.to(device), cu_seqlens_kv_padded=cu_padded_t.to(device),
                max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
            params.pack_rows = self.mbs  # the CPU attention attends each sequence of the pack apart
            yield {"tokens": inputs[:, index].to(device), "labels": labels[:, index].to(device),
                   "loss_mask": mask[:, index].to(device), "position_ids": position.view(1, -1).to(device),
                   "packed_seq_params": params}

    def report(self, steps: range) -> dict:
        """Real tokens and padding over the measured steps."""
        real = sum(self.step(s).real_tokens for s in steps) / max(len(steps), 1)
        total = self.gbs * self.seq_len
        return {"packing": "packed", "pad_multiple": self.multiple, "real_tokens_per_step": real,
                "useful_token_share": real / total, "padding_share": 1.0 - real / total,
                "documents_per_sequence": sum(len(d) for s in steps for d in self.step(s).documents)
                / max(len(steps) * self.gbs, 1)}
