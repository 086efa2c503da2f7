"""Is the MLflow store a sweep writes still the one it opened? A store deleted mid-sweep goes unnoticed otherwise:
MLflow's SQLite engine writes on into the deleted file through the connection it holds (or makes a new empty file at
its next connection), and the sweep ended with exit 0, its records nowhere.

Each write of the tracker asks first (`check`: one stat of the store's file or folder, TrackingStore.vanished); the
sweep's end asks once more, and also whether its parent run is still there (`parent_gone`: a server's store wiped).
A store gone is TrackingLost: one line, exit 8; what was measured is in the Optuna storage, and --resume records it
in the store (a new one, or the one put back).
"""

from __future__ import annotations

import os
from typing import Any

from orchestrator.errors import TrackingLost
from orchestrator.storage import TrackingStore


class StoreWatch:
    """The store a tracker opened (`opened`), and why it is gone once it is (`lost`: every later write is refused)."""

    def __init__(self, store: TrackingStore):
        self.store = store
        self.identity: tuple[int, int] | None = None
        self.lost: str | None = None
        self._held: int | None = None

    def opened(self) -> None:
        """The store was opened (made, if new) just now: the file or folder that holds it is the one to keep. It is
        held open (O_PATH: no read, no lock, and closing it never drops SQLite's locks), so that its inode is not
        reused by a file made under its name once it is deleted: a new file always reads as another."""
        path, how = self.store.path, getattr(os, "O_PATH", None)
        if path is not None and how is not None and self._held is None:
            try:
                self._held = os.open(path, how)
            except OSError:
                self._held = None
        self.identity = self.store.identity()

    def release(self) -> None:
        """The tracker is done with the store."""
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def check(self) -> None:
        """Before a write: TrackingLost when the store vanished (deleted, replaced, its folder gone)."""
        if self.lost is None:
            why = self.store.vanished(self.identity)
            if why is not None:
                self.lose(why)
        if self.lost is not None:
            raise TrackingLost(self.lost)

    def parent_gone(self, client: Any, run_id: str | None) -> None:
        """At the sweep's end: TrackingLost when its parent run no longer exists (a store emptied or replaced
        behind a server); any other answer is left to the writes that follow."""
        from mlflow.exceptions import MlflowException

        if run_id is None or self.lost is not None:
            return
        try:
            client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                self.lose(f"its parent run {run_id} no longer exists")
        self.check()

    def lose(self, why: str) -> None:
        self.lost = (f"the MLflow store {self.store.shown} vanished mid-sweep: {why}; the sweep stopped, what was "
                     "measured is kept in the Optuna storage: put the store back (or let a new one be made) and rerun "
                     "with --resume to record it")


__all__ = ["StoreWatch"]
