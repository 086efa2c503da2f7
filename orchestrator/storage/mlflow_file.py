"""`file:///path`: MLflow's file store (a folder; a plain path is refused: storage.check_tracking_uri). MLflow would
make a missing one by opening it: a read-only command asks first.

MLflow 3 keeps the file store in maintenance mode and refuses to open one unless MLFLOW_ALLOW_FILE_STORE=true: a
user who names `file:///` asked for it, so it is set for this process (and the servers it starts) when the user
has not set it; a user's own `false` is kept, and MLflow's refusal is then the store's one line."""

from __future__ import annotations

import os
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
        return Path(urlsplit(self.url).path)

    def require_existing(self) -> None:
        if not (self.path / ".trash").is_dir():  # every opened store has it
            raise SpecError(f"no MLflow store at {self.url!r}: {str(self.path)!r} is not an MLflow file store{HINT}")

    def ready(self, create: bool) -> None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
