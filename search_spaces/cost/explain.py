"""Why a predicted step time is what it is: each term of the breakdown against the kernel tables (`estimate --explain`).

For one legal layout, per component of the step time (breakdown.StepTime):
- gemm (dense GEMMs and the experts' grouped GEMMs), attention (forward and backward) and ep_comm (dispatch and
  combine): the shape the layout gives the term (m x k x n as throughput._gemm_rates sees it; the attention kernel's
  query length and head widths; the EP span and the link it crosses), the rate the term implies there (and its
  share of the GPU's peak or link), the nearest kernel-table entry (search_spaces/catalog/kernels.py: the same GPU
  first, then the same family, then any; the same precision first, then its class; then the nearest shape in log
  scale), the table's figure and its share of its own GPU's ceiling, the term's figure at the entry's own shape
  (kernel_check.model_figure), and whether the layout's shape lies inside the range the table measured for that
  family and precision or is extrapolated (and along which axis);
- every other component: no kernel table covers it; what it rests on instead (fitted end to end, or physical).
Pure: reads the cost model, changes nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.hardware import GPUS, GPUSpec
from search_spaces.catalog.kernels import KernelEntry, entries
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost import dispatcher_comm
from search_spaces.cost.breakdown import StepTime
from search_spaces.cost.kernel_check import alltoall_share, model_figure
from search_spaces.cost.packing import LengthHistogram
from search_spaces.cost.step_job import Job, precision_class
from search_spaces.cost.throughput import attention_dims, attention_kernel_length, gemm_rates, job_for
from search_spaces.layouts.layout import PRECISION_ALIASES, Layout

INSIDE, EXTRAPOLATED, NO_TABLE = "inside", "extrapolated", "no table"
# what each step-time component rests on where no kernel table covers it
RESTS_ON = {
    "elementwise": "HBM passes over activations and routed copies (fitted elementwise_passes, routed_passes) and "
                   "fp8 casts at each recipe's bytes",
    "recompute": "the GEMM and attention rates above, over the forward it repeats",
    "tp_comm": "NVLink bandwidth x the fitted comm_efficiency and tp_exposed",
    "cp_comm": "link bandwidth x the fitted comm_efficiency; the ring hidden behind attention steps",
    "dispatcher_overhead": "assumed fixed costs per dispatch/combine call and the SMs the dispatcher holds",
    "pp_comm": "link bandwidth x comm_efficiency, half exposed (assumed)",
    "launch_overhead": "host launch cost per kernel (fitted host_kernel_launch_s) and the dropless MoE sync",
    "pipeline_bubble": "the schedule's arithmetic: (PP-1)/VPP microbatch times",
    "dp_comm": "link bandwidth x comm_efficiency x the fitted dp_exposed",
    "optimizer": "HBM bandwidth over Adam's bytes per parameter",
    "optimizer_offload": "host link and an assumed CPU Adam rate",
    "host_contention": "the host's cores (cpu runs only)",
    "activation_offload": "the host link's bandwidth",
}
COVERED = ("gemm", "attention", "ep_comm")


@dataclass(frozen=True)
class TermExplanation:
    """One term of the step, against the kernel table nearest to the layout's shape."""
    component: str
    """The StepTime component (breakdown.TIME_KEYS)."""
    part: str
    """What of it this row is: dense GEMMs, expert GEMMs, forward, backward, dispatch + combine, or the whole."""
    seconds: float
    """The component's seconds per step (shared by its parts)."""
    shape: dict[str, Any] = field(default_factory=dict)
    """The shape the layout gives the term."""
    implied: float | None = None
    """The term's figure at that shape (unit), and its share of the GPU's peak or link."""
    implied_share: float | None = None
    unit: str = ""
    entry: KernelEntry | None = None
    """The nearest kernel-table entry (None: no table covers the term)."""
    model_at_entry: float | None = None
    """The term's figure at the entry's own shape and GPU (kernel_check.model_figure)."""
    range: str = NO_TABLE
    """inside | extrapolated | no table."""
    why: str = ""
    """Along which axis the shape leaves the measured range, or what the term rests on without a table."""

    def to_dict(self) -> dict[str, Any]:
        e = self.entry
        table = None if e is None else {
            **e.to_dict(), "share_of_ceiling": e.share_of_ceiling(), "model_at_entry": self.model_at_entry,
            "ratio_model_to_table": self.model_at_entry / e.value if self.model_at_entry else None}
        return {"component": self.component, "part": self.part, "seconds": self.seconds, "shape": dict(self.shape),
                "implied": self.implied, "implied_share": self.implied_share, "unit": self.unit, "table": table,
                "range": self.range, "why": self.why}


