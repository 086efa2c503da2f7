"""Is the MLflow store a sweep writes still the one it opened? A store deleted mid-sweep goes unnoticed otherwise:
MLflow's SQLite engine writes on into the deleted file through the connection it holds (or makes a new empty file at
its next connection), and the sweep ended with exit 0, its records nowhere.

Each write of the tracker asks first (`check`: one stat of the store's file or folder, TrackingStore.vanished); the
sweep's end asks once more, and also whether its parent run is still there (`parent_gone`: a server's store wiped).
A store gone is TrackingLost: one line, exit 8; what was measured is in the Optuna storage, and --resume records it
in the store (a new one, or the one put back). A server's store answers for itself: a write it refuses with an answer
(not a server that is down) asks whether the sweep's experiment and parent run are still there (`runs_gone`); an
experiment deleted (in MLflow's trash) or gone, a parent run gone (the server's store wiped, or the server restarted
on another) is the same exit 8, where before each record was spooled and the sweep ended with exit 3 (and a resume
into a deleted experiment was an internal error).
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

    def runs_gone(self, failed: Exception, client: Any, experiment_id: str | None, run_id: str | None) -> None:
        """After a write `failed` with the store's answer (MLflow's error, not a store that is down, which is not
        asked again): TrackingLost when it no longer holds the sweep's runs (gone_runs); else the spool keeps it."""
        from mlflow.exceptions import MlflowException

        if self.lost is None and experiment_id is not None and isinstance(failed, MlflowException):
            found = gone_runs(client, experiment_id, run_id)
            if found is not None:
                self.lost = lost_runs(self.store.shown, *found)
        self.check()

    def lose(self, why: str) -> None:
        self.lost = (f"the MLflow store {self.store.shown} vanished mid-sweep: {why}; the sweep stopped, what was "
                     "measured is kept in the Optuna storage: put the store back (or let a new one be made) and rerun "
                     "with --resume to record it")


def gone_runs(client: Any, experiment_id: str, run_id: str | None) -> tuple[str, str] | None:
    """(why, what to do) when the store no longer holds the sweep's experiment or parent run, or holds them deleted
    (in MLflow's trash); None when they are there, or the store cannot be asked now (down: the spool keeps it)."""
    from mlflow.exceptions import MlflowException

    try:
        experiment = client.get_experiment(experiment_id)
        if experiment.lifecycle_stage == "deleted":
            return deleted_experiment(experiment.name, experiment_id)
        if run_id is not None and client.get_run(run_id).info.lifecycle_stage == "deleted":
            return f"its parent run {run_id} was deleted", "restore it (MLflow's UI) and rerun with --resume"
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return (f"its experiment (id {experiment_id}) or parent run {run_id} no longer exists (the store was "
                    "wiped, or the server now serves another)", "rerun with --resume")
    except Exception:  # noqa: BLE001 -- cannot be asked now (down): the record waits in the spool
        return None
    return None


def deleted_experiment(name: str, experiment_id: str) -> tuple[str, str]:
    return (f"its experiment {name!r} (id {experiment_id}) was deleted",
            f"restore it (mlflow experiments restore --experiment-id {experiment_id}) or remove it for good (mlflow gc "
            f"--experiment-ids {experiment_id}), then rerun with --resume")


def lost_runs(shown: str, why: str, remedy: str) -> str:
    """The one line of a store that lost the sweep's runs."""
    return (f"the MLflow store {shown} lost the sweep's runs: {why}; the sweep stopped, what was measured is kept in "
            f"the Optuna storage: {remedy} to record it")


__all__ = ["StoreWatch", "deleted_experiment", "gone_runs", "lost_runs"]
