"""The two store interfaces, one per thing a sweep keeps: the Optuna storage of its study (`StudyStore`) and the
MLflow store of its records (`TrackingStore`). One class per backend implements each (like Optuna's
`optuna.storages` and MLflow's store registry); `orchestrator.storage.study_store(url)` and `tracking_store(uri)`
map a URL to its backend, so no caller branches on a URL's scheme.

A store is a description of a URL, cheap to make; nothing is opened, created or probed until a method is called.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from pathlib import Path
from typing import Any

import orchestrator.storage.connections as connections
from orchestrator.errors import StorageError, StorageFull, StorageRefused, TrackingError, TrackingFull
from orchestrator.redact import redact_uri
from orchestrator.storage.connections import MLFLOW, BoundedClient, mlflow_client, root_line, unreachable
from orchestrator.storage.files import device, disk_full
from orchestrator.storage.write_guard import REFUSALS, refusal

OPTUNA = "Optuna storage"  # how error lines name the study's store (connections.MLFLOW: the tracking store)
__all__ = ["MLFLOW", "OPTUNA", "Store", "StudyStore", "TrackingStore"]


class Store:
    """A store at a URL."""

    kind: str = ""
    """What the store is, in a few words (error lines, `--help`)."""

    def __init__(self, url: str):
        self.url = url

    @property
    def shown(self) -> str:
        """The URL as lines and records may show it: any password redacted."""
        return redact_uri(self.url)

    @property
    def path(self) -> Path | None:
        """The file the store keeps everything in; None for a server (or an in-memory database)."""
        return None


class StudyStore(Store):
    """Where a sweep's Optuna study lives: opened bounded, checked before anything is created, and every failure one
    line (orchestrator.errors.StorageError, StorageFull for a full disk)."""

    @abstractmethod
    def check(self, resume: bool) -> None:
        """Before a sweep creates anything: the store can be reached within the bounds and takes writes; with
        `resume`, it already holds a study. One StorageError or SpecError line otherwise."""

    @abstractmethod
    def require_existing(self, hint: str) -> None:
        """A read-only command's store must already be one (opening it would create it): a SpecError line naming
        what is missing, with `hint` (what to do)."""

    @abstractmethod
    def open(self, create: bool = True, attempts: int = 10) -> Any:
        """The Optuna storage (optuna.storages.BaseStorage), every connection bounded. `create`: a sweep will
        write (a missing file is made whole first); a reader never creates anything."""

    def may_be_held(self) -> bool:
        """Can a process hold this store open now, so that a check would wait on it? (Reading it to find out who
        holds it creates nothing: a journal, a database server.)"""
        return True

    def failure(self, exc: BaseException, doing: str = "") -> StorageError:
        """One line for a failed storage write: a full disk names its device (Optuna's own message, "exceeding
        max length", would mislead), a store that refuses writes or is locked says so, anything else its first
        line. `doing`: what failed ("cannot create": nothing was stored)."""
        if disk_full(exc, self.path):
            kept = ("nothing was stored; free space and rerun" if doing else
                    "what was measured is kept (in the storage, or in the result spool); free space and rerun with "
                    "--resume")
            return StorageFull(f"the {OPTUNA}'s disk is full: {device(self.path, self.url)}; {kept}")
        line = root_line(exc)[:300]
        low = line.lower()
        if not doing and self._refused(exc, low):  # mid-sweep (the study exists): the environment's fault, exit 9
            return self._refused_mid_sweep(exc)
        if "readonly" in low or "read-only" in low or "permission denied" in low:
            return StorageError(f"the {OPTUNA} {self.shown} refuses writes: {line} (a read-only or immutable file "
                                "or folder: make it writable, or use another --storage)")
        if "locked" in low:
            return StorageError(f"the {OPTUNA} {self.shown} is locked by another process: {line} (waited "
                                f"{connections.SQLITE_BUSY_S:g} s; stop it or wait, then rerun)")
        if doing:
            return StorageError(f"{doing} the {OPTUNA} {self.shown}: {redact_uri(line)}")
        return StorageError(f"the {OPTUNA} {self.shown} failed: {redact_uri(line)}")


    def _refused(self, exc: BaseException, low: str) -> bool:
        """Was the write refused by the file system (a read-only or immutable file or folder), not failed?"""
        if any(word in low for word in ("readonly", "read-only", "permission denied", "not permitted")):
            return True
        seen: BaseException | None = exc
        while seen is not None:
            if isinstance(seen, OSError) and seen.errno in REFUSALS:
                return True
            seen = seen.__cause__ or seen.__context__
        return self.path is not None and "disk i/o error" in low and refusal(self.path) is not None

    def _refused_mid_sweep(self, exc: BaseException) -> StorageRefused:
        """One line for a store that stopped taking writes mid-sweep: which file and why (the file system asked
        now, else the refused write's own OSError), what became of the trial in flight, and what to do."""
        found = refusal(self.path) if self.path is not None else None
        seen: BaseException | None = exc
        while found is None and seen is not None:
            found = seen if isinstance(seen, OSError) and seen.errno in REFUSALS else None
            seen = seen.__cause__ or seen.__context__
        if found is not None:
            where = found.filename if found.filename else self.path
            why = f"{str(where)!r} is {REFUSALS.get(found.errno, found.strerror or 'not writable')}"
        else:
            why = redact_uri(root_line(exc))[:300]
        return StorageRefused(f"the {OPTUNA} {self.shown} stopped taking writes mid-sweep: {why}; the sweep stopped, "
                              "a trial in flight is not charged to its layout (--resume runs it again); what was "
                              "measured is kept: make it writable and rerun with --resume")


class TrackingStore(Store):
    """Where a sweep's MLflow records live: made ready (a SQLite file made whole and migrated), checked, and its
    client bounded (orchestrator/storage/connections.py)."""

    forkable: bool = True
    """Its client may be used again in a forked child (the sweep's write-behind writer): a SQL engine's pool may,
    an HTTP client's pooled sockets may not be shared."""
    serves_ui: bool = False
    """It is an MLflow server already: `moe-autotune ui` has nothing to start."""

    def check(self) -> None:
        """A store a sweep will write that cannot take writes (MLflow would retry for minutes): one TrackingError
        line, before the sweep creates anything. Only file stores have something to check here."""

    def require_existing(self) -> None:
        """A read-only command's store must already exist (MLflow creates what it opens): one SpecError line."""

    def ready(self, create: bool) -> None:
        """Make the store ready to open (a new SQLite file made whole when `create`). A server has nothing to do."""

    def exists(self) -> bool:
        """Is the store there already? (A server is taken to be: it answers for itself.)"""
        return True

    def identity(self) -> tuple[int, int] | None:
        """Which file (or folder) holds the store now, as (device, inode); None for a server, or none there."""
        path = self.path
        try:
            st = os.stat(path) if path is not None else None
        except OSError:
            return None
        return (st.st_dev, st.st_ino) if st is not None else None

    def vanished(self, identity: tuple[int, int] | None) -> str | None:
        """Why the store is no longer the one whose `identity` was taken (deleted, its folder gone, replaced by
        another file), or None: it is, or there is nothing to compare (a server; a file that cannot be asked)."""
        path = self.path
        if identity is None or path is None:
            return None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return f"{str(path)!r} was deleted" + ("" if path.parent.is_dir() else " (its folder is gone)")
        except OSError:
            return None  # cannot be asked (a permission): the writes say what is wrong
        return f"{str(path)!r} was replaced by another file" if (st.st_dev, st.st_ino) != identity else None

    def preload(self) -> None:
        """Load the libraries its client will need (a sweep does it while the space is explored)."""

    def open(self, create: bool = False) -> BoundedClient:
        """The store as a bounded client, made ready first (`ready`). A read-only command passes create=False and
        asks `require_existing` before. A store that cannot be made (a full disk, a refused write) is one line."""
        from orchestrator.storage.sqlite_tuning import install  # SQLAlchemy: only where a store is opened

        install()
        try:
            self.ready(create)
        except TrackingError:
            raise
        except Exception as exc:  # noqa: BLE001 -- the store could not be made: a full disk, a refused write
            if disk_full(exc):
                raise TrackingFull(f"the MLflow store's disk is full: {device(self.path, self.url)}; nothing was "
                                   "recorded; free space and rerun") from None
            raise unreachable(self.url, exc, MLFLOW, TrackingError) from None
        return mlflow_client(self.url, known=lambda exc: self._full() if disk_full(exc) else None)

    def _full(self) -> Exception:
        """A store whose device filled under a write, once made: one line naming the device and what to do."""
        return TrackingFull(f"the MLflow store's disk is full: {device(self.path, self.url)}; what it holds is "
                            "kept; free space and rerun (a sweep with --resume)")
