"""The MLflow store a sweep writes and the tracker's client of it: each write behind the sweep's fence.

The store is checked, preloaded or required before anything is opened (TrackingStore in orchestrator/storage); a
store that cannot be used is one line naming it (`unusable`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from mlflow import MlflowClient

from orchestrator.errors import TrackingError
from orchestrator.redact import redact_uri
from orchestrator.storage import connections, tracking_store

for _name in ("mlflow", "alembic"):  # table-creation chatter would break the live view
    logging.getLogger(_name).setLevel(logging.WARNING)

# MlflowClient methods that only read: every other call is a write and passes the tracker's fence first
CLIENT_READS = frozenset({"search_experiments", "get_experiment", "get_experiment_by_name", "search_runs",
                          "get_run", "get_metric_history", "list_artifacts", "download_artifacts"})


def check_store(tracking_uri: str) -> None:
    """A store a sweep will write that cannot take writes (MLflow would retry an unusable SQLite file for
    minutes): one TrackingError line (TrackingStore.check)."""
    tracking_store(tracking_uri).check()


def preload_store(tracking_uri: str) -> None:
    """Load MLflow's store libraries now (about a second): a sweep does it while its child explores the space,
    instead of when it opens the store. Nothing is opened or created."""
    tracking_store(tracking_uri).preload()


def require_existing_store(tracking_uri: str) -> None:
    """A read-only command's MLflow store must exist (opening it would create it): one SpecError line."""
    tracking_store(tracking_uri).require_existing()


def unusable(tracking_uri: str, exc: Exception) -> TrackingError:
    """One line naming the store and why it cannot be used."""
    # redact before cutting: a cut could split a password from its '@'
    text = str(exc).strip().splitlines()
    why = redact_uri(text[0])[:300] if text else type(exc).__name__
    return TrackingError(f"cannot use the MLflow tracking URI {redact_uri(tracking_uri)!r}: {why}")


class FencedClient:
    """The tracker's MlflowClient, each write behind the fence: a driver whose study was taken over while it
    was paused stops at its next MLflow call, not after finishing the record it was in the middle of."""

    def __init__(self, client: MlflowClient | connections.BoundedClient, fence: Callable[[], None]):
        self._client, self._fence = client, fence

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in CLIENT_READS or not callable(attr):
            return attr

        def fenced(*args: Any, **kwargs: Any) -> Any:
            self._fence()
            return attr(*args, **kwargs)
        return fenced
