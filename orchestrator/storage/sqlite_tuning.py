"""SQLite without an fsync per commit: WAL journal, synchronous=NORMAL.

Optuna and MLflow commit many small transactions per trial; with the default (fsync on every commit) a
slow disk makes that ~25 ms each and dominates a sweep. WAL+NORMAL keeps every committed transaction
across a process crash or SIGKILL (only an OS crash / power loss can lose the last commits) and lets the
status command read while the sweep writes. Applied to every SQLite connection this process opens.

A process forked from one holding a pool's connections (the sweep's MLflow writer:
orchestrator/tracking/writer_process.py)
never uses them: SQLAlchemy's recipe for pools across os.fork, each connection marked with the process that opened
it, and one checked out in another process is dropped there (kept referenced, never closed: it is the parent's) and
replaced by a new one.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

import orchestrator.storage.connections as connections

_installed = False
_PARENTS: list[Any] = []  # connections a forked process found in its pools: the parent's, never closed here


def install() -> None:
    global _installed
    if _installed:
        return
    event.listen(Engine, "connect", _on_connect)
    event.listen(Pool, "connect", _mark_process)
    event.listen(Pool, "checkout", _refuse_inherited)
    _installed = True


def _mark_process(_dbapi_connection, record) -> None:
    record.info["pid"] = os.getpid()


def _refuse_inherited(dbapi_connection, record, proxy) -> None:
    """A connection another process opened (this one is its fork) is dropped, unclosed; the pool opens another."""
    if record.info.get("pid", os.getpid()) == os.getpid():
        return
    _PARENTS.append(dbapi_connection)
    record.dbapi_connection = proxy.dbapi_connection = None
    raise sa_exc.DisconnectionError("a connection of the parent process: this process opens its own")


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
