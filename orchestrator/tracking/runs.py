"""A trial's child run as the tracker sees it: what it knows of the run (ChildRun) and what the run gets (RunRecord,
whose payload is also the spooled form of the record: orchestrator/tracking/record_spool.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mlflow.entities import Metric

from orchestrator.records import TrialRecord

STEP_PREFIX = "step/"
"""A running trial's step metrics (step/step_time_s, ...), apart from the figures its record logs when it ends."""
STEP_FIGURES = ("step_time_s", "tokens_per_sec_per_gpu", "peak_memory_gib", "loss")


@dataclass
class ChildRun:
    """What the tracker knows of a trial's run, without another round trip to the server."""
    run_id: str
    status: str  # RUNNING | FINISHED | FAILED | KILLED
    params: dict[str, str]
    # the run may hold part of its trial's record, whose figures are then not logged again: begun by an earlier
    # driver of the study (found on resume), or a record of it begun here that did not finish (spooled, handed back)
    may_hold_record: bool = False
    params_logged: bool = True  # False: made for a finished trial's record, whose batch logs its params
    started_ms: int | None = None
    """The run's start time: the timestamp of every figure of its record, so that a record made twice (a retry
    that raced another writer of the run) is the same rows twice, which MLflow's store keeps once."""


@dataclass(frozen=True)
class RunRecord:
    """What a trial's child run gets: the trial's record and the log files of its directory."""
    record: TrialRecord
    logs: tuple[str, ...] = ()

    def payload(self) -> dict[str, Any]:
        """The spooled form: the record's user attrs and the logs (what an older spool line holds too)."""
        return {**self.record.stored_attrs(), "logs": list(self.logs)}

    @classmethod
    def from_payload(cls, number: int, payload: dict[str, Any]) -> "RunRecord":
        logs = payload.get("logs")
        return cls(TrialRecord.from_attrs(number, payload),
                   tuple(str(p) for p in logs) if isinstance(logs, list) else ())


def step_metrics(steps: list[dict[str, Any]], timestamp_ms: int) -> list[Metric]:
    """The MLflow metrics of a running trial's reported steps (orchestrator/dispatch/steps.py): each figure as
    `step/<figure>` at the trainer's step index (warm-up included), and `step/measured` 1 for a measured step, 0 for a
    warm-up one."""
    out = []
    for step in steps:
        index = step["step"]
        measured = 1.0 if step.get("phase") == "measured" else 0.0
        out.append(Metric(f"{STEP_PREFIX}measured", measured, timestamp_ms, index))
        for name in STEP_FIGURES:
            value = step.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out.append(Metric(f"{STEP_PREFIX}{name}", float(value), timestamp_ms, index))
    return out
