"""`file:///path` or a plain path: MLflow's file store (a folder). MLflow would make a missing one by opening it:
a read-only command asks first."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from search_spaces.errors import SpecError

from orchestrator.storage.base import TrackingStore
from orchestrator.storage.mlflow_sqlite import HINT


class MlflowFileStore(TrackingStore):
    kind = "file store"
    forkable = False

    @property
    def path(self) -> Path:
        return Path(urlsplit(self.url).path if self.url.startswith("file:") else self.url)

    def require_existing(self) -> None:
        if not (self.path / ".trash").is_dir():  # every opened store has it
            raise SpecError(f"no MLflow store at {self.url!r}: {str(self.path)!r} is not an MLflow file store{HINT}")
