"""The cost model's front door: legality + memory + throughput for one layout -> `Estimate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from search_spaces.errors import SpecError
from search_spaces.flops import flops_per_step
from search_spaces.hardware import GPUSpec, load_gpu
from search_spaces.layout import Layout
from search_spaces.memory import GIB, PEAK_KEYS, memory_breakdown, to_gib
from search_spaces.models import ModelSpec, load_model
from search_spaces.pipeline import placement
from search_spaces.rules import Violation, check
from search_spaces.extra_memory import EXTRA_PEAK_KEYS, with_extra_memory
from search_spaces.throughput import calibration, step_time


@dataclass
class Estimate:
    legal: bool
    violations: list[Violation]
    fits: bool = False
    peak_memory_gib: float | None = None
    tokens_per_sec_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    breakdown: dict[str, dict[str, float]] = field(default_factory=lambda: {"memory_gib": {}, "time_s": {}})
    model: str = ""
    gpu: str = ""
    num_gpus: int = 0
    seq_len: int = 0
    layout: dict[str, Any] = field(default_factory=dict)
    pipeline_layout: str = ""
    memory_capacity_gib: float = 0.0

    def to_dict(self) -> dict[str, Any]:
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
            "breakdown": {k: dict(v) for k, v in self.breakdown.items()},
            "model": self.model,
            "gpu": self.gpu,
            "num_gpus": self.num_gpus,
            "seq_len": self.seq_len,
            "layout": dict(self.layout),
            "pipeline_layout": self.pipeline_layout,
        }


def _resolve(model: ModelSpec | str, gpu: GPUSpec | str) -> tuple[ModelSpec, GPUSpec]:
    return (load_model(model) if isinstance(model, str) else model,
            load_gpu(gpu) if isinstance(gpu, str) else gpu)


def estimate_memory(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
                    cal: dict | None = None) -> dict[str, float]:
    """Memory breakdown in GiB (assumes a legal layout)."""
    return to_gib(with_extra_memory(memory_breakdown(model, gpu, num_gpus, seq_len, layout), model, gpu, seq_len,
                                    layout, cal or calibration()))


def estimate(model: ModelSpec | str, gpu: GPUSpec | str, num_gpus: int, seq_len: int, layout: Layout,
             with_time: bool = True, cal: dict | None = None) -> Estimate:
    """Predict legality, peak memory and speed of `layout`. Illegal layouts get legal=False and no figures.
    `cal`: the calibration's constants (search_spaces.calibration.load_calibration; default the packaged one)."""
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
    mem = to_gib(with_extra_memory(memory_breakdown(model, gpu, num_gpus, seq_len, layout), model, gpu, seq_len,
                                   layout, cal))
    est.peak_memory_gib = mem.pop("peak")
    est.fits = est.peak_memory_gib <= gpu.memory_gib
    est.breakdown["memory_gib"] = mem
    if with_time:
        times = step_time(model, gpu, num_gpus, seq_len, layout, cal)
        step = times.pop("step")
        est.step_time_s = step
        est.breakdown["time_s"] = times
        tokens = layout.gbs * seq_len
        est.tokens_per_sec_per_gpu = tokens / step / num_gpus
        est.tflops_per_gpu = flops_per_step(model, seq_len, layout.gbs) / step / num_gpus / 1e12
        est.mfu = est.tflops_per_gpu / gpu.peak(layout.precision)
    return est


__all__ = ["Estimate", "estimate", "estimate_memory", "PEAK_KEYS", "EXTRA_PEAK_KEYS", "GIB"]