# ---- nearest entry and range ----------------------------------------------------------------------------------
def _family(gpu: str) -> str:
    return GPUS[gpu].family


def _rank(entry: KernelEntry, gpu: GPUSpec, precision: str | None) -> tuple[bool, bool, bool, bool]:
    """What an entry differs in, most telling first: precision class (fp8 vs bf16), GPU family, the GPU itself, the
    exact recipe (`precision` None: any precision is as close)."""
    other_class = precision is not None and precision_class(entry.precision) != precision_class(precision)
    return (other_class, _family(entry.gpu) != gpu.family, entry.gpu != gpu.name,
            precision is not None and entry.precision != precision)


def nearest(pool: Iterable[KernelEntry], gpu: GPUSpec, precision: str | None,
            distance: Callable[[KernelEntry], float],
            other_kind: Callable[[KernelEntry], bool] = lambda e: False) -> KernelEntry | None:
    """The entry closest in precision class and GPU family, then of the same kind (`other_kind`: a grouped GEMM's
    figure for a dense GEMM, other head widths), then the same GPU and recipe, then the nearest shape."""
    def key(e: KernelEntry) -> tuple[bool, bool, bool, bool, bool, float]:
        cls, family, same_gpu, recipe = _rank(e, gpu, precision)
        return cls, family, other_kind(e), same_gpu, recipe, distance(e)
    return min(pool, key=key, default=None)


def _log_gap(a: float, b: float) -> float:
    return abs(math.log(max(a, 1e-9) / max(b, 1e-9)))


def measured_range(pool: list[KernelEntry], gpu: GPUSpec, precision: str | None,
                   axes: dict[str, tuple[float, Callable[[KernelEntry], float]]]) -> tuple[str, str]:
    """(inside | extrapolated, why): whether each axis value lies within what the pool measured on this GPU family
    and precision class (`precision` None: any)."""
    same = [e for e in pool if not any(_rank(e, gpu, precision)[:2])]
    if not same:
        what = f"{gpu.family} {precision_class(precision)}" if precision else gpu.family
        return EXTRAPOLATED, f"no {what} entry: the nearest is another GPU's or precision's"
    out = []
    for name, (value, of) in axes.items():
        lo, hi = min(of(e) for e in same), max(of(e) for e in same)
        if not lo <= value <= hi:
            out.append(f"{name} {value:,.0f} outside the measured {lo:,.0f}-{hi:,.0f}")
    return (EXTRAPOLATED, "; ".join(out)) if out else (INSIDE, f"within {len(same)} {gpu.family} entries")


def _explained(component: str, part: str, seconds: float, shape: dict[str, Any], implied: float, share: float,
               unit: str, entry: KernelEntry | None, cal: Calibration, verdict: tuple[str, str]) -> TermExplanation:
    at_entry = model_figure(entry, cal).value if entry is not None else None
    return TermExplanation(component, part, seconds, shape, implied, share, unit, entry, at_entry, *verdict)


