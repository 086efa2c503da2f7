"""`sqlite:///path`: the MLflow store in a SQLite file, made whole at its first opening (from a migrated template:
orchestrator/storage/mlflow_template.py), refused in one line when damaged, locked or unopenable (MLflow's engine would
retry it for minutes), and made again when an older version left it half made and empty."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

from orchestrator.errors import StorageError, TrackingError
from orchestrator.redact import redact_uri
from orchestrator.storage import connections
from orchestrator.storage.base import TrackingStore
from orchestrator.storage.files import require_writable, why_not_writable
from orchestrator.storage.sqlite_files import (
    create_sqlite,
    read_only_uri,
    remake,
    require_table,
    require_unlocked,
    sqlite_file,
)

MLFLOW_TABLE = "experiments"  # the table every MLflow store has from its first opening
HINT = " (run a sweep with tracking first, or pass --tracking-uri)"


class MlflowSqliteStore(TrackingStore):
    kind = "SQLite file"

    @property
    def path(self) -> Path | None:
        return sqlite_file(self.url)

    def exists(self) -> bool:
        return self.path is None or self.path.exists()

    def check(self) -> None:
        path = self.path
        if path is None:
            return
        target = path if path.exists() else path.parent
        if not target.exists():
            raise TrackingError(f"cannot use the MLflow tracking URI {self.url!r}: "
                                f"directory {str(target)!r} does not exist")
        if not os.access(target, os.W_OK):
            raise TrackingError(f"cannot use the MLflow tracking URI {self.url!r}: {str(target)!r} is not writable")
        try:  # an immutable folder, a damaged or locked file: one line now, not MLflow's minutes of retries
            require_writable(path, self.url, "MLflow store")
            if path.exists():
                require_unlocked(path, "MLflow store", self.shown)
        except StorageError as exc:
            raise TrackingError(str(exc)) from None

    def require_existing(self) -> None:
        require_table(self.url, MLFLOW_TABLE, "MLflow store", self.shown, HINT)

    def preload(self) -> None:
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 -- loaded, not used here

    def ready(self, create: bool) -> None:
        """A missing store is created all at once (`create`); one half made earlier that holds nothing is made
        again (`create`) or refused (a read-only command changes nothing)."""
        path = self.path
        if path is None:
            return
        if path.exists():
            _require_undamaged(path, self.url)
            _require_openable(path, self.url)
        if path.exists() and _half_made_mlflow(path):
            if not create:
                raise TrackingError(f"the MLflow store {self.shown} was never finished (its creation stopped half "
                                    "way, e.g. on a full disk) and holds nothing; a sweep makes it again")
            remake(path, _mlflow_schema)
        elif not path.exists() and create:
            create_sqlite(path, _mlflow_schema)


def _mlflow_schema(url: str) -> None:
    """MLflow's own store creation (its migrations, then its Default experiment), as MlflowClient would do it; the
    migrated schema copied from a template when one is at hand (orchestrator/storage/mlflow_template.py)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

    from orchestrator.storage import mlflow_template

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
    try:
        with closing(sqlite3.connect(read_only_uri(path), uri=True, timeout=connections.SQLITE_BUSY_S)) as conn:
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
    try:  # no busy wait: a lock answers at once, and the store's own open does the waiting (SQLITE_BUSY_S)
        with closing(sqlite3.connect(path, timeout=0)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        if "unable to open" not in str(exc):
            return  # locked, busy: the store's own open waits for it and says so
        raise TrackingError(f"cannot open the MLflow store {redact_uri(uri)}: {why_not_writable(path.parent)}, and "
                            "SQLite needs to make its -wal and -shm files there; make the folder writable or copy "
                            "the store elsewhere") from None


def _half_made_mlflow(path: Path) -> bool:
    """A store MLflow began and never finished (no Default experiment yet: it is made after the migrations) and
    that holds nothing of anyone's (no run, experiment or registered model)."""
    try:  # read without writing anything
        conn = sqlite3.connect(read_only_uri(path), uri=True, timeout=connections.SQLITE_BUSY_S)
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
