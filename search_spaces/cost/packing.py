"""Packed documents (THD): how a document-length histogram changes a step's attention, its padding and its
useful tokens.

Real long-context data is packed: whole documents of many lengths share one sequence of `seq_len` tokens
(Megatron-Core's THD format, `PackedSeqParams.cu_seqlens`), attention is causal within each document, so a
sequence's attention costs the sum of d_i^2 over its documents instead of seq_len^2.

How sequences are built (`packed_statistics`, one rule for the cost model and the trainer's batches):
- Under context parallelism Transformer Engine splits each document into 2*CP chunks (rank r holds chunks r and
  2*CP-1-r), so Megatron pads each document to a multiple of 2*CP, times TP with sequence parallelism
  (`pad_multiple`); without CP documents are not padded. Padding is spent compute, never a useful token.
- Whole padded documents are packed first-fit-decreasing into sequences of seq_len tokens, never cut (Megatron-
  Bridge's packed sequences); the tail of a sequence that no next document fits is padding too. The number of
  sequences is FFD's as a fluid: a document longer than half a sequence takes one of its own, shorter ones fill
  the gaps they leave, the rest fills whole sequences. Every term of a step is additive over documents, so the
  expected attention per sequence is the dataset's sum over documents divided by its sequences.
- With every document seq_len tokens long this is one document per sequence and today's figures exactly
  (tests/search_spaces/test_packing.py).

What Transformer Engine 2.20 (@d0067d0, attention/dot_product_attention/context_parallel.py and utils.py) does
with THD under CP, per cp_comm_type: p2p and a2a+p2p (AttnFuncWithCPAndKVP2P), all_gather
(AttnFuncWithCPAndKVAllGather: "THD always uses padding mask types") and a2a (AttnFuncWithCPAndQKVOA2A, with
cu_seqlens_padded) all accept THD, given cu_seqlens_q/kv_padded (Megatron passes them). The refusals that remain
do not depend on the format and are rules already (search_spaces/layouts/rules.py: sliding windows not with p2p, sinks
with a2a only, 256-wide heads on Blackwell). THD's own: padding between documents turns FlashAttention 2/4 off
(FusedAttention or FA3 run); attention sinks with THD need cuDNN >= 9.18 and FP8 attention with THD under CP has
no backend -- neither is a layout field here (cuDNN is the container's; fp8 attention is not a knob), so no
rule refuses them. The cost model's terms see THD through the kernel length per document (throughput.py).

The histogram file (`moe-autotune lengths` writes it): JSON {"format": HISTOGRAM_FORMAT, "lengths": [...],
"counts": [...], ...} -- document lengths in tokens (ascending, positive integers) and how many documents have
each (non-negative, not all zero); other keys (source, sampling) are kept as its summary.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from search_spaces.cost.memo import Memo
from search_spaces.errors import SpecError

HISTOGRAM_FORMAT = "moe-autotune document lengths v1"
MAX_HISTOGRAM_BINS = 4096  # the lengths command writes ~8 bins per doubling (<= 150); a bound, not a target
MAX_HISTOGRAM_BYTES = 4 << 20
PACKINGS = ("full", "packed")

_STATS = Memo("packed statistics")


@dataclass(frozen=True, eq=False)
class LengthHistogram:
    """Document lengths of a dataset: `counts[i]` documents of `lengths[i]` tokens. Compared by identity (the
    memo tables of the cost model are found by the identity of the situation's objects: search_spaces/cost/memo.py)."""
    lengths: tuple[int, ...]
    """Document lengths in tokens, ascending, each once."""
    counts: tuple[float, ...]
    """Documents of each length (a sample's counts or a share: only the proportions matter)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """What the file says of its source (path, documents read, sampling bound): recorded, not computed with."""

    @property
    def documents(self) -> float:
        return sum(self.counts)

    @property
    def mean(self) -> float:
        return sum(d * c for d, c in zip(self.lengths, self.counts)) / self.documents

    @property
    def longest(self) -> int:
        return max(d for d, c in zip(self.lengths, self.counts) if c > 0)

    def quantile(self, q: float) -> int:
        """The document length below which a share q of the documents lie."""
        target, seen = q * self.documents, 0.0
        for d, c in zip(self.lengths, self.counts):
            seen += c
            if seen >= target and c > 0:
                return d
        return self.longest

    def token_quantile(self, q: float) -> int:
        """The document length below which a share q of the tokens lie (what a sequence is made of)."""
        total = sum(d * c for d, c in zip(self.lengths, self.counts))
        seen = 0.0
        for d, c in zip(self.lengths, self.counts):
            seen += d * c
            if seen >= q * total and c > 0:
                return d
        return self.longest

    def describe(self) -> dict[str, Any]:
        """The summary MLflow records and `estimate` prints."""
        return {"documents": self.documents, "bins": len(self.lengths), "mean_tokens": round(self.mean, 1),
                "median_tokens": self.quantile(0.5), "p90_tokens": self.quantile(0.9),
                "longest_tokens": self.longest, "token_weighted_median": self.token_quantile(0.5),
                **{k: v for k, v in self.summary.items() if k not in ("lengths", "counts", "format")}}

    def to_json(self) -> dict[str, Any]:
        return {"format": HISTOGRAM_FORMAT, **self.summary, "lengths": list(self.lengths),
                "counts": [int(c) if float(c).is_integer() else c for c in self.counts]}

    def check_fits(self, seq_len: int) -> None:
        """Refuse documents longer than the sequence (they would have to be cut: say so rather than guess)."""
        if self.longest > seq_len:
            n = sum(c for d, c in zip(self.lengths, self.counts) if d > seq_len)
            raise SpecError(f"document-length histogram has {n:g} documents longer than seq_len {seq_len} (longest "
                            f"{self.longest}); cut them when writing it (`moe-autotune lengths --max-length`)")


def histogram(lengths: list[int] | tuple[int, ...], counts: list[float] | tuple[float, ...],
              summary: dict[str, Any] | None = None, what: str = "document-length histogram") -> LengthHistogram:
    """A validated histogram: one SpecError line for anything that is not one."""
    if not isinstance(lengths, (list, tuple)) or not isinstance(counts, (list, tuple)):
        raise SpecError(f"{what}: lengths and counts must be lists")
    if not lengths:
        raise SpecError(f"{what} is empty (no lengths)")
    if len(lengths) != len(counts):
        raise SpecError(f"{what}: {len(lengths)} lengths but {len(counts)} counts")
    if len(lengths) > MAX_HISTOGRAM_BINS:
        raise SpecError(f"{what} has {len(lengths)} bins, more than {MAX_HISTOGRAM_BINS}")
    for d in lengths:
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise SpecError(f"{what}: a document length must be a positive integer, got {str(d)[:40]!r}")
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0:
            raise SpecError(f"{what}: a count must be a non-negative number, got {str(c)[:40]!r}")
    if list(lengths) != sorted(set(lengths)):
        raise SpecError(f"{what}: lengths must be ascending, each once")
    if not any(c > 0 for c in counts):
        raise SpecError(f"{what} is empty (every count is 0)")
    return LengthHistogram(tuple(lengths), tuple(float(c) for c in counts), dict(summary or {}))


def load_histogram(path: str | Path) -> LengthHistogram:
    """Read a histogram file (HISTOGRAM_FORMAT); bad files are one SpecError line."""
    from search_spaces.inputs import read_text_file

    text = read_text_file(path, "document-length histogram", limit=MAX_HISTOGRAM_BYTES)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"document-length histogram {str(path)!r} is not JSON (line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != HISTOGRAM_FORMAT:
        raise SpecError(f"document-length histogram {str(path)!r} is not one (want \"format\": "
                        f"\"{HISTOGRAM_FORMAT}\", as `moe-autotune lengths` writes)")
    summary = {k: v for k, v in data.items() if k not in ("lengths", "counts", "format")}
    summary.setdefault("file", str(path))
    return histogram(data.get("lengths") or [], data.get("counts") or [], summary,
                     what=f"document-length histogram {str(path)!r}")


def full_length(seq_len: int) -> LengthHistogram:
    """Every document seq_len tokens long: today's one document per sequence."""
    return histogram([seq_len], [1])


def pad_multiple(cp: int, tp: int, sequence_parallel: bool) -> int:
    """What each document is padded to a multiple of: 2*CP (Transformer Engine's load-balanced chunks), times TP
    under sequence parallelism; 1 without CP."""
    if cp <= 1:
        return 1
    return 2 * cp * (tp if sequence_parallel else 1)


@dataclass(frozen=True)
class PackedStatistics:
    """Expected make-up of one packed sequence of seq_len tokens."""
    pieces: tuple[tuple[int, float], ...]
    """(padded document length, expected number of such documents per sequence), ascending by length."""
    useful_share: float
    """Real tokens over seq_len (document padding and unfilled tails are the rest)."""
    documents_per_sequence: float
    """Expected documents per sequence."""
    attention_share: float
    """Expected sum of padded d_i^2 per sequence over seq_len^2: the causal attention left of a full-length
    sequence's."""


def packed_statistics(hist: LengthHistogram, seq_len: int, multiple: int) -> PackedStatistics:
    """The expected packed sequence for documents of `hist`, each padded to `multiple` (module docstring), once
    per (histogram, seq_len, multiple)."""
    return _STATS.get((hist,), (seq_len, multiple), lambda: _packed_statistics(hist, seq_len, multiple))


def _packed_statistics(hist: LengthHistogram, seq_len: int, multiple: int) -> PackedStatistics:
    hist.check_fits(seq_len)
    padded: dict[int, float] = {}
    useful = 0.0
    for d, c in zip(hist.lengths, hist.counts):
        if c > 0:
            p = min(-(-d // multiple) * multiple, seq_len)  # seq_len divides by `multiple` (rules: sequence_cp)
            padded[p] = padded.get(p, 0.0) + c
            useful += d * c
    big_docs = sum(c for p, c in padded.items() if 2 * p > seq_len)
    gaps = sum((seq_len - p) * c for p, c in padded.items() if 2 * p > seq_len)
    small = sum(p * c for p, c in padded.items() if 2 * p <= seq_len)
    sequences = big_docs + max(0.0, small - gaps) / seq_len
    pieces = tuple((p, c / sequences) for p, c in sorted(padded.items()))
    return PackedStatistics(pieces=pieces, useful_share=useful / (sequences * seq_len),
                            documents_per_sequence=hist.documents / sequences,
                            attention_share=sum(p * p * n for p, n in pieces) / (seq_len * seq_len))


def padded_tokens(pieces: tuple[tuple[int, float], ...]) -> float:
    return sum(p * n for p, n in pieces)


def pack_sequence(lengths: list[int], seq_len: int, multiple: int) -> tuple[list[int], list[int]]:
    """One packed sequence of documents with these real lengths, in order, as Megatron's PackedSeqParams wants
    it: (cu_seqlens: cumulative real lengths, cu_seqlens_padded: cumulative padded lengths, the offsets of the
    documents in the pack), the last padded document stretched to end at seq_len (the tail is padding). The
    documents must fit (padded sum <= seq_len)."""
    cu, cu_padded = [0], [0]
    for d in lengths:
        p = -(-d // multiple) * multiple
        cu.append(cu[-1] + d)
        cu_padded.append(cu_padded[-1] + p)
    if cu_padded[-1] > seq_len:
        raise ValueError(f"documents {lengths} padded to {multiple} do not fit {seq_len} tokens")
    cu_padded[-1] = seq_len
    return cu, cu_padded


class DocumentStream:
    """Packed sequences drawn from a histogram, reproducibly (the trainer's batches), by the cost model's rule:
    documents are drawn in proportion to their counts until their padded tokens fill the sequences asked for,
    then packed first-fit-decreasing into them, never cut; a document no sequence has room for waits for the
    next call (it is drawn first then)."""

    def __init__(self, hist: LengthHistogram, seq_len: int, multiple: int, seed: int = 0):
        import random

        hist.check_fits(seq_len)
        if seq_len % multiple:
            raise SpecError(f"seq_len {seq_len} does not divide by the padding multiple {multiple}")
        self.hist, self.seq_len, self.multiple = hist, seq_len, multiple
        self._rng = random.Random(seed)
        self._pending: list[int] = []

    def _padded(self, d: int) -> int:
        return -(-d // self.multiple) * self.multiple

    def next_sequences(self, n: int) -> list[list[int]]:
        """Real document lengths of the next `n` packed sequences (each in the order it was packed)."""
        drawn, total = list(self._pending), sum(map(self._padded, self._pending))
        while total < n * self.seq_len:
            d = self._rng.choices(self.hist.lengths, weights=self.hist.counts)[0]
            drawn.append(d)
            total += self._padded(d)
        bins: list[list[int]] = [[] for _ in range(n)]
        room = [self.seq_len] * n
        self._pending = []
        for d in sorted(drawn, reverse=True):  # first-fit-decreasing: the longest first, each into the first room
            p = self._padded(d)
            at = next((i for i in range(n) if room[i] >= p), None)
            if at is None:
                self._pending.append(d)
                continue
            bins[at].append(d)
            room[at] -= p
        return bins

    def next_sequence(self) -> list[int]:
        """Real document lengths of the next packed sequence."""
        return self.next_sequences(1)[0]


# ---- what the cost model asks ------------------------------------------------------------------------------------
# typed per argument (mypy): a histogram always has statistics
@overload
def statistics_for(packing: LengthHistogram, seq_len: int, cp: int, tp: int,
                   sequence_parallel: bool) -> PackedStatistics: ...
@overload
def statistics_for(packing: LengthHistogram | None, seq_len: int, cp: int, tp: int,
                   sequence_parallel: bool) -> PackedStatistics | None: ...
def statistics_for(packing: LengthHistogram | None, seq_len: int, cp: int, tp: int,
                   sequence_parallel: bool) -> PackedStatistics | None:
    """The layout's packed sequence (None: one full-length document per sequence, today's)."""
    if packing is None:
        return None
    return packed_statistics(packing, seq_len, pad_multiple(cp, tp, sequence_parallel))


def useful_share(packing: LengthHistogram | None, seq_len: int, layout) -> float:
    stats = statistics_for(packing, seq_len, layout.cp, layout.tp, layout.sp)
    return 1.0 if stats is None else stats.useful_share


def packed_flops_per_step(model, seq_len: int, gbs: int, stats: PackedStatistics) -> float:
    """Model FLOPs of a step of packed sequences (Bridge's count, every token padding included, with each
    document's own causal attention): flops.flops_breakdown with its attention term summed over documents."""
    from search_spaces.cost.flops import _attention_core_per_token, flops_breakdown

    out = flops_breakdown(model, seq_len, gbs)
    n_layers = model.num_layers + model.mtp_layers
    kinds = [model.attention_kind(i) for i in range(n_layers)]
    core = 0.0
    for p, n in stats.pieces:
        core += 6 * sum(_attention_core_per_token(model, k, p) for k in kinds) * (p * n * gbs)
    out["attention_core"] = core
    return float(sum(out.values()))


def packing_report(packing: LengthHistogram, seq_len: int, layout) -> dict[str, Any]:
    """What `estimate` shows and MLflow records of a layout's packed sequences."""
    stats = statistics_for(packing, seq_len, layout.cp, layout.tp, layout.sp)
    return {"packing": "packed", "pad_multiple": pad_multiple(layout.cp, layout.tp, layout.sp),
            "useful_token_share": stats.useful_share, "padding_share": 1.0 - stats.useful_share,
            "documents_per_sequence": stats.documents_per_sequence,
            "attention_vs_full_length": stats.attention_share, "distribution": packing.describe()}


__all__ = ["HISTOGRAM_FORMAT", "DocumentStream", "LengthHistogram", "PackedStatistics", "PACKINGS", "full_length",
           "histogram", "load_histogram", "pack_sequence", "packed_flops_per_step", "packed_statistics",
           "packing_report", "pad_multiple", "statistics_for", "useful_share"]


# ---- what the exports carry --------------------------------------------------------------------------------------
# Megatron-LM (megatron/training/arguments.py): the dataloader returns cu_seqlens of each sample's documents
# (THD attention restricted to each document) and restarts positions at each document
MEGATRON_LM_PACKING_FLAGS = ("--dataloader-inter-document-masking", "--reset-position-ids")


def packing_exports(layout, seq_len: int) -> dict[str, Any]:
    """The settings a packed run needs beside the layout: Megatron-Bridge's packed_sequence_specs (the pack's size
    and each document's padding multiple, Bridge's `pad_seq_to_mult`) and Megatron-LM's flags."""
    return {"megatron_args": list(MEGATRON_LM_PACKING_FLAGS),
            "bridge": {"dataset": {"packed_sequence_specs": {
                "packed_sequence_size": int(seq_len),
                "pad_seq_to_mult": pad_multiple(layout.cp, layout.tp, layout.sp)}}}}