# ---- the covered terms ----------------------------------------------------------------------------------------
def layout_gemm_shapes(job: Job) -> dict[str, tuple[float, float, float]]:
    """(m, k, n) of the rank's dense GEMM and of one local expert's grouped GEMM, as throughput._gemm_rates sizes
    them (tests/search_spaces/test_kernel_tables.py holds the two together)."""
    model, L = job.model, job.layout
    h = model.hidden_size
    n_dense = (model.ffn_hidden_size if not model.is_moe else
               model.num_attention_heads * (model.q_head_dim if model.is_mla else model.head_dim)) / L.tp
    shapes = {"dense": (job.tokens_rank, float(h), n_dense)}
    if model.is_moe:
        m_expert = job.tokens_rank / (L.tp if L.sp else 1) * L.ep * model.topk / model.num_experts
        shapes["grouped"] = (m_expert, float(h), model.moe_ffn_hidden_size / L.etp)
    return shapes


def _gemm_distance(m: float, k: float, n: float) -> Callable[[KernelEntry], float]:
    """Log distance of the shapes (k and n either way round: the shape factor is symmetric in them)."""
    def distance(e: KernelEntry) -> float:
        s = e.shape
        sides = min(_log_gap(k, s["k"]) + _log_gap(n, s["n"]), _log_gap(k, s["n"]) + _log_gap(n, s["k"]))
        return _log_gap(m, s["m"]) + sides
    return distance


def _other_kind(kind: str) -> Callable[[KernelEntry], bool]:
    """An entry of the other GEMM kind (dense vs grouped)."""
    return lambda e: e.shape.get("kind") != kind


def gemm_rows(job: Job, seconds: float, cal: Calibration) -> list[TermExplanation]:
    gpu, precision = job.gpu, PRECISION_ALIASES.get(job.layout.precision, job.layout.precision)
    rates, peak, pool = gemm_rates(job), gpu.peak(precision), list(entries("gemm"))
    rows = []
    for kind, (m, k, n) in layout_gemm_shapes(job).items():
        rate = rates.dense * (rates.grouped if kind == "grouped" else 1.0) / 1e12
        entry = nearest(pool, gpu, precision, _gemm_distance(m, k, n), _other_kind(kind))
        verdict = measured_range(pool, gpu, precision, {
            "tokens m": (m, lambda e: e.shape["m"]),
            "narrow side of k, n": (min(k, n), lambda e: min(e.shape["k"], e.shape["n"])),
            "wide side of k, n": (max(k, n), lambda e: max(e.shape["k"], e.shape["n"]))})
        if entry is not None and entry.shape.get("kind") != kind:
            verdict = (verdict[0], f"{verdict[1]}; the nearest is a {entry.shape.get('kind')} GEMM's figure")
        part = "expert grouped GEMMs (one expert)" if kind == "grouped" else "dense GEMMs"
        rows.append(_explained("gemm", part, seconds, {"kind": kind, "m": m, "k": k, "n": n}, rate, rate / peak,
                               "TFLOP/s", entry, cal, verdict))
    return rows


def _main_kind(model: ModelSpec) -> str | None:
    """The softmax-attention kind most of the model's layers have (None: every layer is linear attention)."""
    kinds = Counter(k for k in model.attention_kinds() if k != "linear")
    return kinds.most_common(1)[0][0] if kinds else None


