"""One trial lifecycle, one vocabulary: what became of each proposal, as every view counts it.

    proposed -> rejected                      the cost model, the Layout's own rules or the cluster refused it,
                                              or it repeated a layout already taken: never ran, free
             -> queued -> running -> finished  measured, status ok
                                  -> failed    did not measure: oom, error, timeout, invalid; or unschedulable
                                               (the cluster could not place it: free, like a rejection)
                                  -> pruned    stopped early by the sweep
                                  -> interrupted  the sweep stopped while it ran (--resume runs it again)

The live line, the sweep's summary, `status`, `check`, the report and the MLflow run status all derive from
`state_of` and count with `Tally`: they cannot disagree. A rejected proposal gets no MLflow child run (it is a row of
the parent run's `rejected` table); a failed one is FAILED, an interrupted one KILLED.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from orchestrator.records.trial import TrialRecord

REJECTED, QUEUED, RUNNING, FINISHED, FAILED, PRUNED, INTERRUPTED = (
    "rejected", "queued", "running", "finished", "failed", "pruned", "interrupted")
STATES = (FINISHED, FAILED, PRUNED, INTERRUPTED, RUNNING, QUEUED, REJECTED)
"""In the order a summary lists them."""

# the MLflow status of a trial's child run in each state (a rejected proposal has no child run)
MLFLOW_STATUS = {FINISHED: "FINISHED", FAILED: "FAILED", PRUNED: "KILLED", INTERRUPTED: "KILLED",
                 RUNNING: "RUNNING", QUEUED: "SCHEDULED"}

# statuses of a trial that never ran (search_spaces.result.STATUSES)
_REJECTED_STATUSES = ("infeasible",)


def state_of(record: TrialRecord) -> str:
    """The lifecycle state of a stored trial (its Optuna state and the status the sweep stored)."""
    if record.state == "running":
        return RUNNING
    if record.state == "waiting":
        return QUEUED
    if record.status == "interrupted":
        return INTERRUPTED
    if record.status is None or record.status in _REJECTED_STATUSES:  # a discarded repeat stores no status
        return REJECTED  # (Optuna: PRUNED with its constraints, or FAIL for a repeat)
    if record.status == "pruned" or record.state == "pruned":
        return PRUNED
    return FINISHED if record.status == "ok" else FAILED


def state_of_status(status: str | None) -> str:
    """The state a trial just recorded with `status` is in (the live line's rows)."""
    return state_of(TrialRecord(number=-1, status=status))


def mlflow_status(status: str | None) -> str:
    """The MLflow status of the child run of a trial recorded with `status`: FINISHED only for a measurement; a
    rejected proposal (a child run only when the spec asks for one: track_rejected) never ran: KILLED."""
    return MLFLOW_STATUS.get(state_of_status(status), "KILLED")


@dataclass
class Tally:
    """How many trials are in each lifecycle state."""
    counts: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, records: Iterable[TrialRecord]) -> "Tally":
        return cls(Counter(state_of(r) for r in records))

    def add(self, state: str) -> None:
        self.counts[state] += 1

    def add_status(self, status: str | None) -> None:
        """A trial just recorded with `status` (the live line's count)."""
        self.add(state_of_status(status))

    def line(self) -> str:
        """`12 finished, 1 failed, 11 rejected`: the states with trials, in STATES order."""
        return ", ".join(f"{self.counts[s]} {s}" for s in STATES if self.counts[s]) or "no trials"


__all__ = ["FAILED", "FINISHED", "INTERRUPTED", "MLFLOW_STATUS", "PRUNED", "QUEUED", "REJECTED", "RUNNING",
           "STATES", "Tally", "mlflow_status", "state_of", "state_of_status"]
