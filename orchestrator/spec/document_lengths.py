"""Document lengths read from the data users train on, binned into the histogram `search_spaces.cost.packing` reads.

Sources (no torch: the orchestrator never imports it):
- Megatron's indexed dataset (`PREFIX.idx` beside `PREFIX.bin`): the .idx header and arrays read with numpy
  exactly as megatron/core/datasets/indexed_dataset.py's _IndexReader lays them out
  (tests/orchestrator/test_packing_data.py
  holds this reader to Megatron-Core's on a dataset written by its own IndexedDatasetBuilder). Large datasets
  are sampled: at most `max_documents` documents drawn uniformly without replacement (seeded).
- JSONL and Parquet with a token-count column (or a text column tokenised with a Hugging Face tokenizer, only
  when one is named): the first `max_documents` rows are read (files are streamed, not loaded whole).

A progress callback `advance(done, total)` lets the command draw a bar. Every refusal is one SpecError line.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from search_spaces.cost.packing import HISTOGRAM_FORMAT, LengthHistogram, histogram
from search_spaces.errors import SpecError

# megatron/core/datasets/indexed_dataset.py: _INDEX_HEADER, version 1, DType codes
IDX_HEADER = b"MMIDIDX\x00\x00"
IDX_VERSION = 1
IDX_DTYPE_CODES = range(1, 9)  # uint8 int8 int16 int32 int64 float64 float32 uint16
IDX_FIXED_BYTES = 9 + 8 + 1 + 8 + 8  # header, version, dtype code, sequence count, document count
BINS_PER_DOUBLING = 8  # bins ~9% wide: the kernel's efficiency barely moves within one
CHUNK = 1 << 20  # documents per progress step
DEFAULT_MAX_DOCUMENTS = 1_000_000

Progress = Callable[[int, int], None]


def _no_progress(done: int, total: int) -> None:  # noqa: ARG001 -- a Progress
    return None


# ---- Megatron indexed dataset -------------------------------------------------------------------------------------
def idx_path_of(path: str | Path) -> Path:
    """PREFIX, PREFIX.idx or PREFIX.bin -> PREFIX.idx."""
    path = Path(path)
    if path.suffix in (".idx", ".bin"):
        return path.with_suffix(".idx")
    return path.with_name(path.name + ".idx")


def read_idx_header(idx: Path) -> tuple[int, int, int]:
    """(dtype code, sequence count, document count) of a Megatron .idx, checked against its size."""
    try:
        size = idx.stat().st_size
        with open(idx, "rb") as fh:
            head = fh.read(IDX_FIXED_BYTES)
    except FileNotFoundError:
        raise SpecError(f"indexed dataset {str(idx)!r} does not exist") from None
    except OSError as exc:
        raise SpecError(f"indexed dataset {str(idx)!r} cannot be read: {exc.strerror or exc}") from None
    if len(head) < IDX_FIXED_BYTES or head[:9] != IDX_HEADER:
        raise SpecError(f"{str(idx)!r} is not a Megatron indexed dataset index (no MMIDIDX header)")
    version, code, sequences, documents = struct.unpack("<QBQQ", head[9:])
    if version != IDX_VERSION:
        raise SpecError(f"{str(idx)!r}: indexed dataset version {version}, this reader knows {IDX_VERSION}")
    if code not in IDX_DTYPE_CODES:
        raise SpecError(f"{str(idx)!r}: unknown token dtype code {code}")
    need = IDX_FIXED_BYTES + sequences * (4 + 8) + documents * 8
    if documents < 1 or need > size:
        raise SpecError(f"{str(idx)!r} is truncated or not an index: {sequences} sequences and {documents} document "
                        f"indices need {need} bytes, the file has {size}")
    return code, sequences, documents


def idx_document_lengths(path: str | Path, max_documents: int = DEFAULT_MAX_DOCUMENTS, seed: int = 0,
                         advance: Progress = _no_progress) -> tuple[np.ndarray, dict[str, Any]]:
    """Token counts of the documents of a Megatron indexed dataset (a uniform sample of at most max_documents)
    and what was read."""
    idx = idx_path_of(path)
    _, sequences, documents = read_idx_header(idx)
    data = np.memmap(idx, mode="r", dtype=np.uint8)
    seq_lengths = np.frombuffer(data, dtype=np.int32, count=sequences, offset=IDX_FIXED_BYTES)
    doc_indices = np.frombuffer(data, dtype=np.int64, count=documents,
                                offset=IDX_FIXED_BYTES + sequences * 4 + sequences * 8)
    total = documents - 1  # document_indices starts with 0 and ends each document
    if total < 1 or doc_indices[0] != 0 or doc_indices[-1] != sequences:
        raise SpecError(f"{str(idx)!r}: its document indices do not span its {sequences} sequences")
    picked = np.arange(total) if total <= max_documents else \
        np.sort(np.random.default_rng(seed).choice(total, size=max_documents, replace=False))
    out = np.empty(len(picked), dtype=np.int64)
    for start in range(0, len(picked), CHUNK):
        part = picked[start:start + CHUNK]
        first, last = doc_indices[part], doc_indices[part + 1]
        if np.any(last < first) or np.any(last > sequences):
            raise SpecError(f"{str(idx)!r}: its document indices are not ascending")
        single = last - first == 1
        lengths = np.zeros(len(part), dtype=np.int64)
        lengths[single] = seq_lengths[first[single]]
        for i in np.nonzero(~single)[0]:  # documents of several sequences (rare outside multimodal data)
            lengths[i] = int(seq_lengths[first[i]:last[i]].astype(np.int64).sum())
        out[start:start + len(part)] = lengths
        advance(start + len(part), len(picked))
    return out, {"source": str(idx), "source_format": "megatron-indexed", "documents_in_source": int(total),
                 "documents_read": int(len(picked)),
                 "sampling": "all" if total <= max_documents else f"uniform sample of {max_documents} (seed {seed})"}


# ---- JSONL and Parquet --------------------------------------------------------------------------------------------
def _count_of(value: Any, column: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise SpecError(f"{where}: column {column!r} is not a token count: {str(value)[:40]!r}")
    return int(value)


def _texts_to_counts(tokenizer: Any, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer (a local path or a name in the local cache: nothing is downloaded here)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SpecError("--tokenizer needs the transformers package (pip install transformers)") from None
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 (transformers raises many kinds): one line naming it
        raise SpecError(f"tokenizer {name!r} cannot be loaded: {str(exc).splitlines()[0][:160]}") from None


def _jsonl_rows(path: Path, key: str) -> Iterator[tuple[int, Any]]:
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise SpecError(f"{str(path)!r} line {n} is not JSON") from None
            if not isinstance(row, dict) or key not in row:
                raise SpecError(f"{str(path)!r} line {n} has no column {key!r}")
            yield n, row[key]


def _parquet_rows(path: Path, key: str) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
    except ImportError:
        raise SpecError("reading Parquet needs pyarrow (pip install pyarrow)") from None
    except Exception as exc:  # noqa: BLE001 (pyarrow's errors): one line
        raise SpecError(f"{str(path)!r} is not a Parquet file: {str(exc).splitlines()[0][:120]}") from None
    if key not in pf.schema_arrow.names:
        raise SpecError(f"{str(path)!r} has no column {key!r} (columns: {', '.join(pf.schema_arrow.names)[:200]})")
    n = 0
    for batch in pf.iter_batches(columns=[key], batch_size=65536):
        for value in batch.column(0).to_pylist():
            n += 1
            yield n, value


def table_document_lengths(path: str | Path, column: str | None = None, text_column: str | None = None,
                           tokenizer: Any = None, max_documents: int = DEFAULT_MAX_DOCUMENTS,
                           advance: Progress = _no_progress) -> tuple[np.ndarray, dict[str, Any]]:
    """Token counts of the first max_documents rows of a JSONL or Parquet file: a token-count `column`, or a
    `text_column` tokenised with `tokenizer`."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"data file {str(path)!r} does not exist or is not a file")
    if (column is None) == (text_column is None):
        raise SpecError("give either --column (a token count) or --text-column with --tokenizer")
    if text_column is not None and tokenizer is None:
        raise SpecError("--text-column needs --tokenizer (the model's tokenizer)")
    key = column if column is not None else text_column
    assert key is not None  # exactly one of the two is given (checked above)
    kind = "parquet" if path.suffix.lower() in (".parquet", ".pq") else "jsonl"
    rows = _parquet_rows(path, key) if kind == "parquet" else _jsonl_rows(path, key)
    counts: list[int] = []
    texts: list[str] = []
    for n, value in rows:
        if text_column is not None:
            if not isinstance(value, str):
                raise SpecError(f"{str(path)!r} row {n}: column {key!r} is not text")
            texts.append(value)
            if len(texts) >= 1024:
                counts.extend(_texts_to_counts(tokenizer, texts))
                texts = []
        else:
            counts.append(_count_of(value, key, f"{str(path)!r} row {n}"))
        if (len(counts) + len(texts)) % CHUNK == 0:
            advance(len(counts) + len(texts), max_documents)
        if len(counts) + len(texts) >= max_documents:
            break
    if texts:
        counts.extend(_texts_to_counts(tokenizer, texts))
    advance(len(counts), len(counts))
    return np.asarray(counts, dtype=np.int64), {
        "source": str(path), "source_format": kind, "column": key, "tokenised": text_column is not None,
        "documents_read": len(counts), "sampling": f"first {max_documents} rows at most"}


