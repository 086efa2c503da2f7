"""Storage: the stores a sweep keeps, opened, checked, bounded and failing in one way whatever their kind: the
Optuna storage of its study (a `StudyStore`) and the MLflow store of its records (a `TrackingStore`),
orchestrator/storage/base.py. One module per backend; this table maps a URL to its backend (as Optuna's
`get_storage(url)` and MLflow's store registry do), so that no module outside this room branches on a URL's scheme
or imports a backend's library. Backend modules are imported only when their URL is used.

| URL | study (Optuna) | records (MLflow) |
|---|---|---|
| `journal:///path` | journal.JournalStore | |
| `sqlite:///path` | sqlite.SqliteStudyStore | mlflow_sqlite.MlflowSqliteStore |
| `postgresql://...` (any SQL server) | postgresql.DatabaseStudyStore | mlflow_server.MlflowDatabaseStore |
| `http(s)://...` | | mlflow_server.MlflowServerStore |
| `file:///path` | | mlflow_file.MlflowFileStore |

A tracking URI without a scheme (a plain path such as `mlflow.db`) is refused in one line naming the schemes accepted
(`check_tracking_uri`): MLflow would take it for the folder of a file store and answer with its own maintenance text.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlsplit

from search_spaces.errors import SpecError

from orchestrator.storage.base import StudyStore, TrackingStore

__all__ = ["TRACKING_SCHEMES", "StudyStore", "TrackingStore", "check_tracking_uri", "open_mlflow",
           "require_mlflow_store", "study_store", "tracking_store"]

_STUDY_STORES = {"journal": "journal.JournalStore", "sqlite": "sqlite.SqliteStudyStore"}
_STUDY_DEFAULT = "postgresql.DatabaseStudyStore"  # any other URL: SQLAlchemy's (a server, or one line)
_TRACKING_STORES = {"sqlite": "mlflow_sqlite.MlflowSqliteStore", "http": "mlflow_server.MlflowServerStore",
                    "https": "mlflow_server.MlflowServerStore", "file": "mlflow_file.MlflowFileStore"}
# what a tracking URI may be, as the refusal of one without a scheme names it
TRACKING_SCHEMES = "sqlite:///PATH, file:///PATH (a file store's folder), http(s)://HOST:PORT, postgresql://HOST/DB"
_SQL_SERVERS = ("postgresql", "postgres", "mysql", "mariadb", "mssql", "oracle")


def _scheme(url: str) -> str:
    """`postgresql` of `postgresql+psycopg://...`; '' for a plain path (a Windows drive letter included)."""
    try:
        scheme = urlsplit(url).scheme
    except ValueError:  # e.g. an unclosed IPv6 bracket: what precedes ':' is still the scheme the user meant
        scheme = url.partition(":")[0] if ":" in url else ""
    scheme = scheme.split("+")[0].lower()
    return "" if len(scheme) == 1 and url[1:3] in (":\\", ":/") else scheme


def _make(where: str, url: str) -> Any:
    module, _, name = where.rpartition(".")
    return getattr(importlib.import_module(f"orchestrator.storage.{module}"), name)(url)


def study_store(url: str) -> StudyStore:
    """The study store (base.StudyStore) of an Optuna storage URL."""
    return _make(_STUDY_STORES.get(_scheme(url), _STUDY_DEFAULT), url)


def check_tracking_uri(uri: str, none_ok: bool = False) -> str:
    """`uri`, when it names its store by a URL scheme; a plain path (`mlflow.db`, `./mlruns`) is one SpecError line
    naming the schemes accepted. `none_ok`: a sweep's `none` (no MLflow records) is accepted, and named."""
    if none_ok and uri.lower() == "none":  # as the sweep reads it (orchestrator/sweep/session.py)
        return uri
    if not _scheme(uri):
        raise SpecError(f"tracking URI {uri!r} has no URL scheme: give {TRACKING_SCHEMES}"
                        + (", or none (no MLflow records)" if none_ok else ""))
    return uri


def tracking_store(uri: str) -> TrackingStore:
    """The MLflow store (base.TrackingStore) of a tracking URI (one without a scheme: check_tracking_uri's line)."""
    scheme = _scheme(check_tracking_uri(uri))
    where = "mlflow_server.MlflowDatabaseStore" if scheme in _SQL_SERVERS else _TRACKING_STORES.get(
        scheme, "mlflow_server.MlflowServerStore")  # another scheme: MLflow's client answers for it
    return _make(where, uri)


def open_mlflow(uri: str, create: bool = False):
    """The MLflow store at `uri` as a bounded client (connections.BoundedClient), made ready first
    (TrackingStore.open). A read-only command passes create=False and asks `require_mlflow_store` before."""
    return tracking_store(uri).open(create)


def require_mlflow_store(uri: str) -> None:
    """The MLflow store a read-only command reads (check, ui, export, calibrate, report, promote --rollback) must
    already exist: MLflow would create a missing SQLite file, the schema of an empty database, or a file store's
    folder just by opening it. One SpecError line instead; a server is left to answer (within the bounds)."""
    tracking_store(uri).require_existing()
