"""MLflow stores kept by a server: an MLflow tracking server (`http(s)://...`), and MLflow's SQL store on a database
server (`postgresql://...`). Every call bounded (orchestrator/storage/connections.py); the server answers for
itself whether it holds a store."""

from __future__ import annotations

from search_spaces.errors import SpecError

from orchestrator.storage.base import TrackingStore
from orchestrator.storage.mlflow_sqlite import HINT, MLFLOW_TABLE
from orchestrator.storage.postgresql import server_has_table


class MlflowServerStore(TrackingStore):
    """An MLflow tracking server (or any other URI MLflow's client answers for: its own bounds apply)."""

    kind = "MLflow server"
    forkable = False  # an HTTP client's pooled sockets cannot be shared by a fork
    serves_ui = True


class MlflowDatabaseStore(TrackingStore):
    """MLflow's SQL store on a database server (MLflow would create the schema of an empty database by opening
    it: a read-only command asks first)."""

    kind = "database server"

    def require_existing(self) -> None:
        if not server_has_table(self.url, MLFLOW_TABLE, "MLflow store"):
            raise SpecError(f"no MLflow store in {self.shown}: the database has no {MLFLOW_TABLE!r} table{HINT}")

    def preload(self) -> None:
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 -- loaded, not used here
