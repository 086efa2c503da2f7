"""A trial's child run as the tracker sees it: what it knows of the run (ChildRun) and what the run gets (RunRecord,
whose payload is also the spooled form of the record: orchestrator/tracking/record_spool.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.records import TrialRecord


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
