"""Shared test setup: environment every real component needs on a CPU-only machine."""

import os

# Real Ray locally/in CI without token auth or telemetry; trainer ranks single-threaded on 2 cores.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
from tests.mlflow_server import mlflow_server  # noqa: E402,F401  (a real `mlflow server` on 127.0.0.1)
