"""A store a read-only command names must already exist: opening it never creates it.

Optuna's RDBStorage and MLflow's SQL store create what they open: a missing `sqlite:///x.db` becomes a new file
with empty tables, an empty database gets their schema, a missing file store gets `mlruns/0`. `status`, `check`,
`export`, `report`, `ui`, `calibrate` and `promote --rollback` only read, so each asks `require_existing` first:
a store that is not there (or is not that kind of store) is one SpecError line, exit 2, and nothing appears.

SQLite files are probed with the standard library, not SQLAlchemy: every SQLAlchemy connection of this process
switches the file to WAL (orchestrator/sqlite_tuning.py), which writes to it.

A sweep creates its SQLite stores all at once (`create_sqlite`): the schema is made in a hidden file beside the
store and linked into place complete, so a full disk or a refused write during creation leaves nothing, and a
store is never half made. An MLflow store half made by an older version (a disk that filled during MLflow's
migration: `table ... already exists` on every later opening) that holds nothing is made again (`ready_mlflow`).
"""

from __future__ import annotations

import errno
import os
import secrets
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from search_spaces.errors import SpecError

from orchestrator import connections
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
        if not _server_has_table(url, table, what):
            raise SpecError(f"no {what} in {shown}: the database has no {table!r} table{hint}")


def require_file_store(uri: str, what: str, hint: str = "") -> None:
    """An MLflow file store (`file:///path` or a plain path): its folder, with the `.trash` every opened store
    has, must exist (MLflow would create both)."""
    path = Path(urlsplit(uri).path if uri.startswith("file:") else uri)
    if not (path / ".trash").is_dir():
        raise SpecError(f"no {what} at {uri!r}: {str(path)!r} is not an MLflow file store"
                        + (f" ({hint})" if hint else ""))


def require_mlflow_store(tracking_uri: str) -> None:
    """The MLflow store a read-only command reads (check, ui, export, calibrate, report, promote --rollback) must
    already exist: MLflow would create a missing SQLite file, the schema of an empty database, or a file store's
    folder just by opening it. One SpecError line instead; a server is left to answer (within the bounds)."""
    scheme = urlsplit(tracking_uri).scheme.lower()
    hint = "run a sweep with tracking first, or pass --tracking-uri"
    if scheme in ("", "file") or (len(scheme) == 1 and tracking_uri[1:3] in (":\\", ":/")):  # a path
        require_file_store(tracking_uri, "MLflow store", hint)
    else:
        require_existing(tracking_uri, MLFLOW_TABLE, "MLflow store", hint)


def _require_sqlite(url: str, table: str, what: str, shown: str, hint: str) -> None:
    raw = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not raw or raw.startswith(":memory:") or raw.startswith("file:"):
        return  # an in-memory database is the caller's own: nothing on disk can appear
    path = Path(raw.split("?", 1)[0])
    head = read_head(path, len(SQLITE_HEADER), what, shown, hint)
    if head != SQLITE_HEADER:
        kind = "an empty file" if not head else "not an SQLite database"
        raise SpecError(f"no {what} at {shown}: {str(path)!r} is {kind}{hint}")
    if not _sqlite_has_table(path, table):
        raise SpecError(f"no {what} at {shown}: {str(path)!r} has no {table!r} table{hint}")


def read_head(path: Path, size: int, what: str, shown: str, hint: str) -> bytes:
    """The first `size` bytes of a store file a read-only command names; a SpecError line when it is missing, not a
    file, or unreadable."""
    if not path.exists():
        raise SpecError(f"no {what} at {shown}: {str(path)!r} does not exist{hint}")
    if not path.is_file():
        raise SpecError(f"no {what} at {shown}: {str(path)!r} is not a file")
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError as exc:
        raise SpecError(f"cannot read the {what} {shown}: {exc.strerror or exc}") from None


def _sqlite_has_table(path: Path, table: str) -> bool:
    # With no -wal file beside it the main file is the whole database: read it as immutable (no lock, no -wal or
    # -shm created). A -wal file means a writer is (or was) there: read through it, as it already exists.
    wal = path.with_name(path.name + "-wal").exists()
    uri = path.resolve().as_uri() + ("?mode=ro" if wal else "?immutable=1")
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=connections.SQLITE_BUSY_S)
        try:
            return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                (table,)).fetchone() is not None
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise SpecError(f"cannot read {str(path)!r}: {exc}") from None


