"""`moe-autotune ui`: the MLflow UI for a sweep's store, opened on the sweep's trials.

`mlflow ui` is `mlflow server`, and MLflow 3 starts its job workers with it (a huey job runner and its
consumers, for GenAI jobs); a sweep's store needs none, so they are turned off
(MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false) and one uvicorn worker serves the page on 127.0.0.1. The server
runs in a process group of its own: Ctrl-C (or SIGTERM, SIGHUP) stops that whole group, and the command exits 0.
The printed URL opens the experiment's runs page in the model-training view on the trials view
(views.runs_page_url, views.trials_view).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator, TextIO

from mlflow import MlflowClient
from mlflow.entities import Experiment

from search_spaces.errors import SpecError

from orchestrator.errors import OutputError, TrackingError
from orchestrator.redact import redact_uri
from orchestrator.storage import open_mlflow, tracking_store
from orchestrator.storage.connections import BoundedClient
from orchestrator.tracking.client import require_existing_store, unusable
from orchestrator.tracking.views import PARENT_TAG, mark_training_experiment, runs_page_url
from orchestrator.userio import echo

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 180.0  # a loaded 2-core machine takes tens of seconds to import MLflow's server
STOP_GRACE_S = 20.0
NO_JOB_WORKERS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
# the UI's own requests go straight to 127.0.0.1, never through an http_proxy from the environment
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class _Stop(Exception):
    """Ctrl-C, SIGTERM or SIGHUP: time to stop the server."""


def serve(tracking_uri: str, study: str | None, port: int) -> int:
    """Start the UI for the sweep `study` (default: the newest) and serve until a signal; 0 after a clean stop."""
    experiment = open_sweep(tracking_uri, study)
    if tracking_store(tracking_uri).serves_ui:  # already a server: nothing to start
        _say(f"MLflow UI of sweep {experiment.name!r}:")
        _say(runs_page_url(redact_uri(tracking_uri), experiment.experiment_id))  # never a password
        return 0
    _check_port(port)
    fd, name = tempfile.mkstemp(prefix="moe-autotune-ui-", suffix=".log")
    log_path = Path(name)
    proc: subprocess.Popen | None = None
    with _stop_on_signals() as stopping, os.fdopen(fd, "wb") as log:
        try:
            proc = subprocess.Popen(server_argv(tracking_uri, port), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env={**os.environ, **NO_JOB_WORKERS},
                                    start_new_session=True)
            code: int | None = _announce_and_wait(proc, f"http://{HOST}:{port}", experiment, log_path)
        except _Stop:
            code = None
        except OutputError:  # the URL could not be printed (a closed pipe, a full device): nothing left running
            log_path.unlink(missing_ok=True)
            raise
        finally:
            stopping.append(0)  # a signal from here on is ignored: the group is being stopped anyway
            if proc is not None:
                stop_group(proc)  # also after a failed start: nothing is left running
    if code is not None:
        _say(f"error: the MLflow UI stopped by itself (exit code {code}); see {log_path}", file=sys.stderr)
        return 1
    log_path.unlink()
    return 0


def _announce_and_wait(proc: subprocess.Popen, base: str, experiment: Experiment, log_path: Path) -> int:
    """Print the URL once the server answers; the server's exit code should it ever stop by itself."""
    _wait_ready(proc, base, log_path)
    _say(f"MLflow UI of sweep {experiment.name!r}, without job workers:")
    _say(runs_page_url(base, experiment.experiment_id))
    _say(f"Ctrl-C stops it (server log: {log_path})")
    return proc.wait()


def _say(message: str, file: TextIO | None = None) -> None:
    """One line onto standard output, guarded (commands/output.py: a closed pipe or a full device is one line,
    exit 6), flushed at once so a reader of a pipe gets the URL while the server runs; or onto `file`."""
    if file is None:
        echo(message)
        return
    print(message, file=file, flush=True)


def open_sweep(tracking_uri: str, study: str | None) -> Experiment:
    """The sweep's experiment in the store, tagged for the model-training view; one line when the store
    cannot be used or holds no such sweep."""
    require_existing_store(tracking_uri)  # opening a missing store would create an empty one
    try:
        client = open_mlflow(tracking_uri)  # bounded: an unreachable server is one line, not a hang
        experiment = _find(client, tracking_uri, study)
        mark_training_experiment(client, experiment.experiment_id)  # sweeps recorded before the tag existed
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 -- any failure of the store here means it cannot be used
        raise unusable(tracking_uri, exc) from None
    return experiment


def _find(client: MlflowClient | BoundedClient, tracking_uri: str, study: str | None) -> Experiment:
    if study is not None:
        found = client.get_experiment_by_name(study)
        if found is not None and found.lifecycle_stage == "active":
            return found
    experiments = client.search_experiments()
    if study is not None:
        names = ", ".join(sorted(repr(e.name) for e in experiments if e.name != "Default"))
        raise TrackingError(f"no sweep {study!r} in {redact_uri(tracking_uri)}"
                            + (f"; it holds {names}" if names else "; it holds no sweep"))
    # the newest sweep: the experiment of the most recently started parent run
    parents = client.search_runs([e.experiment_id for e in experiments], f"tags.`{PARENT_TAG}` = 'parent'",
                                 max_results=1, order_by=["attributes.start_time DESC"]) if experiments else []
    if not parents:
        raise TrackingError(f"no sweep in {redact_uri(tracking_uri)}: run `moe-autotune sweep` first, "
                            "or pass --tracking-uri")
    return client.get_experiment(parents[0].info.experiment_id)


def server_argv(tracking_uri: str, port: int) -> list[str]:
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri,
            "--host", HOST, "--port", str(port), "--workers", "1"]


def _check_port(port: int) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise SpecError(f"--port {port}: {HOST}:{port} is in use ({exc.strerror}); pick another port") from None


def _wait_ready(proc: subprocess.Popen, base: str, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrackingError(f"the MLflow UI did not start (exit code {proc.returncode}): "
                                f"{_last_line(log_path)} (log: {log_path})")
        try:
            with _DIRECT.open(f"{base}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:  # not listening yet: ask again
            time.sleep(0.5)
    raise TrackingError(f"the MLflow UI did not answer at {base}/health within {STARTUP_TIMEOUT_S:.0f} s "
                        f"(log: {log_path})")


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return redact_uri(lines[-1].strip())[:300] if lines else "no output"


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the server's process group, SIGKILL after `grace_s`; returns once the group is empty (or,
    should a member outlive SIGKILL's grace too, once that is spent)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            proc.poll()  # reap the leader if it is a zombie
            return
        deadline = time.monotonic() + grace_s
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue  # the leader outlived SIGTERM: the SIGKILL round
        while time.monotonic() < deadline:  # the leader is gone; its children follow it
            if not _group_alive(proc.pid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[list[int]]:
    """Ctrl-C, SIGTERM and SIGHUP raise _Stop once (later ones, or any once the caller appends to the yielded
    list, are ignored), whatever the parent left them as (a shell's background job starts with SIGINT ignored)."""
    stopping: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if not stopping:
            stopping.append(signum)
            raise _Stop(signum)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield stopping
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
