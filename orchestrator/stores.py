"""A store a read-only command names must already exist: opening it never creates it.

Optuna's RDBStorage and MLflow's SQL store create what they open: a missing `sqlite:///x.db` becomes a new file
with empty tables, an empty database gets their schema, a missing file store gets `mlruns/0`. `status`, `check`,
`export`, `report`, `ui`, `calibrate` and `promote --rollback` only read, so each asks `require_existing` first:
a store that is not there (or is not that kind of store) is one SpecError line, exit 2, and nothing appears.

SQLite files are probed with the standard library, not SQLAlchemy: every SQLAlchemy connection of this process
switches the file to WAL (orchestrator/sqlite_tuning.py), which writes to it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import urlsplit

from search_spaces.errors import SpecError

from orchestrator.redact import redact_uri

SQLITE_HEADER = b"SQLite format 3\x00"
# the table that every store of each kind has from its first opening
OPTUNA_TABLE = "studies"
MLFLOW_TABLE = "experiments"
_SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "oracle")


def require_existing(url: str, table: str, what: str, hint: str = "") -> None:
    """Refuse (SpecError) a database URL whose database does not exist or lacks `table` (it was never a store
    of this kind); `what` names the store in the line, `hint` says what to do. Non-SQL URLs are left alone."""
    scheme = urlsplit(url).scheme.split("+")[0].lower()
    shown = redact_uri(url)
    hint = f" ({hint})" if hint else ""
    if scheme == "sqlite":
        _require_sqlite(url, table, what, shown, hint)
    elif scheme in _SQL_SCHEMES:
        if not _server_has_table(url, table, what, shown):
            raise SpecError(f"no {what} in {shown}: the database has no {table!r} table{hint}")


def require_file_store(uri: str, what: str, hint: str = "") -> None:
    """An MLflow file store (`file:///path` or a plain path): its folder, with the `.trash` every opened store
    has, must exist (MLflow would create both)."""
    path = Path(urlsplit(uri).path if uri.startswith("file:") else uri)
    if not (path / ".trash").is_dir():
        raise SpecError(f"no {what} at {uri!r}: {str(path)!r} is not an MLflow file store"
                        + (f" ({hint})" if hint else ""))


def _require_sqlite(url: str, table: str, what: str, shown: str, hint: str) -> None:
    raw = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not raw or raw.startswith(":memory:") or raw.startswith("file:"):
        return  # an in-memory database is the caller's own: nothing on disk can appear
    path = Path(raw.split("?", 1)[0])
    if not path.exists():
        raise SpecError(f"no {what} at {shown}: {str(path)!r} does not exist{hint}")
    if not path.is_file():
        raise SpecError(f"no {what} at {shown}: {str(path)!r} is not a file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise SpecError(f"cannot read the {what} {shown}: {exc.strerror or exc}") from None
    if head != SQLITE_HEADER:
        kind = "an empty file" if not head else "not an SQLite database"
        raise SpecError(f"no {what} at {shown}: {str(path)!r} is {kind}{hint}")
    if not _sqlite_has_table(path, table):
        raise SpecError(f"no {what} at {shown}: {str(path)!r} has no {table!r} table{hint}")


def _sqlite_has_table(path: Path, table: str) -> bool:
    # With no -wal file beside it the main file is the whole database: read it as immutable (no lock, no -wal or
    # -shm created). A -wal file means a writer is (or was) there: read through it, as it already exists.
    wal = path.with_name(path.name + "-wal").exists()
    uri = path.resolve().as_uri() + ("?mode=ro" if wal else "?immutable=1")
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=60)
        try:
            return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (table,)).fetchone() is not None
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise SpecError(f"cannot read {str(path)!r}: {exc}") from None


def _server_has_table(url: str, table: str, what: str, shown: str) -> bool:
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url)
        try:
            return sqlalchemy.inspect(engine).has_table(table)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 -- a missing driver, server or database: it cannot be read
        text = str(exc).strip().splitlines()
        why = redact_uri(text[0])[:300] if text else type(exc).__name__
        raise SpecError(f"cannot open the {what} {shown}: {why}") from None
