"""A running trial's steps, as its trainer reports them, and the sweep's way to stop it.

Rank 0 of the trainer appends one JSON line per step to `progress.jsonl` in the trial's folder (`--progress`): its
index, phase (warmup or measured), step time, tokens/s/GPU, peak memory so far and loss. The folder is where the
trainer writes its result, and the driver reads that result from it: on a multi-node Ray cluster the trial folders
are on a file system every node shares already. So the backend's thread of each trial tails the file there (every
POLL_S, whole lines only) into the trial's StepFeed; the sweep's loop takes the steps from the feed (and reports them
to Optuna and MLflow from its own thread), and stops the trial through it (`stop`: the backend kills its process
trees, as at a sweep's stop, and answers with a pruned result). Backends without steps (analytic, replay) are handed
no feed.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

from search_spaces.result import TrialResult
from search_spaces.stopping import CANNOT_WIN

PROGRESS_FILE = "progress.jsonl"
MAX_READ_BYTES = 1 << 20  # what one look at a progress file reads at most (a runaway file is read in parts)
PHASES = ("warmup", "measured")


class StepFeed:
    """Between one trial's backend thread and the sweep's loop: the steps read so far, and the sweep's stop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        """Every step read so far, in order."""
        self._stop: str | None = None

    def put(self, steps: list[dict[str, Any]]) -> None:
        if steps:
            with self._lock:
                self._new += steps
                self.steps += steps

    def take(self) -> list[dict[str, Any]]:
        """The steps read since the last take."""
        with self._lock:
            new, self._new = self._new, []
        return new

    def stop(self, reason: str) -> None:
        """The sweep decided the trial (cannot win): its backend kills it and answers with a pruned result."""
        with self._lock:
            self._stop = self._stop or reason

    @property
    def stop_reason(self) -> str | None:
        with self._lock:
            return self._stop

    def pruned(self, wall_time_s: float) -> TrialResult:
        """The result of a trial the sweep stopped: status pruned, its reason, the measured steps' times and the
        peak memory they reached; no throughput (it is no measurement)."""
        with self._lock:
            steps, reason = list(self.steps), self._stop or "stopped by the sweep"
        measured = [s["step_time_s"] for s in steps if s.get("phase") == "measured" and _number(s.get("step_time_s"))]
        peaks = [s["peak_memory_gib"] for s in steps if _number(s.get("peak_memory_gib"))]
        return TrialResult(status="pruned", error=reason, step_times_s=measured,
                           peak_memory_gib=max(peaks) if peaks else None, wall_time_s=wall_time_s,
                           extra={"stop_rule": CANNOT_WIN, "stop_reason": reason, "steps_run": len(steps)})


class ProgressTail:
    """The steps appended to a progress file since the last read: whole lines only (a line being written waits for
    the next read); a line that is not a step is passed over."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(MAX_READ_BYTES)
        except OSError:  # not there yet (or gone): nothing new
            return []
        self.offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [step for step in map(parse_step, lines) if step is not None]


def parse_step(line: bytes | str) -> dict[str, Any] | None:
    """One progress line as a step (a mapping with an integer `step` >= 0 and a known phase), or None."""
    try:
        step = json.loads(line)
    except ValueError:
        return None
    if not isinstance(step, dict) or type(step.get("step")) is not int or step["step"] < 0:
        return None
    return step if step.get("phase") in PHASES else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
