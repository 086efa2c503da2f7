"""A new SQLite MLflow store starts as a copy of MLflow's schema, migrated once per MLflow version.

Making an MLflow store runs every one of MLflow's Alembic migrations: about a second on 2 cores, the largest part
of a first what-if sweep's start after the cost model's exploration. The migrated schema, still empty (no
experiment: MLflow makes its Default experiment in each new store, with that store's own artifact location), is
kept in a cache folder (`$MOE_AUTOTUNE_CACHE_DIR`, else `$XDG_CACHE_HOME/moe-autotune`, else
`~/.cache/moe-autotune`), one file per MLflow version, made whole like any store (`stores.create_sqlite`). A new
store is a page-by-page copy of it (SQLite's backup API): a database the migrations would have written (they
order the same tables and indexes differently from run to run), which MLflow then opens without migrating. A
template is used only at MLflow's head revision; a cache folder that cannot be written or read is passed over,
and the store is migrated in place as before.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Callable

log = logging.getLogger("moe_autotune")
CACHE_ENV = "MOE_AUTOTUNE_CACHE_DIR"


def fill(path: Path, create_whole: Callable[[Path, Callable[[str], None]], bool]) -> bool:
    """Copy the migrated schema into the new, empty SQLite file `path`; False when no template could be had (the
    caller migrates). `create_whole`: how a store file is made whole (stores.create_sqlite)."""
    template = _template(create_whole)
    if template is None:
        return False
    with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(path)) as target:
        source.backup(target)
    return True


def cache_folder() -> Path | None:
    """Where templates are kept; None when the user has no home folder to put a cache in."""
    own = os.environ.get(CACHE_ENV)
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME")
    if base:
        return Path(base) / "moe-autotune"
    try:
        return Path.home() / ".cache" / "moe-autotune"
    except RuntimeError:  # no home folder known for this user
        return None


def _template(create_whole: Callable[[Path, Callable[[str], None]], bool]) -> Path | None:
    import mlflow
    from sqlalchemy.exc import SQLAlchemyError

    folder = cache_folder()
    if folder is None:
        return None
    path = folder / f"mlflow-{mlflow.__version__}-schema.db"
    try:
        if path.exists() and _at_head(path):
            return path
        path.unlink(missing_ok=True)  # made by a different build of this version, or damaged: made again
        folder.mkdir(parents=True, exist_ok=True)
        create_whole(path, _migrate)
        return path if _at_head(path) else None
    except (OSError, sqlite3.Error, SQLAlchemyError) as exc:  # a cache folder that refuses: migrated in place
        log.info("MLflow schema template not used (%s: %s)", type(exc).__name__, exc)
        return None


@functools.cache
def _head_revision() -> str:
    """The installed MLflow's schema revision (Alembic reads every migration script to find it: once a process)."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _at_head(path: Path) -> bool:
    """The file holds MLflow's schema at the head revision of the installed MLflow."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        try:
            rows = db.execute("SELECT version_num FROM alembic_version").fetchall()
        except sqlite3.DatabaseError:  # no such table, or not a database at all
            return False
    return rows == [(_head_revision(),)]


def _migrate(url: str) -> None:
    """MLflow's own table creation and migrations, without the Default experiment a store opening would add."""
    from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine_with_retry
    from sqlalchemy import event

    engine = create_sqlalchemy_engine_with_retry(url)  # MLflow's own engine: the tables come out as its store's

    @event.listens_for(engine, "connect")
    def _unsynced(dbapi_connection, _record) -> None:
        # the file is made in hidden and flushed to disk once done (stores.create_sqlite): a flush per migration
        # would cost the disk's time for nothing. (Its journal mode is left alone: the migrations hold more than
        # one connection, and a change of journal mode while another is open is refused as "locked".)
        dbapi_connection.execute("PRAGMA synchronous=OFF")

    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()
