"""The cost model as the measurement: what-if sweeps at any scale in seconds, no hardware."""

from __future__ import annotations

import concurrent.futures

from search_spaces.result import TrialResult

from orchestrator.backends.base import TrialRequest, completed, stamp
from orchestrator.prior import Prior


class AnalyticBackend:
    name = "analytic"

    def __init__(self, prior: Prior):
        self.prior = prior

    def submit(self, request: TrialRequest) -> "concurrent.futures.Future[TrialResult]":
        pred = self.prior.predict(request.layout)
        data = pred.data
        memory = (data.get("breakdown") or {}).get("memory_gib") or {}
        if not pred.legal:
            result = TrialResult(status="invalid", error=pred.reason)
        elif not pred.fits:
            result = TrialResult(status="oom", error=pred.reason, peak_memory_gib=pred.peak_memory_gib)
        else:
            result = TrialResult(
                status="ok",
                tokens_per_sec_per_gpu=pred.tokens_per_sec_per_gpu,
                tflops_per_gpu=data.get("tflops_per_gpu"),
                mfu=data.get("mfu"),
                step_time_s=data.get("step_time_s"),
                step_times_s=[data["step_time_s"]] if data.get("step_time_s") is not None else [],
                peak_memory_gib=pred.peak_memory_gib,
                memory_gib={k: v for k, v in memory.items() if isinstance(v, (int, float))},
                wall_time_s=0.0,
                extra={"source": "costmodel"},
            )
        return completed(stamp(result, request))

    def close(self) -> None:
        pass