def _server_has_table(url: str, table: str, what: str) -> bool:
    import sqlalchemy

    try:
        engine = connections.sql_engine(url)  # bounded: a silent server is one line, not a hang
        try:
            return sqlalchemy.inspect(engine).has_table(table)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 -- a missing driver, server or database: it cannot be read
        raise connections.unreachable(url, exc, what, SpecError) from None


# ---- a store a sweep writes ------------------------------------------------------------------------------
def sqlite_file(url: str) -> Path | None:
    """The file of a `sqlite:///path` URL (None for other URLs and in-memory databases)."""
    raw = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not raw or raw.startswith(":memory:") or raw.startswith("file:"):
        return None
    return usable_path(raw.split("?", 1)[0], url)


NAME_MAX, PATH_MAX = 255, 4096  # bytes, as Linux file systems allow


def usable_path(raw: str, url: str) -> Path:
    """The file a store URL names (SQLite's, a journal's); a SpecError line for a path no file can have: a folder's
    name, a NUL byte, a name longer than a file system allows (os.stat would raise, not answer)."""
    path = Path(raw)
    why = None
    if "\x00" in raw:
        why = "it holds a NUL byte"
    elif path.name in ("", ".", ".."):
        why = "it names a folder, not a file"
    elif len(os.fsencode(raw)) >= PATH_MAX or any(len(os.fsencode(part)) > NAME_MAX for part in path.parts):
        why = f"a name in it is longer than a file system allows ({NAME_MAX} bytes a name, {PATH_MAX} in all)"
    if why:
        raise SpecError(f"the store {redact_uri(url)[:200]} names no usable file: {why}")
    return path


def require_writable(url: str, what: str, path: Path | None = None) -> None:
    """A SQLite store a sweep will write, or the store file `path` of another URL (a journal: orchestrator/journal.py):
    its folder (for a new file, SQLite's -wal/-shm files, the journal's lock file) and the file itself must take
    writes, and a SQLite file must not be held locked past SQLITE_BUSY_S; one StorageError line naming which, before
    anything is written. Other URLs are left to their server."""
    from orchestrator.errors import StorageError

    path = path or sqlite_file(url)
    if path is None:
        return
    shown = redact_uri(url)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise StorageError(f"cannot use the {what} {shown}: folder {str(folder)!r} does not exist")
    for target in ((path, folder) if path.exists() else (folder,)):
        # os.access passes root on an immutable folder: a probe file tells (SQLite needs its -wal/-journal there)
        why = _why_not_writable(target) if not os.access(target, os.W_OK) else _refuses_a_file(folder, target)
        if why:
            raise StorageError(f"the {what} {shown} refuses writes: {why}")
    if path.exists() and sqlite_file(url) is not None:
        _require_unlocked(path, what, shown)


def _refuses_a_file(folder: Path, target: Path) -> str | None:
    """Why a new file cannot be made in `folder` (only asked for the folder itself), or None."""
    if target != folder:
        return None
    probe = folder / f".moe-autotune-probe-{secrets.token_hex(4)}"
    try:
        probe.touch()
        probe.unlink()
    except OSError:
        return _why_not_writable(folder)
    return None


def _why_not_writable(target: Path) -> str:
    """Why os.access said no: a read-only file system, an immutable file (chattr +i) or permissions."""
    try:
        if target.is_dir():
            fd = os.open(target, os.O_RDONLY)
            os.close(fd)
            probe = target / f".moe-autotune-probe-{secrets.token_hex(4)}"
            probe.touch()
            probe.unlink()
        else:
            os.close(os.open(target, os.O_RDWR))
    except OSError as exc:
        hints: dict[int | None, str] = {errno.EROFS: "on a read-only file system",
                                        errno.EPERM: "immutable (chattr +i) or not permitted",
                                        errno.EACCES: "permission denied"}
        hint = hints.get(exc.errno, exc.strerror or str(exc))
        return f"{str(target)!r} is {hint}" if exc.errno in (errno.EROFS, errno.EPERM) else f"{str(target)!r}: {hint}"
    return f"{str(target)!r} is not writable"


