"""Template MLflow stores: MLflow's migrations run once per test session, every fresh SQLite store is a copy.

Opening a fresh SQLite MLflow store runs all of MLflow's Alembic migrations (seconds on 2 cores); most tests
open one. `install()` wraps MLflow's `_initialize_tables`: for an SQLite database that holds no table yet, it
copies (SQLite's backup API, page by page) a template that MLflow's own `_initialize_tables` migrated once, so
the store is the very database the migrations would have written. Anything else (a server, PostgreSQL, a
database that already has tables) goes to MLflow's own code. `copy_template_to(path)` writes a copy as a file
before a process (an `mlflow server`) opens it.

The template lives beside pytest's per-session temp folders (shared by the xdist workers of a run, built by the
first worker that needs it, under a file lock).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from tests.workers import exclusive

_root: Path | None = None
_template: Path | None = None
_real_initialize = None


def install(root: Path) -> None:
    """Route MLflow's table creation for empty SQLite stores through the template kept under `root`."""
    global _root, _real_initialize
    import mlflow.store.db.utils as db_utils
    import mlflow.store.model_registry.sqlalchemy_store as registry_store  # imported the function by name

    _root = Path(root)
    if _real_initialize is None:
        _real_initialize = db_utils._initialize_tables
        db_utils._initialize_tables = _initialize_tables
        registry_store._initialize_tables = _initialize_tables


def installed() -> bool:
    """Is a template at hand (this process runs under the test suite's conftest)?"""
    return _real_initialize is not None


def template_path() -> Path:
    """The migrated template (built on first use; one per pytest run, whichever worker comes first)."""
    global _template
    if _template is not None:
        return _template
    assert _root is not None and _real_initialize is not None, "store_templates.install() first"
    path = _root / "mlflow-template.db"
    with exclusive(_root / "mlflow-template.lock"):
        if not path.exists():
            building = _root / "mlflow-template.building.db"
            building.unlink(missing_ok=True)
            engine = scratch_engine(building)
            try:
                _real_initialize(engine)
            finally:
                engine.dispose()
            # one self-contained file (no -wal beside it), so that a plain file copy is a whole database
            with sqlite3.connect(building) as conn:
                conn.execute("PRAGMA journal_mode=DELETE")
            building.rename(path)
    _template = path
    return path


def scratch_engine(path: Path):
    """An engine for a database whose durability does not matter (the template, before it is settled): no fsync
    per commit, so that MLflow's migrations cost CPU only, not the disk's flushes; the schema is the same."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(f"sqlite:///{path}", poolclass=sqlalchemy.pool.NullPool)

    @sqlalchemy.event.listens_for(engine, "connect")
    def _no_sync(dbapi_connection, _record):
        dbapi_connection.execute("PRAGMA synchronous=OFF")
        dbapi_connection.execute("PRAGMA journal_mode=MEMORY")

    return engine


def copy_template_to(path: Path) -> None:
    """A fresh migrated MLflow store at `path` (a file that does not exist yet)."""
    shutil.copyfile(template_path(), path)


def _sqlite_file(engine) -> bool:
    return engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:")


def _initialize_tables(engine) -> None:
    import sqlalchemy

    if not _sqlite_file(engine) or sqlalchemy.inspect(engine).get_table_names():
        return _real_initialize(engine)
    template = template_path()
    try:
        with engine.connect() as conn:
            source = sqlite3.connect(f"file:{template}?mode=ro", uri=True)
            try:
                source.backup(conn.connection.driver_connection)
            finally:
                source.close()
    except sqlite3.Error:
        # the copy failed (a full disk, a refused write: SQLite rolled it back): MLflow's own migration meets the
        # same fault and fails as it would without the template, which is what tests of such faults check
        return _real_initialize(engine)
