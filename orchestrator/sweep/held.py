"""A `--resume` (or `confirm`) of a study another driver holds is refused naming that driver, in the lease's own words
(orchestrator/sweep/lease.py), also when the storage is what stops it first.

The storage is checked before the lease is read: a SQLite file another process holds locked is waited for
(SQLITE_BUSY_S), then refused as locked. When that process is the study's own driver (paused mid-write, or holding
a long write), the line would blame the file and not name who holds the study. So a resume first reads the lease,
without writing: a holder alive on this host is refused at once, without the wait; and a storage found locked names
the lease's holder, wherever it runs, when a driver holds the study.
"""

from __future__ import annotations

import logging

import optuna

from search_spaces.errors import SpecError

from orchestrator.errors import StorageError
from orchestrator.storage import studies
from orchestrator.sweep.lease import Holder, Lease

log = logging.getLogger(__name__)


def refuse_held(url: str, name: str) -> None:
    """Before a resume's storage checks: refuse (StorageError, the lease's line) a study whose lease a live driver of
    this host holds. A storage that cannot be read yet says nothing here: its own checks follow. Only a store kept in
    a file is read here (a locked file is what a resume would wait on; a database server is probed by its checks)."""
    if studies.store_path(url) is None or not studies.may_be_held(url):
        return
    found = _holder(url, name)
    if found is None:
        return
    holder, refusal = found
    if holder.here and holder.process_alive:
        raise refusal


def name_holder(exc: StorageError, url: str, name: str) -> StorageError:
    """A resume's storage refused as locked: the lease's line when a driver holds the study (alive on this host, or
    on another host, where only its heartbeat could tell), else the storage's own line."""
    if "locked" not in str(exc):
        return exc
    found = _holder(url, name)
    if found is None:
        return exc
    holder, refusal = found
    if holder.here and not holder.process_alive:  # its driver is gone: the lock is another process's
        return exc
    return refusal


def _holder(url: str, name: str) -> tuple[Holder, StorageError] | None:
    """The study's lease holder and the lease's refusal naming it, read without writing; None when the study is
    released, not there, or cannot be read now."""
    try:
        storage = studies.open_existing_storage(url)
    except (SpecError, StorageError, *studies.STORAGE_ERRORS) as exc:
        log.debug("the lease of %s could not be read before its storage checks: %s", name, type(exc).__name__)
        return None
    try:
        study = optuna.load_study(study_name=name, storage=storage)
        holder = Holder.of(study)
        return (holder, Lease(study, storage).refusal(holder)) if holder is not None else None
    except (KeyError, *studies.STORAGE_ERRORS) as exc:  # no such study (the checks say so), or unreadable now
        log.debug("the lease of %s could not be read before its storage checks: %s", name, type(exc).__name__)
        return None
    finally:
        studies.let_go(storage)