# ---- the histogram ------------------------------------------------------------------------------------------------
def bin_lengths(lengths: np.ndarray, summary: dict[str, Any], max_length: int | None = None,
                bins_per_doubling: int = BINS_PER_DOUBLING) -> LengthHistogram:
    """Log-spaced bins (bins_per_doubling per doubling; every length below 2*bins_per_doubling its own), each
    represented by the mean length of its documents; `max_length`: longer documents are cut into pieces of at
    most that many tokens (as a sequence of that length would cut them). Empty documents are dropped; a negative
    length is refused."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.min() < 0:
        raise SpecError(f"{summary.get('source', 'data')}: negative document length {int(lengths.min())}")
    lengths = lengths[lengths > 0]
    if not lengths.size:
        raise SpecError(f"{summary.get('source', 'data')}: no documents with tokens")
    summary = dict(summary)
    if max_length is not None and lengths.max() > max_length:
        whole, rest = np.divmod(lengths, max_length)
        summary["cut_at"] = max_length
        summary["documents_cut"] = int((lengths > max_length).sum())
        lengths = np.concatenate([np.full(int(whole.sum()), max_length, dtype=np.int64), rest[rest > 0]])
    small = 2 * bins_per_doubling
    keys = np.where(lengths < small, lengths,
                    small + np.floor(np.log2(np.maximum(lengths, 1) / small) * bins_per_doubling).astype(np.int64))
    order = np.unique(keys)
    out_lengths: dict[int, float] = {}
    for k in order:
        members = lengths[keys == k]
        rep = int(round(float(members.mean())))
        out_lengths[rep] = out_lengths.get(rep, 0.0) + float(members.size)
    pairs = sorted(out_lengths.items())
    summary["binning"] = f"{bins_per_doubling} per doubling, mean length per bin"
    summary["tokens_read"] = int(lengths.sum())
    return histogram([d for d, _ in pairs], [c for _, c in pairs], summary)


def histogram_text(hist: LengthHistogram) -> str:
    """The histogram file's text (what `lengths --out` writes and a spec's `packing.lengths` reads)."""
    return json.dumps(hist.to_json(), indent=1) + "\n"


__all__ = ["HISTOGRAM_FORMAT", "bin_lengths", "histogram_text", "idx_document_lengths", "load_tokenizer",
           "read_idx_header",
           "table_document_lengths"]
