"""The cost model's front door: legality + memory + throughput for one layout -> `Estimate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from search_spaces.calibration.calibration_file import Calibration, calibration
from search_spaces.catalog.hardware import GPUSpec, load_gpu
from search_spaces.catalog.models import ModelSpec, load_model
from search_spaces.cost.breakdown import GIB, MemoryBreakdown, StepTime
from search_spaces.cost.extra_memory import extra_memory_terms, with_extra_memory
from search_spaces.cost.flops import flops_per_step
from search_spaces.cost.memory import memory_breakdown
from search_spaces.cost.offload import host_refusal
from search_spaces.cost.packing import (
    LengthHistogram,
    packed_flops_per_step,
    packing_report,
    statistics_for,
    useful_share,
)
from search_spaces.cost.pipeline import placement
from search_spaces.cost.throughput import step_time
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout
from search_spaces.layouts.rules import Violation, check


@dataclass
class Estimate:
    """What the cost model says of one layout. An illegal layout has its violations and no figures."""
    legal: bool
    """No legality rule refuses the layout."""
    violations: list[Violation]
    """The rules that refuse it (empty when legal)."""
    fits: bool = False
    """Its predicted peak memory fits the GPU's."""
    peak_memory_gib: float | None = None
    """Predicted peak memory per GPU, GiB (on the most loaded pipeline rank)."""
    tokens_per_sec_per_gpu: float | None = None
    """Predicted training throughput: tokens per second per GPU."""
    tflops_per_gpu: float | None = None
    """Model TF/s per GPU in Bridge's FLOP count."""
    mfu: float | None = None
    """tflops_per_gpu over the GPU's dense peak at the layout's precision."""
    step_time_s: float | None = None
    """Predicted seconds per optimizer step (time.step)."""
    memory: MemoryBreakdown | None = None
    """Bytes per GPU by component on the most loaded rank (None when illegal)."""
    time: StepTime | None = None
    """Seconds per step by component (None when illegal or estimated without time)."""
    model: str = ""
    """The model's name."""
    gpu: str = ""
    """The accelerator's name."""
    num_gpus: int = 0
    """GPUs of the run."""
    seq_len: int = 0
    """Tokens per sequence."""
    layout: dict[str, Any] = field(default_factory=dict)
    """The layout estimated (Layout.to_dict)."""
    pipeline_layout: str = ""
    """Megatron's pipeline layout string of the placement (E embedding, t layer, m MTP, L loss; | between stages)."""
    memory_capacity_gib: float = 0.0
    """What the GPU can allocate, GiB."""
    host_memory_refusal: str | None = None
    """Why the host's pinned memory cannot hold what the layout offloads (search_spaces/cost/offload.py): then it
    does not fit either; None when it can."""
    packing: dict[str, Any] | None = None
    """Packed documents (search_spaces/packing.packing_report): useful-token and padding shares, attention left of
    a full-length sequence's, the distribution's summary; None for one document per sequence."""

    def to_dict(self) -> dict[str, Any]:
        """The public JSON form (`estimate --json`): figures, and the breakdown in GiB and seconds."""
        return {
            "legal": self.legal,
            "violations": [v.to_dict() for v in self.violations],
            "fits": self.fits,
            "peak_memory_gib": self.peak_memory_gib,
            "memory_capacity_gib": self.memory_capacity_gib,
            "tokens_per_sec_per_gpu": self.tokens_per_sec_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "step_time_s": self.step_time_s,
            "breakdown": {"memory_gib": self.memory.to_gib() if self.memory else {},
                          "time_s": self.time.components() if self.time else {}},
            "model": self.model,
            "gpu": self.gpu,
            "num_gpus": self.num_gpus,
            "seq_len": self.seq_len,
            "layout": dict(self.layout),
            "pipeline_layout": self.pipeline_layout,
            **({"host_memory_refusal": self.host_memory_refusal} if self.host_memory_refusal else {}),
            **({"packing": self.packing} if self.packing is not None else {}),
        }


def _resolve(model: ModelSpec | str, gpu: GPUSpec | str) -> tuple[ModelSpec, GPUSpec]:
    return (load_model(model) if isinstance(model, str) else model,
            load_gpu(gpu) if isinstance(gpu, str) else gpu)


