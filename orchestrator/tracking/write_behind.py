"""Finished trials' MLflow records made behind the sweep by a forked writer (orchestrator/tracking/writer_process.py)
on another core: half of an analytic sweep's time is MLflow's.

The Tracker's part that hands records to the writer and takes its answers (WriteBehind, a mixin of Tracker: the
writer serves the tracker's own copy, forked with it). Each run is still begun by the sweep; nothing is doubled or
lost (Tracker.write_behind says how).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from orchestrator.errors import LeaseLost, RunDirectoryError, TrackingLost
from orchestrator.storage import TrackingStore
from orchestrator.tracking.record_spool import RecordSpool
from orchestrator.tracking.runs import ChildRun, RunRecord
from orchestrator.tracking.writer_process import WriterProcess

RECORDED, SPOOLED, HANDED_BACK = "recorded", "spooled", "handed back"  # the writer's answers


class WriteBehind:
    """Tracker's records made by a forked writer. The tracker holds what this reads and writes of it."""

    store: TrackingStore
    fence: Callable[[], None]
    spool: RecordSpool
    _children: dict[int, ChildRun]
    _writer: WriterProcess | None
    _quiet_until: Callable[[], float]

    def _record_or_spool(self, run: RunRecord) -> bool:
        raise NotImplementedError  # the tracker's: make the record, or spool it

    def write_behind(self, quiet_until: Callable[[], float]) -> bool:
        """From now on, finished trials' records (their log_batch and set_terminated) are made by a forked writer
        (orchestrator/tracking/writer_process.py) on another core while the sweep goes on: half of an analytic
        sweep's time is MLflow's. False where no writer could be forked, or the store is not a database (an HTTP
        server: a fork cannot share the client's pooled sockets): the records are made here, as before.

        Each run is still begun here (its id is stored with the trial). Nothing is doubled or lost:
        - the fence: `quiet_until` is the lease's (Lease.quiet_until). The writer writes a record only before it
          (no rival can have taken the study then) and hands it back after it, for this process's fence to judge;
        - every record is answered before the sweep reads what MLflow holds (flush, finish, mark_failed,
          is_finished: `settle`); a record the writer could not deliver is in the spool, as here;
        - a writer that died hands back what it had not answered; such a record, and one handed back, is made here
          as a resumed one is: what its run already holds is not logged again;
        - the writer dies with this process: the records it had not made are made from the storage by the resume,
          like those of a driver killed before it sent them."""
        if not self.store.forkable:  # an HTTP client's pooled sockets cannot be shared by a fork
            return False
        self._quiet_until = quiet_until
        self._writer = WriterProcess.start(self._write_behind)
        return self._writer is not None

    def settle(self) -> None:
        """Wait until the writer has answered every record sent to it (or is gone: the rest are made here)."""
        writer = self._writer
        if writer is None:
            return
        self._answered(writer.answers(wait=True))
        if not writer.alive:
            self._writer = None
            writer.kill()
            for _, run, _ in writer.unanswered:
                self._children[run.record.number].may_hold_record = True
                self._record_or_spool(run)

    def close(self) -> None:
        """End the writer, its records answered first; killed when that fails (a lease lost: the new driver makes
        them from the storage)."""
        writer = self._writer
        if writer is None:
            return
        try:
            self.settle()
        except BaseException:
            writer.kill()
            raise
        finally:
            self._writer = None
        writer.close()

    def _answered(self, answers: list[tuple[Any, Any]]) -> None:
        """The writer's answers: each trial's run as the writer left it, and what became of its record."""
        for (_, run, _), (outcome, child) in answers:
            self._children[run.record.number] = child
            if outcome == SPOOLED:
                self.spool.pending += 1  # the writer wrote it to the spool file
            elif outcome == HANDED_BACK:
                child.may_hold_record = True  # what it holds is not logged again
                self._record_or_spool(run)

    def _write_behind(self, request: tuple[ChildRun, RunRecord, float]) -> tuple[str, ChildRun]:
        """In the writer: make one record while the lease is quiet, else hand it back."""
        child, run, quiet_until = request
        self.fence = lambda: _before(quiet_until)
        self._children[run.record.number] = child
        try:
            return (RECORDED if self._record_or_spool(run) else SPOOLED), child
        except (LeaseLost, TrackingLost, RunDirectoryError):  # the sweep's to judge: its own fence and store watch
            return HANDED_BACK, child


def _before(deadline: float) -> None:
    """The writer's fence: the lease's quiet time is over (a rival may hold it now): the sweep's own fence judges."""
    if time.monotonic() >= deadline:
        raise LeaseLost("the lease's quiet time is over: the record is handed back to the sweep")
