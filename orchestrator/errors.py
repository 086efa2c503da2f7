"""Errors of the orchestrator's stores (the Optuna storage and the MLflow tracking store) and of its cluster.

Both are `MoeAutotuneError`s (one line on the command line). A store that cannot be used at the start
is bad input (exit 2, nothing created); a store that fails in the middle of a sweep (a full disk) exits
with 4 once what was measured is safe (see the README's failure table). The environment failing mid-sweep stops the
sweep, never a layout: a full disk 4, the MLflow store vanished 8, the run directory refusing writes 7, the Optuna
storage refusing writes 9.

| exit | class |
|---|---|
| 2 | MoeAutotuneError (bad input), StorageError, TrackingError, ClusterError at the start |
| 4 | StorageFull, TrackingFull, RunDirectoryFull |
| 5 | LeaseLost |
| 6 | OutputError |
| 7 | RunDirectoryError |
| 8 | TrackingLost |
| 9 | StorageRefused |
"""

from __future__ import annotations

from search_spaces.errors import MoeAutotuneError


class StorageError(MoeAutotuneError):
    """The Optuna storage cannot be opened, is taken by another running sweep, or refused a write."""


class StorageFull(StorageError):
    """The device under the Optuna storage is full; results so far are kept (storage or spool)."""
    exit_code = 4


class StorageRefused(StorageError):
    """The Optuna storage stopped taking writes mid-sweep: its file or folder made read-only or immutable, a
    read-only remount (orchestrator/storage/write_guard.py notices a SQLite file whose write-ahead log would take
    the writes on). The environment, not a layout: the sweep stops, the trial in flight is never charged to its
    layout (--resume runs it again once the storage takes writes): exit 9. At the start it is bad input (exit 2)."""
    exit_code = 9


class LeaseLost(StorageError):
    """Another driver took this study over (this one was presumed dead); this one writes nothing more
    (orchestrator/sweep/lease.py fences every write with it)."""
    exit_code = 5


class ClusterError(MoeAutotuneError):
    """The cluster cannot place even the smallest trial the sweep asks for (a GPU spec on a Ray cluster without
    GPUs, fewer nodes than every trial spans): one line naming both, exit 2, before anything is stored."""

    @classmethod
    def no_trial(cls, study: str, reason: str) -> "ClusterError":
        """`reason`: what a trial asks for and what the cluster has (orchestrator/dispatch/ray_cluster.py)."""
        return cls(f"no trial of sweep {study!r} can run on this Ray cluster: {reason} (run on nodes that have "
                   f"them, join another cluster with --ray-address, or change gpu, nodes or gpus_per_node)")


class TrackingError(MoeAutotuneError):
    """The MLflow tracking store cannot be used."""


class TrackingFull(TrackingError):
    """The device under the MLflow store is full (it could not even be created); free space and rerun."""
    exit_code = 4


class TrackingLost(TrackingError):
    """The MLflow store vanished mid-sweep: its SQLite file or file store deleted or replaced (MLflow's engine would
    write on into the deleted file, or make a new empty one), its parent run gone. Noticed at the next MLflow write
    (orchestrator/tracking/tracker.py); the sweep stops, what was measured kept in the Optuna storage for --resume to
    record: exit 8."""
    exit_code = 8


class RunDirectoryError(MoeAutotuneError):
    """The sweep's run directory (`<workdir>/<study>`: the trials' folders, the result and record spools) stopped
    taking writes mid-sweep: read-only, immutable, refused, not a folder. The environment, not a layout: the sweep
    stops, the trial in flight is recorded as interrupted (run again by --resume), never as its layout's error;
    exit 7 (orchestrator/storage/run_directory.py)."""
    exit_code = 7


class RunDirectoryFull(RunDirectoryError):
    """The device under the run directory is full: exit 4, as every full disk of a sweep."""
    exit_code = 4


class OutputError(MoeAutotuneError):
    """An output the user named (a file of `status --csv`, `calibrate --out`, `report --out`, or standard output
    itself) could not be written: a full device, a closed pipe, an I/O error. The environment, not the input:
    exit 6, and nothing half-written is left (orchestrator/userio.py)."""
    exit_code = 6
