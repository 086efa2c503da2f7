"""Optuna's RDBStorage under the bounds: what the SQLite and the database-server study stores share."""

from __future__ import annotations

import time

import optuna
import sqlalchemy.exc

from orchestrator.errors import StorageError, StorageFull
from orchestrator.storage.base import OPTUNA, StudyStore
from orchestrator.storage.connections import engine_kwargs, unreachable
from orchestrator.storage.sqlite_tuning import install


def open_rdb(store: StudyStore, attempts: int, schema_races: bool) -> optuna.storages.BaseStorage:
    """Optuna's RDBStorage of `store.url`, every connection bounded (orchestrator/storage/connections.py).
    `schema_races`: two sweeps creating one new database server's schema at once race, and the loser retries (a
    SQLite file is created whole before this, and "locked" was already waited for, SQLITE_BUSY_S)."""
    install()
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(store.url, engine_kwargs=engine_kwargs(store.url))
        except Exception as exc:  # noqa: BLE001 -- read below: a schema race is retried, the rest re-raised
            racing = schema_races and (isinstance(exc, sqlalchemy.exc.IntegrityError) or (
                isinstance(exc, sqlalchemy.exc.OperationalError) and "already exists" in str(exc)))
            if racing and attempt + 1 < attempts:
                time.sleep(0.2 + 0.1 * attempt)
                continue
            failure = store.failure(exc)
            if isinstance(failure, StorageFull):
                raise failure from None
            raise unreachable(store.url, exc, OPTUNA, StorageError) from None
    raise AssertionError("unreachable")


def optuna_schema(url: str) -> None:
    """Optuna's tables in a new SQLite file (sqlite_files.create_sqlite links it into place)."""
    from sqlalchemy.pool import NullPool

    # no pool: a connection is closed as soon as it is let go, also when the creation fails half way
    storage = optuna.storages.RDBStorage(url, engine_kwargs={**engine_kwargs(url), "poolclass": NullPool})
    storage.scoped_session.remove()
    storage.engine.dispose()
