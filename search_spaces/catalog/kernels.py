"""Kernel tables: published figures of the kernels behind the cost model's terms, each with its source.

One table per term, read from kernel_tables.json beside this module:
- `gemm`: dense and grouped GEMM throughput (TFLOP/s) by shape m x n x k (m: tokens, per group for a grouped
  GEMM), per GPU and precision: DeepGEMM's FP8 tables on H800 and the project's own BF16 expert-GEMM shapes on H200;
- `attention`: flash-attention forward and backward (TFLOP/s, causal FLOPs counted as half of the square) by
  sequence length, head widths (d_qk, d_v) and mask: FlashAttention-4 on SM100 boards, FlashAttention-3 on H200;
- `ep_alltoall`: the MoE dispatch and combine (GB/s, as each source counts them) by EP span and link (NVLink inside a
  node, RDMA across): DeepEP V1 and V2.

Every entry names the catalog GPU it is a figure of (`gpu`; `Source.measured_on` says what the source ran on when
that is not the catalog's own board), a precision the GPU supports, its shape, its value and unit, its source
(a repository at a commit and a file, or a URL) and the quoted line or table row. `KernelEntry.ceiling` is the most
the GPU's datasheet (hardware.py) allows for it: tests/search_spaces/test_kernel_tables.py holds every entry at or
below it. Pure data: the cost terms' figures at these shapes are search_spaces/cost/kernel_check.py's.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces.catalog.hardware import GPUSpec, load_gpu

TABLES_PATH = Path(__file__).parent / "kernel_tables.json"
TERMS = ("gemm", "attention", "ep_alltoall")
UNITS = {"gemm": "TFLOP/s", "attention": "TFLOP/s", "ep_alltoall": "GB/s"}
LINKS = ("nvlink", "rdma")


@dataclass(frozen=True)
class Source:
    """Where a table's figures were read: a repository at a commit and a file, or a URL."""
    key: str
    repository: str = ""
    commit: str = ""
    file: str = ""
    url: str = ""
    date: str = ""
    measured_on: str = ""
    """What the source ran on, in its words (board, software, batch)."""
    note: str = ""
    """How its figures map to the catalog (which GPU, what they count)."""

    def cite(self) -> str:
        """`owner/repo@commit12 file`, or the URL."""
        if self.repository:
            return f"{self.repository}@{self.commit[:12]} {self.file}"
        return self.url


@dataclass(frozen=True)
class KernelEntry:
    """One published figure of one kernel at one shape."""
    term: str
    """The cost term it is a figure of (TERMS)."""
    gpu: str
    """The catalog GPU (hardware.GPUS) it is a figure of."""
    precision: str
    kernel: str
    shape: dict[str, Any] = field(hash=False, compare=False)
    value: float = 0.0
    unit: str = ""
    source: Source = field(default_factory=lambda: Source(""))
    quote: str = ""
    """The line or table row of the source the value was read from."""
    note: str = ""
    link_gbps: float | None = None
    """ep_alltoall: the link of the machine measured, as the source states it (GB/s per direction)."""
    counts_local_share: bool = False
    """ep_alltoall over RDMA: the figure counts the sender's own node too (DeepEP's logical bandwidth)."""

    @property
    def spec(self) -> GPUSpec:
        return load_gpu(self.gpu)

    @property
    def remote_share(self) -> float:
        """Share of the counted bytes that cross the link: (nodes - 1) / nodes where the node's own are counted."""
        nodes = int(self.shape.get("nodes", 1))
        return (nodes - 1) / nodes if self.counts_local_share and nodes > 1 else 1.0

    def link(self) -> float:
        """ep_alltoall: GB/s per direction of the link measured (the source's figure, else the catalog's)."""
        gpu = self.spec
        catalog = gpu.nvlink_gbps if self.shape.get("link") == "nvlink" else gpu.scaleout_gbps
        return min(catalog, self.link_gbps) if self.link_gbps else catalog

    def ceiling(self) -> float:
        """The most the GPU can reach for this figure: its dense peak at the precision (TFLOP/s), or its link in
        the source's counting (GB/s; RDMA figures that count the sender's node: link / remote_share)."""
        if self.unit == "TFLOP/s":
            return self.spec.peak(self.precision)
        return self.link() / self.remote_share

    def share_of_ceiling(self) -> float:
        """value / ceiling: the share of the peak or of the link this figure reaches."""
        return self.value / self.ceiling()

    def to_dict(self) -> dict[str, Any]:
        return {"term": self.term, "gpu": self.gpu, "precision": self.precision, "kernel": self.kernel,
                "shape": dict(self.shape), "value": self.value, "unit": self.unit, "source": self.source.cite(),
                "measured_on": self.source.measured_on, "quote": self.quote}


def _source(key: str, raw: dict[str, Any]) -> Source:
    return Source(key, raw.get("repository", ""), raw.get("commit", ""), raw.get("file", ""), raw.get("url", ""),
                  raw.get("date", ""), raw.get("measured_on", ""), raw.get("note", ""))


def _entry(raw: dict[str, Any], sources: dict[str, Source]) -> KernelEntry:
    if raw["source"] not in sources:
        raise ValueError(f"kernel table entry names an unknown source {raw['source']!r}")
    return KernelEntry(raw["term"], raw["gpu"], raw["precision"], raw["kernel"], dict(raw["shape"]),
                       float(raw["value"]), raw["unit"], sources[raw["source"]], raw["quote"], raw.get("note", ""),
                       raw.get("link_gbps"), bool(raw.get("counts_local_share", False)))


@functools.cache
def kernel_tables(path: Path = TABLES_PATH) -> tuple[KernelEntry, ...]:
    """Every entry of the tables, in the file's order (read once)."""
    data = json.loads(path.read_text())
    sources = {key: _source(key, raw) for key, raw in data["sources"].items()}
    return tuple(_entry(raw, sources) for raw in data["entries"])


def entries(term: str | None = None, gpu: str | None = None) -> tuple[KernelEntry, ...]:
    """The entries of one term (and GPU), or all."""
    return tuple(e for e in kernel_tables() if (term is None or e.term == term) and (gpu is None or e.gpu == gpu))


__all__ = ["TERMS", "UNITS", "LINKS", "Source", "KernelEntry", "kernel_tables", "entries"]