def estimate(model: ModelSpec | str, gpu: GPUSpec | str, num_gpus: int, seq_len: int, layout: Layout,
             with_time: bool = True, cal: Calibration | None = None,
             packing: LengthHistogram | None = None) -> Estimate:
    """Predict legality, peak memory and speed of `layout`. Illegal layouts get legal=False and no figures.
    `cal`: the calibration's constants (search_spaces.calibration.calibration_file.load_calibration; default the
    packaged one). `packing`: documents packed into each sequence (search_spaces/cost/packing.py): tokens/s counts real
    tokens only; None: one document of seq_len tokens per sequence."""
    model, gpu = _resolve(model, gpu)
    if int(num_gpus) < 1:
        raise SpecError(f"num_gpus must be >= 1, got {num_gpus}")
    if int(seq_len) < 1:
        raise SpecError(f"seq_len must be >= 1, got {seq_len}")
    violations = check(model, gpu, num_gpus, seq_len, layout)
    est = Estimate(legal=not violations, violations=violations, model=model.name, gpu=gpu.name,
                   num_gpus=num_gpus, seq_len=seq_len, layout=layout.to_dict(), memory_capacity_gib=gpu.memory_gib)
    if violations:
        return est
    place = placement(model, layout.pp, layout.vpp)
    est.pipeline_layout = place.layout_string() if place else ""
    cal = cal or calibration()
    est.memory = _memory(model, gpu, num_gpus, seq_len, layout, cal)
    est.peak_memory_gib = est.memory.peak / GIB
    est.fits = est.peak_memory_gib <= gpu.memory_gib
    est.host_memory_refusal = host_refusal(gpu, est.memory.offloaded_to_host)
    if est.host_memory_refusal:
        est.fits = False
    if packing is not None:
        est.packing = packing_report(packing, seq_len, layout)
    if with_time:
        est.time = step_time(model, gpu, num_gpus, seq_len, layout, cal, packing)
        step = est.time.step
        est.step_time_s = step
        est.tokens_per_sec_per_gpu = _tokens_per_sec_per_gpu(layout, seq_len, num_gpus, step) \
            * useful_share(packing, seq_len, layout)
        stats = statistics_for(packing, seq_len, layout.cp, layout.tp, layout.sp)
        model_flops = flops_per_step(model, seq_len, layout.gbs) if stats is None else \
            packed_flops_per_step(model, seq_len, layout.gbs, stats)
        est.tflops_per_gpu = model_flops / step / num_gpus / 1e12
        if est.packing is not None:
            est.packing["attention_share_of_step"] = est.time.attention / step
        est.mfu = est.tflops_per_gpu / gpu.peak(layout.precision)
    return est


def tokens_per_sec_per_gpu(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
                           cal: Calibration | None = None, packing: LengthHistogram | None = None) -> float:
    """`estimate(...).tokens_per_sec_per_gpu` of a legal layout without the rest of the estimate: what `space`
    ranks its candidates by (it estimates only the fastest whole)."""
    step = step_time(model, gpu, num_gpus, seq_len, layout, cal or calibration(), packing).step
    return _tokens_per_sec_per_gpu(layout, seq_len, num_gpus, step) * useful_share(packing, seq_len, layout)


def _tokens_per_sec_per_gpu(layout: Layout, seq_len: int, num_gpus: int, step: float) -> float:
    return layout.gbs * seq_len / step / num_gpus


def peak_memory_gib(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
                    cal: Calibration | None = None) -> float | None:
    """`estimate(...).peak_memory_gib` without the rest of the estimate (None for an illegal layout): what
    `space` asks of tens of thousands of candidates."""
    if check(model, gpu, num_gpus, seq_len, layout):
        return None
    return legal_peak_memory_gib(model, gpu, num_gpus, seq_len, layout, cal)


def legal_peak_memory_gib(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
                          cal: Calibration | None = None) -> float:
    """peak_memory_gib of a layout the caller knows is legal (`space` knows its candidates are: the rules'
    check is a tenth of the time of a peak)."""
    extra = extra_memory_terms(model, gpu, seq_len, layout, cal or calibration())
    return memory_breakdown(model, gpu, num_gpus, seq_len, layout).peak_with(*extra) / GIB


def _memory(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
            cal: Calibration) -> MemoryBreakdown:
    return with_extra_memory(memory_breakdown(model, gpu, num_gpus, seq_len, layout), model, gpu, seq_len, layout,
                             cal)


__all__ = ["Estimate", "estimate", "legal_peak_memory_gib", "peak_memory_gib", "tokens_per_sec_per_gpu"]
