"""SQLite without an fsync per commit: WAL journal, synchronous=NORMAL.

Optuna and MLflow commit many small transactions per trial; with the default (fsync on every commit) a
slow disk makes that ~25 ms each and dominates a sweep. WAL+NORMAL keeps every committed transaction
across a process crash or SIGKILL (only an OS crash / power loss can lose the last commits) and lets the
status command read while the sweep writes. Applied to every SQLite connection this process opens.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import event
from sqlalchemy.engine import Engine

from orchestrator import connections

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    event.listen(Engine, "connect", _on_connect)
    _installed = True


def _on_connect(dbapi_connection, _record) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        # a file another process holds locked: waited for as long as every other SQLite opening waits
        cursor.execute(f"PRAGMA busy_timeout={int(connections.SQLITE_BUSY_S * 1000)}")
    finally:
        cursor.close()