def _require_unlocked(path: Path, what: str, shown: str) -> None:
    """Take SQLite's write lock once (waiting SQLITE_BUSY_S for another writer), then let it go."""
    from orchestrator.errors import StorageError

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
            from orchestrator.errors import StorageFull

            raise StorageFull(f"the {what}'s disk is full: {device(path, shown)}; nothing was stored; free space "
                              "and rerun") from None
        if "locked" in text or "busy" in text:
            raise StorageError(f"the {what} {shown} is locked by another process (waited "
                               f"{connections.SQLITE_BUSY_S} s); stop it or wait, then rerun") from None
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
        _fsync_dir(path.parent)
        return True
    finally:
        for leftover in _sqlite_family(tmp):
            leftover.unlink(missing_ok=True)


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


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder: the link is made all the same
    finally:
        os.close(fd)


def _sqlite_family(path: Path) -> list[Path]:
    return [path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]


# ---- the MLflow store ------------------------------------------------------------------------------------
def ready_mlflow(uri: str, create: bool) -> None:
    """Make a SQLite MLflow store ready to open: a missing one is created all at once (`create`), one half made
    earlier that holds nothing is made again (`create`) or refused (a read-only command changes nothing)."""
    from orchestrator.errors import TrackingError

    path = sqlite_file(uri)
    if path is None:
        return
    if path.exists():
        _require_undamaged(path, uri)
        _require_openable(path, uri)
    if path.exists() and _half_made_mlflow(path):
        if not create:
            raise TrackingError(f"the MLflow store {redact_uri(uri)} was never finished (its creation stopped "
                                "half way, e.g. on a full disk) and holds nothing; a sweep makes it again")
        _remake(path, _mlflow_schema)
    elif not path.exists() and create:
        create_sqlite(path, _mlflow_schema)


def _mlflow_schema(url: str) -> None:
    """MLflow's own store creation (its migrations, then its Default experiment), as MlflowClient would do it; the
    migrated schema copied from a template when one is at hand (orchestrator/mlflow_template.py)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

    from orchestrator import mlflow_template

    path = sqlite_file(url)
    if path is not None:
        mlflow_template.fill(path, create_sqlite)  # migrated once per MLflow version; else MLflow migrates below
    # a failure here (a disk that fills as MLflow makes the Default experiment) is one line from open_mlflow (MLflow's
    # own log of it is muted by connections.bound_mlflow)
    connections.bound_mlflow()
    try:
        _get_sqlalchemy_store(url, None)
    finally:  # MLflow keeps one engine per URL: its pool would hold the file (made or failed) open
        engine = SqlAlchemyStore._engine_map.pop(url, None)
        if engine is not None:
            engine.dispose()


def _require_undamaged(path: Path, uri: str) -> None:
    """A store whose file is not a database, or is cut or corrupted, is one line here, read without writing:
    MLflow's engine would retry it for about 100 s of warnings first."""
    from orchestrator.errors import TrackingError

    wal = path.with_name(path.name + "-wal").exists()
    try:
        with closing(sqlite3.connect(path.resolve().as_uri() + ("?mode=ro" if wal else "?immutable=1"), uri=True,
                                     timeout=connections.SQLITE_BUSY_S)) as conn:
            damage = [str(row[0]) for row in conn.execute("PRAGMA quick_check(3)")]
    except sqlite3.OperationalError:
        return  # locked or unreadable now: the store's own open says so
    except sqlite3.DatabaseError as exc:
        damage = [str(exc)]
    if damage != ["ok"]:
        raise TrackingError(f"the MLflow store {redact_uri(uri)} is damaged ({'; '.join(damage)[:200]}); restore "
                            "it from a copy or point --tracking-uri elsewhere")


