"""A real `mlflow server` on 127.0.0.1 for tests (sqlite backend in a temp dir, or a given store; free port).

Use as a context manager or through the `mlflow_server` fixture (the lead wires it into conftest.py):

    with MlflowServer(tmp_path) as server:
        MlflowClient(server.uri)
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests import store_templates

# Under pytest-xdist each worker takes its free ports from its own slice of this range, so that two workers never
# pick the same one between choosing it and the server binding it. The range is below Linux's ephemeral ports
# (32768-60999: what bind(0) and outgoing connections get) and above Ray's worker ports (10002-19999).
WORKER_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port nothing listens on now: the kernel's choice, or a free one of this xdist worker's own slice."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    width = len(WORKER_PORTS) // int(count)
    first = WORKER_PORTS.start + width * (int(worker[2:]) % int(count))
    for port in random.sample(range(first, first + width), width):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + width - 1}")


class MlflowServer:
    def __init__(self, root: Path, port: int | None = None, startup_timeout_s: float = 120.0,
                 backend_store_uri: str | None = None):
        self.root = Path(root)
        self.backend_store_uri = backend_store_uri  # default: SQLite in `root` (a team's server: PostgreSQL)
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> "MlflowServer":
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        store = self.root / "mlflow-server.db"
        if self.backend_store_uri is None and not store.exists() and store_templates.installed():
            store_templates.copy_template_to(store)  # MLflow's migrations were run once for the session
        argv = [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--backend-store-uri", self.backend_store_uri or f"sqlite:///{store}",
                "--artifacts-destination", str(self.root / "artifacts"), "--workers", "1"]
        self.log = open(self.root / "mlflow-server.log", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'mlflow-server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not ready after {self.startup_timeout_s} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()

    def __enter__(self) -> "MlflowServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real MLflow server for the test session."""
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server
