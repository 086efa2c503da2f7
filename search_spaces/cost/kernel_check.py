"""The cost model's terms at the kernel tables' shapes: what each term assumes where a kernel was measured.

A cross-check, not a fit: nothing here changes a term. For each entry of search_spaces/catalog/kernel_tables.json
(search_spaces/catalog/kernels.py) `model_figure` asks the term the step time uses, on the entry's catalog GPU with
the packaged (or a given) calibration, for the same shape and in the source's units:
- gemm: throughput.gemm_rate (peak x the family's GEMM efficiency x the recipe's factor x the sustained rate) x
  GpuTerms.gemm_shape_factor at m x k x n; a grouped GEMM's also x `grouped_gemm_efficiency` (what
  throughput._gemm_rates gives the expert GEMMs);
- attention: GpuTerms.attention_rates at the entry's head widths and sequence length (causal: the kernel-length
  factor L / (L + ATTENTION_HALF_RATE_TOKENS) applied; no mask: the long-sequence rate it is a share of);
- ep_alltoall: dispatcher_comm.link_efficiency of DeepEP at the entry's EP span, as a share of the link the source
  measured, in the source's counting (RDMA figures that count the sender's own node: / remote_share).
`ratio` is model / kernel: above 1 the term assumes a faster kernel than the one published, below 1 a slower one.
bench/kernel_tables.py prints them; `estimate --explain` (search_spaces/cost/explain.py) uses them per term.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from search_spaces.calibration.calibration_file import Calibration, calibration
from search_spaces.catalog.hardware import GPUSpec, load_gpu
from search_spaces.catalog.kernels import KernelEntry, kernel_tables
from search_spaces.catalog.models import load_model
from search_spaces.cost import dispatcher_comm
from search_spaces.cost.gpu_terms import GPU_TERMS, shard_length_factor
from search_spaces.cost.step_job import Job
from search_spaces.cost.throughput import gemm_rate, job_for
from search_spaces.layouts.layout import Layout

# the model a probe job carries: the GEMM and attention terms probed read the GPU, the precision and the
# calibration, never the model
_PROBE_MODEL = "tiny-moe"


class ModelFigure(NamedTuple):
    """The term's figure at an entry's shape, in the entry's unit, and what it is of."""
    value: float
    unit: str
    how: str


@functools.cache
def _probe_model():
    return load_model(_PROBE_MODEL)


def probe_job(gpu: GPUSpec, precision: str, cal: Calibration, dispatcher: str = "deepep") -> Job:
    """A job on `gpu` at `precision`: what the GPU terms read of a job when asked for a rate at a given shape."""
    layout = Layout().replace(precision=precision, dispatcher=dispatcher)
    return job_for(_probe_model(), gpu, gpu.nvlink_domain, 4096, layout, cal)


def gemm_figure(entry: KernelEntry, cal: Calibration) -> ModelFigure:
    gpu, shape = load_gpu(entry.gpu), entry.shape
    rate = gemm_rate(gpu, entry.precision, cal)
    factor = GPU_TERMS.gemm_shape_factor(probe_job(gpu, entry.precision, cal), shape["m"], shape["k"], shape["n"],
                                         rate)
    how = "GEMM rate x shape factor"
    if shape.get("kind") == "grouped":
        factor *= cal.grouped_gemm_efficiency[gpu.family]
        how += " x grouped-GEMM efficiency"
    return ModelFigure(rate * factor / 1e12, "TFLOP/s", how)


def attention_figure(entry: KernelEntry, cal: Calibration) -> ModelFigure:
    gpu, shape = load_gpu(entry.gpu), entry.shape
    length = float(shape["seq_len"])
    fwd, bwd = GPU_TERMS.attention_rates(probe_job(gpu, "bf16", cal), (shape["d_qk"], shape["d_v"]), length)
    rate = fwd if shape["direction"] == "fwd" else bwd
    if shape["mask"] == "causal":
        return ModelFigure(rate / 1e12, "TFLOP/s", f"causal at L = {length:g} (length factor applied)")
    return ModelFigure(rate / shard_length_factor(length) / 1e12, "TFLOP/s",
                       "no mask: the long-sequence rate the causal length factor is a share of")


def alltoall_share(gpu: GPUSpec, dispatcher: str, span: int, link: str, cal: Calibration) -> float:
    """The share of `link` (nvlink | rdma) the term assumes this dispatcher reaches over `span` EP ranks."""
    nvl, out = dispatcher_comm.link_efficiency(gpu, dispatcher, span, cal.dispatcher_efficiency["alltoall"])
    return nvl if link == "nvlink" else out


def alltoall_figure(entry: KernelEntry, cal: Calibration) -> ModelFigure:
    shape = entry.shape
    share = alltoall_share(load_gpu(entry.gpu), "deepep", int(shape["ep"]), shape["link"], cal)
    return ModelFigure(share * entry.link() / entry.remote_share, "GB/s",
                       f"DeepEP's {share:.2f} of {entry.link():g} GB/s {shape['link']}"
                       + (f", / {entry.remote_share:.3f} counted as the source counts" if entry.remote_share < 1
                          else ""))


FIGURES = {"gemm": gemm_figure, "attention": attention_figure, "ep_alltoall": alltoall_figure}


def model_figure(entry: KernelEntry, cal: Calibration | None = None) -> ModelFigure:
    """The term's figure at the entry's shape on the entry's GPU (packaged calibration unless one is given)."""
    return FIGURES[entry.term](entry, cal or calibration())


def cross_check(cal: Calibration | None = None, term: str | None = None) -> list[dict[str, Any]]:
    """One row per entry (of `term`, or all): the published figure, the model's, and model / kernel."""
    cal = cal or calibration()
    rows = []
    for entry in kernel_tables():
        if term is not None and entry.term != term:
            continue
        fig = model_figure(entry, cal)
        rows.append({"entry": entry, "kernel": entry.value, "model": fig.value, "unit": entry.unit,
                     "ratio": fig.value / entry.value, "how": fig.how})
    return rows


__all__ = ["ModelFigure", "probe_job", "gemm_figure", "attention_figure", "alltoall_share", "alltoall_figure",
           "model_figure", "cross_check"]
