"""Errors of the orchestrator's stores: the Optuna storage and the MLflow tracking store.

Both are `MoeAutotuneError`s (one line on the command line). A store that cannot be used at the start
is bad input (exit 2, nothing created); a store that fails in the middle of a sweep (a full disk) exits
with 4 once what was measured is safe (see the README's failure table).
"""

from __future__ import annotations

from search_spaces.errors import MoeAutotuneError


class StorageError(MoeAutotuneError):
    """The Optuna storage cannot be opened, is taken by another running sweep, or refused a write."""


class StorageFull(StorageError):
    """The device under the Optuna storage is full; results so far are kept (storage or spool)."""
    exit_code = 4


class LeaseLost(StorageError):
    """Another driver took this study over (this one was presumed dead); this one writes nothing more
    (orchestrator/sweep/lease.py fences every write with it)."""
    exit_code = 5


class TrackingError(MoeAutotuneError):
    """The MLflow tracking store cannot be used."""