def attention_rows(job: Job, seconds: float, cal: Calibration) -> list[TermExplanation]:
    kind = _main_kind(job.model)
    if kind is None:
        return [TermExplanation("attention", "gated delta-net", seconds,
                                why="linear attention: no kernel table (linear_attention_efficiency, fitted)")]
    gpu, dims = job.gpu, attention_dims(job.model)
    precision = "fp32" if job.layout.precision == "fp32" else "bf16"
    length = attention_kernel_length(job, kind)
    rates = dict(zip(("fwd", "bwd"), job.terms.attention_rates(job, dims, length)))
    rows = []
    for direction, rate in rates.items():
        pool = [e for e in entries("attention") if e.shape["direction"] == direction]
        pool = [e for e in pool if e.shape["mask"] == "causal"] or pool
        same_dims = [e for e in pool if (e.shape["d_qk"], e.shape["d_v"]) == dims]
        entry = nearest(pool, gpu, precision, lambda e: _log_gap(length, e.shape["seq_len"]),
                        lambda e: (e.shape["d_qk"], e.shape["d_v"]) != dims)
        verdict = measured_range(same_dims, gpu, precision, {"query tokens": (length, lambda e: e.shape["seq_len"])}) \
            if same_dims else (EXTRAPOLATED, f"no causal {direction} entry with head widths {dims[0]}/{dims[1]}")
        if job.packing is not None:
            verdict = (verdict[0], f"{verdict[1]}; packed documents run at their own lengths (shown: the full one)")
        shape = {"kind": kind, "query_tokens": length, "d_qk": dims[0], "d_v": dims[1], "mask": "causal"}
        rows.append(_explained("attention", "forward" if direction == "fwd" else "backward", seconds, shape,
                               rate / 1e12, rate / 1e12 / gpu.peak(precision), "TFLOP/s", entry, cal, verdict))
    return rows


def ep_rows(job: Job, seconds: float, cal: Calibration) -> list[TermExplanation]:
    L, gpu = job.layout, job.gpu
    if not (job.model.is_moe and L.ep > 1):
        return [TermExplanation("ep_comm", "dispatch + combine", seconds, why="no expert-parallel all-to-all (EP 1)")]
    span = dispatcher_comm.ep_span(L)
    link = "nvlink" if span <= gpu.nvlink_domain else "rdma"
    share = alltoall_share(gpu, L.dispatcher, span, link, cal)
    gbps = share * (gpu.nvlink_gbps if link == "nvlink" else gpu.scaleout_gbps)
    pool = [e for e in entries("ep_alltoall") if e.shape["link"] == link]
    # dispatch (FP8 under the FP8 recipes) and combine (BF16) are one term: any precision is as close
    entry = nearest(pool, gpu, None, lambda e: _log_gap(span, e.shape["ep"]))
    verdict = measured_range(pool, gpu, None, {"EP span": (span, lambda e: e.shape["ep"])})
    if L.dispatcher != "deepep":
        verdict = (EXTRAPOLATED, f"the tables are DeepEP's, the layout's dispatcher is {L.dispatcher}; {verdict[1]}")
    shape = {"ep_span": span, "link": link, "dispatcher": L.dispatcher}
    return [_explained("ep_comm", "dispatch + combine", seconds, shape, gbps, share, "GB/s", entry, cal, verdict)]


ROWS = {"gemm": gemm_rows, "attention": attention_rows, "ep_comm": ep_rows}


def explain_step(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout, time: StepTime,
                 cal: Calibration, packing: LengthHistogram | None = None) -> list[TermExplanation]:
    """Each component of `time` (the layout's predicted step) against the kernel tables, in the breakdown's order."""
    job = job_for(model, gpu, num_gpus, seq_len, layout, cal, packing)
    rows: list[TermExplanation] = []
    for component, seconds in time.components().items():
        if component == "compute":
            rows.append(TermExplanation(component, "whole", seconds, why="the sum of gemm, attention, elementwise"))
        elif gpu.is_cpu and component in COVERED:
            rows.append(TermExplanation(component, "whole", seconds,
                                        why="the kernel tables are of GPUs: the host's terms are fitted on it"))
        elif component in ROWS:
            rows += ROWS[component](job, seconds, cal)
        else:
            rows.append(TermExplanation(component, "whole", seconds, why=RESTS_ON.get(component, "")))
    return rows


__all__ = ["INSIDE", "EXTRAPOLATED", "NO_TABLE", "TermExplanation", "nearest", "measured_range", "layout_gemm_shapes",
           "gemm_rows", "attention_rows", "ep_rows", "explain_step"]
