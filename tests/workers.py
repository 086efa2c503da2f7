"""What the pytest-xdist workers of one run share: a folder of the run (each worker's own temp folders are inside)."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def run_temp_root(tmp_path_factory) -> Path:
    """A folder of this pytest run that all its xdist workers see (without xdist: the run's own basetemp)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold a lock on `lock_path` against the other workers of the run (the file is made if missing)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
