"""GEMM efficiencies read from the kernel tables instead of fitted to end-to-end rows (issue 57, item 2).

Each pinned term takes the value at which the cost model's own figure for its kernel (search_spaces/cost/
kernel_check.py: peak x efficiency x the recipe's factor x the shape factor at the entry's m x k x n) matches the
published figures of that kernel in search_spaces/catalog/kernel_tables.json: the median model / kernel ratio over
the term's entries is 1. The shape law carries the table from its shapes to a layout's; the peak is a hard ceiling
(an efficiency never exceeds 1). Hopper's terms, in this order (the grouped term is a share of the FP8 dense rate,
so it is pinned after it):
- gemm_efficiency.hopper.bf16: the project's own H200 BF16 GEMM run (bench/gemm_shapes_h200.json; H100 and H200
  share the tensor-core peak, the shape law takes their HBM apart);
- gemm_efficiency.hopper.fp8: DeepGEMM@327ec92's H800 FP8 (1x128 / 128x128 block-scaled) dense GEMMs;
- grouped_gemm_efficiency.hopper: DeepGEMM's grouped (contiguous-layout) FP8 GEMMs.
Dense entries below MIN_DENSE_TOKENS rows are left out: a lone small matmul leaves SMs idle, which the shape law
does not describe (search_spaces/cost/gpu_terms.py GEMM_SHAPE_SHARPNESS) and a grouped GEMM over many experts does
not suffer.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.kernels import KernelEntry, entries

# the fewest rows of a dense table entry that pins a term (see the module docstring)
MIN_DENSE_TOKENS = 512
# an efficiency is a share of the datasheet peak: the peak is the ceiling
PEAK_SHARE_CEILING = 1.0
# the pin stops when the median model / kernel ratio is this close to 1 (the shape factor moves with the rate)
RATIO_TOLERANCE = 1e-4
MAX_ITERATIONS = 50


@dataclass(frozen=True)
class Pin:
    """One calibration term and the kernel-table entries that measure it."""
    constant: str
    family: str
    precision: str | None
    """The precision class of a gemm_efficiency table; None for grouped_gemm_efficiency (one number)."""
    gpu: str
    table_precision: str
    kind: str
    """"dense" or "grouped": which GEMMs of the table."""

    @property
    def name(self) -> str:
        """As bench/fit_calibration.py's Parameter names it."""
        return ".".join(part for part in (self.constant, self.family, self.precision) if part)

    def entries(self) -> list[KernelEntry]:
        return [e for e in entries("gemm", self.gpu) if e.precision == self.table_precision
                and e.shape.get("kind") == self.kind
                and (self.kind != "dense" or int(e.shape["m"]) >= MIN_DENSE_TOKENS)]

    def value(self, cal: Calibration) -> float:
        node: Any = getattr(cal, self.constant)[self.family]
        return float(node[self.precision] if self.precision else node)

    def constants(self, value: float) -> dict[str, Any]:
        entry: Any = {self.precision: value} if self.precision else value
        return {self.constant: {self.family: entry}}


PINS = (Pin("gemm_efficiency", "hopper", "bf16", "h200", "bf16", "dense"),
        Pin("gemm_efficiency", "hopper", "fp8", "h100", "fp8-blockwise", "dense"),
        Pin("grouped_gemm_efficiency", "hopper", None, "h100", "fp8-blockwise", "grouped"))
PINNED_NAMES = tuple(p.name for p in PINS)


def median_ratio(pin: Pin, cal: Calibration) -> float:
    """Median over the pin's entries of the model's figure over the published one."""
    from search_spaces.cost.kernel_check import gemm_figure  # the cost terms import the calibration

    return statistics.median(gemm_figure(e, cal).value / e.value for e in pin.entries())


def pin_one(pin: Pin, cal: Calibration) -> tuple[Calibration, dict[str, Any]]:
    """`cal` with the pin's term at the value where the median model / kernel ratio is 1 (at most the peak)."""
    value = pin.value(cal)
    for _ in range(MAX_ITERATIONS):  # the figure is nearly proportional to the term: divide by the ratio
        ratio = median_ratio(pin, cal)
        if abs(ratio - 1) < RATIO_TOLERANCE or (value >= PEAK_SHARE_CEILING and ratio < 1):
            break
        value = min(PEAK_SHARE_CEILING, value / ratio)
        cal = cal.updated(pin.constants(value))
    return cal, {"term": pin.name, "value": round(value, 4), "entries": len(pin.entries()),
                 "median_ratio": round(median_ratio(pin, cal), 3), "gpu": pin.gpu, "table": pin.table_precision,
                 "kind": pin.kind}


def pinned(cal: Calibration) -> tuple[Calibration, list[dict[str, Any]]]:
    """`cal` with every PINS term read from its kernel table (in order), and one summary per term."""
    out = []
    for pin in PINS:
        cal, summary = pin_one(pin, cal)
        out.append(summary)
    return cal, out


__all__ = ["MIN_DENSE_TOKENS", "PINS", "PINNED_NAMES", "Pin", "median_ratio", "pin_one", "pinned"]
