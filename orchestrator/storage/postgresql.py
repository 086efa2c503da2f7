"""`postgresql://...` (and any other database server SQLAlchemy speaks): the study on a database server, every
connection and statement bounded (orchestrator/storage/connections.py)."""

from __future__ import annotations

import optuna

from search_spaces.errors import SpecError

from orchestrator.errors import StorageError
from orchestrator.storage.base import OPTUNA, StudyStore
from orchestrator.storage.connections import is_sql, probe_sql, sql_engine, unreachable
from orchestrator.storage.rdb import open_rdb
from orchestrator.storage.sqlite import OPTUNA_TABLE


class DatabaseStudyStore(StudyStore):
    kind = "database server"

    def check(self, resume: bool) -> None:
        probe_sql(self.url, OPTUNA, StorageError)  # an unreachable or silent server: one line within the bounds
        if resume:
            self.require_existing("nothing to resume")

    def require_existing(self, hint: str) -> None:
        if is_sql(self.url) and not server_has_table(self.url, OPTUNA_TABLE, OPTUNA):
            raise SpecError(f"no {OPTUNA} in {self.shown}: the database has no {OPTUNA_TABLE!r} table ({hint})")

    def open(self, create: bool = True, attempts: int = 10) -> optuna.storages.BaseStorage:
        return open_rdb(self, attempts, schema_races=True)


def server_has_table(url: str, table: str, what: str) -> bool:
    """Does the database at `url` have `table`? A server that cannot be read is one SpecError line (bounded)."""
    import sqlalchemy

    try:
        engine = sql_engine(url)  # bounded: a silent server is one line, not a hang
        try:
            return sqlalchemy.inspect(engine).has_table(table)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 -- a missing driver, server or database: it cannot be read
        raise unreachable(url, exc, what, SpecError) from None
