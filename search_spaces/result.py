"""TrialResult: what one profiling run measured, as written by the trainer and read by the orchestrator.

Plain data, JSON on disk; importable without torch. The trainer writes it (rank 0, atomically);
the orchestrator reads it, adds the prediction beside it and records it.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from search_spaces.failures import CLASS_NAMES

# ok: measured; oom: ran out of memory; error: crashed; invalid: ran but the numbers cannot be trusted
# (CP/EP/dispatcher not in effect, TF/s above peak, non-finite loss); timeout: killed by the orchestrator;
# infeasible: the cost model rejected it, never run; interrupted: the job/node went away; unschedulable: the
# cluster could not place it (it asks for more than any node set has, or waited placement_timeout_s), never run;
# pruned: the sweep stopped it once it could not win (search_spaces/stopping.py), no measurement.
STATUSES = ("ok", "oom", "error", "invalid", "timeout", "infeasible", "interrupted", "unschedulable", "pruned")
# the statuses of trials that ran (they count against a sweep's budget and its GPU-hours); infeasible and
# unschedulable are free
MEASURED_STATUSES = ("ok", "oom", "error", "invalid", "timeout", "interrupted", "pruned")


@dataclass
class TrialResult:
    status: str = "error"
    tokens_per_sec_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    # max over ranks (GiB); per-rank detail in peak_memory_gib_per_rank
    peak_memory_gib: float | None = None
    peak_memory_gib_per_rank: list[float] = field(default_factory=list)
    # measured components in GiB on the most loaded rank: weights, gradients, optimizer_states,
    # activations_per_microbatch (same names as the cost model's memory breakdown)
    memory_gib: dict[str, float] = field(default_factory=dict)
    applied: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    layout: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    gpu: str | None = None
    num_gpus: int | None = None
    seq_len: int | None = None
    wall_time_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # a failed trial's root cause (search_spaces/failures.py): its class (FAILURE_CLASSES), the rank that failed
    # first (None when unknown) and one line; None for a trial that did not fail (and in older result files)
    failure_class: str | None = None
    failure_rank: int | None = None
    failure_reason: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown trial status {self.status!r}; allowed: {', '.join(STATUSES)}")
        if self.failure_class is not None and self.failure_class not in CLASS_NAMES:
            raise ValueError(f"unknown failure class {self.failure_class!r}; allowed: {', '.join(CLASS_NAMES)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialResult":
        known = {f.name for f in fields(cls)}
        extra = {k: v for k, v in data.items() if k not in known}
        obj = cls(**{k: v for k, v in data.items() if k in known})
        obj.extra.update(extra)
        return obj

    def write(self, path: str | os.PathLike) -> None:
        """Atomic write: a reader never sees half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.to_dict(), fh, indent=2, default=_json_default, allow_nan=True)
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "TrialResult":
        from search_spaces.bounded import read_json  # a trainer's file: bounded like every file read

        return cls.from_dict(read_json(path, "trial result", limit=16 << 20))

    @property
    def loss_finite(self) -> bool:
        return bool(self.loss) and all(math.isfinite(x) for x in self.loss)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)