def _require_openable(path: Path, uri: str) -> None:
    """A store SQLite cannot open as the stores' engines do (a WAL file in a folder that refuses the -wal and -shm
    files beside it: immutable, read-only) is one line here; MLflow's engine would retry it for about 100 s."""
    from orchestrator.errors import TrackingError

    try:  # no busy wait: a lock answers at once, and the store's own open does the waiting (SQLITE_BUSY_S)
        with closing(sqlite3.connect(path, timeout=0)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        if "unable to open" not in str(exc):
            return  # locked, busy: the store's own open waits for it and says so
        raise TrackingError(f"cannot open the MLflow store {redact_uri(uri)}: {_why_not_writable(path.parent)}, and "
                            "SQLite needs to make its -wal and -shm files there; make the folder writable or copy "
                            "the store elsewhere") from None


def _half_made_mlflow(path: Path) -> bool:
    """A store MLflow began and never finished (no Default experiment yet: it is made after the migrations) and
    that holds nothing of anyone's (no run, experiment or registered model)."""
    wal = path.with_name(path.name + "-wal").exists()  # as _sqlite_has_table: read without writing anything
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + ("?mode=ro" if wal else "?immutable=1"), uri=True,
                               timeout=connections.SQLITE_BUSY_S)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                return False  # an empty file: not MLflow's half, SQLAlchemy makes it a store
            if "experiments" in tables and conn.execute("SELECT 1 FROM experiments LIMIT 1").fetchone():
                return False
            return not any(conn.execute(f'SELECT 1 FROM "{t}" LIMIT 1').fetchone()
                           for t in ("runs", "registered_models", "logged_models", "trace_info") if t in tables)
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return False  # not a database: whoever opens it says so


def _remake(path: Path, build: Callable[[str], None]) -> None:
    """Replace a store that holds nothing with a complete one, made beside it first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.remade")
    try:
        create_sqlite(tmp, build)
        for side in _sqlite_family(path)[1:]:
            side.unlink(missing_ok=True)  # the old store's journal must not be replayed into the new one
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def open_mlflow(uri: str, create: bool = False) -> "connections.BoundedClient":
    """The MLflow store at `uri` as a bounded client (orchestrator/connections.py); a SQLite file made ready
    first (`ready_mlflow`). A read-only command passes create=False and asks `require_existing` before."""
    from orchestrator.errors import TrackingError, TrackingFull

    try:
        ready_mlflow(uri, create)
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 -- the store could not be made: a full disk, a refused write
        if disk_full(exc):
            raise TrackingFull(f"the MLflow store's disk is full: {device(sqlite_file(uri), uri)}; nothing was "
                               "recorded; free space and rerun") from None
        raise connections.unreachable(uri, exc, connections.MLFLOW, TrackingError) from None
    return connections.mlflow_client(uri, known=lambda exc: _mlflow_full(uri) if disk_full(exc) else None)


def _mlflow_full(uri: str) -> Exception:
    """A store whose device filled under a write, once made: one line naming the device and what to do (exit 4)."""
    from orchestrator.errors import TrackingFull

    return TrackingFull(f"the MLflow store's disk is full: {device(sqlite_file(uri), uri)}; what it holds is kept; "
                        "free space and rerun (a sweep with --resume)")


# ---- a full disk -----------------------------------------------------------------------------------------
def disk_full(exc: BaseException, path: Path | None = None) -> bool:
    """Did a write fail because the device is full (SQLite's "database or disk is full", ENOSPC)? SQLite says
    "disk I/O error" when not even its shared-memory file fits: with `path`, that and a device with under
    LOW_SPACE bytes free count too."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen).lower()
        if getattr(seen, "errno", None) == errno.ENOSPC or "disk is full" in text or "no space left" in text:
            return True
        if path is not None and "disk i/o error" in text and _free_bytes(path) < LOW_SPACE:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


LOW_SPACE = 1 << 20


def _free_bytes(path: Path) -> int:
    import shutil

    try:
        return shutil.disk_usage(path.parent if str(path.parent) else ".").free
    except OSError:
        return LOW_SPACE


def device(path: Path | None, url: str) -> str:
    """The device a store's file lives on, and its free space: what a "disk is full" line names."""
    import shutil

    import psutil

    if path is None:
        return f"the database server of {redact_uri(url)}"
    where = Path(os.path.realpath(path.parent if path.parent.exists() else "."))
    mounts = [p for p in psutil.disk_partitions(all=True) if str(where).startswith(p.mountpoint)]
    mount = max(mounts, key=lambda p: len(p.mountpoint)) if mounts else None
    free = shutil.disk_usage(where).free / 2 ** 20
    name = f"{mount.device} mounted at {mount.mountpoint}" if mount else str(where)
    return f"{name} ({free:.1f} MiB free) holding {path}"
