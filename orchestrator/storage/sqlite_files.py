"""The SQLite file rules shared by Optuna's and MLflow's SQLite stores: a store is made whole (built beside its name,
then linked into place complete), probed with the standard library without writing (every SQLAlchemy connection of
this process switches a file to WAL: orchestrator/storage/sqlite_tuning.py), and a file another process holds
locked is waited for SQLITE_BUSY_S, then one line."""

from __future__ import annotations

import errno
import os
import secrets
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Callable

from search_spaces.errors import SpecError

import orchestrator.storage.connections as connections
from orchestrator.errors import StorageError, StorageFull
from orchestrator.storage.files import device, disk_full, fsync_dir, read_head, usable_path

PREFIX = "sqlite:///"


SQLITE_HEADER = b"SQLite format 3\x00"


def require_table(url: str, table: str, what: str, shown: str, hint: str) -> None:
    raw = url[len(PREFIX):] if url.startswith(PREFIX) else ""
    if not raw or raw.startswith(":memory:") or raw.startswith("file:"):
        return  # an in-memory database is the caller's own: nothing on disk can appear
    path = Path(raw.split("?", 1)[0])
    head = read_head(path, len(SQLITE_HEADER), what, shown, hint)
    if head != SQLITE_HEADER:
        kind = "an empty file" if not head else "not an SQLite database"
        raise SpecError(f"no {what} at {shown}: {str(path)!r} is {kind}{hint}")
    if not has_table(path, table):
        raise SpecError(f"no {what} at {shown}: {str(path)!r} has no {table!r} table{hint}")


def has_table(path: Path, table: str) -> bool:
    """Does the SQLite file have `table`? Read without writing anything (read_only_uri)."""
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True, timeout=connections.SQLITE_BUSY_S)
        try:
            return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (table,)).fetchone() is not None
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise SpecError(f"cannot read {str(path)!r}: {exc}") from None


def sqlite_file(url: str) -> Path | None:
    """The file of a `sqlite:///path` URL (None for other URLs and in-memory databases)."""
    raw = url[len(PREFIX):] if url.startswith(PREFIX) else ""
    if not raw or raw.startswith(":memory:") or raw.startswith("file:"):
        return None
    return usable_path(raw.split("?", 1)[0], url)


def require_unlocked(path: Path, what: str, shown: str) -> None:
    """Take SQLite's write lock once (waiting SQLITE_BUSY_S for another writer), then let it go."""
    try:
        with closing(sqlite3.connect(path, timeout=connections.SQLITE_BUSY_S, isolation_level=None)) as conn:
            # a damaged file is refused here: the stores' own engines retry it for minutes
            damage = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
            if damage != ["ok"]:
                raise StorageError(f"the {what} {shown} is damaged ({'; '.join(map(str, damage))[:200]}); "
                                   "restore it from a copy or point elsewhere")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        text = str(exc)
        if disk_full(exc, path):
            raise StorageFull(f"the {what}'s disk is full: {device(path, shown)}; nothing was stored; free space "
                              "and rerun") from None
        if "locked" in text or "busy" in text:
            raise StorageError(f"the {what} {shown} is locked by another process (waited "
                               f"{connections.SQLITE_BUSY_S:g} s); stop it or wait, then rerun") from None
        raise StorageError(f"the {what} {shown} refuses writes: {text}") from None
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"cannot use the {what} {shown}: {exc}") from None


def create_sqlite(path: Path, build: Callable[[str], None]) -> bool:
    """Create the SQLite store `path` all at once: `build(url)` makes it in a hidden file beside `path`, which is
    then linked into place complete (never over a store another process made meanwhile: that one is used). A
    failure (a full disk, a refused write) leaves nothing behind. True when this call made the store."""
    if path.exists():
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.creating")
    try:
        build(f"sqlite:///{tmp}")
        _settle(tmp)
        _clear_orphans(path)
        try:
            os.link(tmp, path)  # fails when the name exists: a store is never replaced
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if path.exists():  # a file system without hard links: rename, after a last look
                return False
            os.replace(tmp, path)
        fsync_dir(path.parent)
        return True
    finally:
        for leftover in sqlite_family(tmp):
            leftover.unlink(missing_ok=True)


def _clear_orphans(path: Path) -> None:
    """The -wal, -shm and -journal files of a store deleted from under them (mid-sweep: the process that held it
    left them): SQLite would replay the old WAL into the new store made under the same name."""
    for side in sqlite_family(path)[1:]:
        if path.exists():  # made meanwhile by another process: its files are its own
            return
        side.unlink(missing_ok=True)


def _settle(path: Path) -> None:
    """Everything in the main file (no -wal beside it), on disk: what is linked into place is the whole store."""
    with closing(sqlite3.connect(path, timeout=connections.SQLITE_BUSY_S, isolation_level=None)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sqlite_family(path: Path) -> list[Path]:
    return [path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]


def remake(path: Path, build: Callable[[str], None]) -> None:
    """Replace a store that holds nothing with a complete one, made beside it first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.remade")
    try:
        create_sqlite(tmp, build)
        for side in sqlite_family(path)[1:]:
            side.unlink(missing_ok=True)  # the old store's journal must not be replayed into the new one
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def read_only_uri(path: Path) -> str:
    """How to open `path` without writing anything: with no -wal file beside it the main file is the whole database
    (immutable: no lock, no -wal or -shm created); a -wal file means a writer is (or was) there: read through it."""
    wal = path.with_name(path.name + "-wal").exists()
    return path.resolve().as_uri() + ("?mode=ro" if wal else "?immutable=1")
