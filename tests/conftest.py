"""Shared test setup: environment every real component needs on a CPU-only machine."""

import os
import sys

import pytest
from hypothesis import settings

# Property tests draw their example count from the profile: the full suite (CI) 300 per property; the inner
# loop (scripts/test.sh --fast passes --hypothesis-profile=fast) the same properties on fewer examples.
settings.register_profile("full", max_examples=300)
settings.register_profile("fast", max_examples=200)
settings.load_profile("full")

# Real Ray locally/in CI without token auth or telemetry; trainer ranks single-threaded on 2 cores.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
from tests.mlflow_server import mlflow_server  # noqa: E402,F401  (a real `mlflow server` on 127.0.0.1)

_MLFLOW_URI_VARS = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@pytest.fixture(autouse=True)
def _mlflow_uri_per_test():
    """An in-process `promote` or `confirm` points MLflow's process-wide URIs at its store and exports them;
    each test starts as a fresh CLI process would, from the environment it was given."""
    saved = {k: os.environ.get(k) for k in _MLFLOW_URI_VARS}
    yield
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
