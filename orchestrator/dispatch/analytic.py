"""The cost model as the measurement: what-if sweeps at any scale in seconds, no hardware."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

from search_spaces.layouts.layout import Layout
from search_spaces.result import TrialResult

from orchestrator.dispatch.base import TrialRequest, completed, stamp


class AnalyticBackend:
    name = "analytic"

    def __init__(self, estimate: Callable[[Layout], dict[str, Any]]):
        """`estimate(layout)`: the cost model's Estimate.to_dict() for the sweep's situation."""
        self.estimate = estimate

    def submit(self, request: TrialRequest) -> "concurrent.futures.Future[TrialResult]":
        return completed(stamp(self._result(self.estimate(request.layout)), request))

    @staticmethod
    def _result(est: dict[str, Any]) -> TrialResult:
        if not est.get("legal"):
            reasons = "; ".join(f"{v['rule']}: {v['reason']}" for v in est.get("violations") or [])
            return TrialResult(status="invalid", error=reasons or "illegal layout")
        if not est.get("fits"):
            return TrialResult(status="oom", peak_memory_gib=est.get("peak_memory_gib"),
                               error=f"predicted peak memory {est.get('peak_memory_gib'):.1f} GiB does not fit")
        memory = (est.get("breakdown") or {}).get("memory_gib") or {}
        step = est.get("step_time_s")
        return TrialResult(
            status="ok", tokens_per_sec_per_gpu=est.get("tokens_per_sec_per_gpu"),
            tflops_per_gpu=est.get("tflops_per_gpu"), mfu=est.get("mfu"), step_time_s=step,
            step_times_s=[step] if step is not None else [], peak_memory_gib=est.get("peak_memory_gib"),
            memory_gib={k: v for k, v in memory.items() if isinstance(v, (int, float))},
            wall_time_s=0.0, extra={"source": "costmodel"})

    def close(self) -> None:
        pass
