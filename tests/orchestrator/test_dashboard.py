"""`moe-autotune dashboard` (issue 56, part 2): optuna-dashboard opens a sweep's study on the storage as the sweep
opens it (the default `journal:///optuna.journal`, which Optuna's own tools do not read as given), its HTTP API answers
with the study and its trials, and Ctrl-C or SIGTERM stops it at once with exit 0. The study names its objectives
(Optuna's metric_names), also once an older study is resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from orchestrator.commands.cli import main
from orchestrator.records.queries import METRIC_NAMES
from orchestrator.storage import studies
from tests.mlflow_server import free_port
from tests.sweep_helpers import write_spec

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STORAGE = "journal:///optuna.journal"  # the sweep's default, relative to where it runs
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy


def _command() -> list[str]:
    """`moe-autotune` as the user runs it (the installed script), else the module."""
    exe = shutil.which("moe-autotune", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "orchestrator.commands.cli"]


def _get(url: str) -> tuple[int, bytes]:
    with _DIRECT.open(url, timeout=30) as resp:
        return resp.status, resp.read()


def _start(cwd: Path, port: int, *args: str) -> tuple[subprocess.Popen, str]:
    """The dashboard, started as a user starts it, and the URL it printed once it serves."""
    proc = subprocess.Popen([*_command(), "dashboard", *args, "--port", str(port)], cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:  # blocks until the server prints (it binds before it prints)
        lines.append(line)
        if line.startswith("http://"):
            return proc, line.strip()
    proc.wait(timeout=30)
    raise AssertionError(f"no URL printed (exit {proc.returncode}): {''.join(lines)} {proc.stderr.read()}")


def _stop(proc: subprocess.Popen, sig: int) -> tuple[int, float, str]:
    started = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    return code, time.monotonic() - started, proc.stderr.read()


def _sweep(tmp_path: Path, sweep_spec, name: str, **changes) -> optuna.Study:
    data = sweep_spec(name, storage=DEFAULT_STORAGE, budget={"n_trials": 4}, **changes)
    assert main(["sweep", str(write_spec(tmp_path / f"{name}.json", data)), "--quiet"]) == 0
    return studies.load_study(DEFAULT_STORAGE, name)


@pytest.mark.slow  # a sweep and two servers started as processes
@pytest.mark.timeout(600)
def test_the_dashboard_serves_the_default_journal_study_with_its_trials_and_stops_on_ctrl_c(tmp_path, sweep_spec,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = _sweep(tmp_path, sweep_spec, "dash")
    assert study.metric_names == METRIC_NAMES

    port = free_port()
    proc, url = _start(tmp_path, port)  # no --storage, no study: the default journal, the newest study
    try:
        listed = json.loads(_get(f"http://127.0.0.1:{port}/api/studies")[1])["study_summaries"]
        assert [s["study_name"] for s in listed] == ["dash"]
        study_id = listed[0]["study_id"]
        assert url == f"http://127.0.0.1:{port}/dashboard/studies/{study_id}"
        assert listed[0]["directions"] == ["maximize", "minimize"]

        detail = json.loads(_get(f"http://127.0.0.1:{port}/api/studies/{study_id}")[1])
        assert detail["name"] == "dash" and detail["objective_names"] == METRIC_NAMES
        served = {t["number"]: t for t in detail["trials"]}
        assert sorted(served) == [t.number for t in study.trials] and len(served) >= 4
        for trial in study.trials:
            assert served[trial.number]["state"].upper() == trial.state.name, trial.number
            if trial.state == optuna.trial.TrialState.COMPLETE:
                assert served[trial.number]["values"] == pytest.approx(trial.values)
                assert {p["name"] for p in served[trial.number]["params"]} == set(trial.params)

        status, page = _get(url)  # the page the printed URL opens (the app renders it in the browser)
        assert status == 200 and b"<html" in page.lower()
    finally:
        code, took, err = _stop(proc, signal.SIGINT)  # what Ctrl-C sends to the foreground command
    assert code == 0 and took < 10, (code, took, err)
    assert err == ""  # no traceback, no line per request
    with socket.socket() as sock:  # nothing listens there any more (its closed connections may wait: TIME_WAIT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))

    proc, _ = _start(tmp_path, port, "dash", "--storage", DEFAULT_STORAGE)
    code, took, err = _stop(proc, signal.SIGTERM)  # scancel, kill
    assert code == 0 and took < 10 and err == "", (code, took, err)


def test_a_missing_study_storage_or_port_is_one_line(tmp_path, sweep_spec, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["dashboard", "--port", str(free_port())]) == 2  # no sweep here: the default journal is missing
    err = capsys.readouterr().err
    assert err.startswith("error: no Optuna storage at journal:///optuna.journal") and err.count("\n") == 1, err
    assert not (tmp_path / "optuna.journal").exists()  # looking did not create it

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(storage=storage, study_name="there", directions=["maximize", "minimize"])
    assert main(["dashboard", "gone", "--storage", storage]) == 2
    assert capsys.readouterr().err == f"error: no study 'gone' in {storage}; found: there\n"

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["dashboard", "there", "--storage", storage, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --port {port}: 127.0.0.1:{port} is in use") and err.count("\n") == 1, err


def test_name_metrics_names_a_study_once():
    study = optuna.create_study(directions=["maximize", "minimize"])
    assert study.metric_names is None
    studies.name_metrics(study)
    studies.name_metrics(study)
    assert study.metric_names == METRIC_NAMES == ["tokens/s/GPU", "peak memory GiB"]


@pytest.mark.slow  # two analytic sweeps
@pytest.mark.timeout(300)
def test_resuming_a_study_made_before_its_objectives_were_named_names_them(tmp_path, sweep_spec, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as older:  # the version before: nothing named
        older.setattr(studies, "name_metrics", lambda study: None)
        study = _sweep(tmp_path, sweep_spec, "older")
    assert study.metric_names is None
    data = sweep_spec("older", storage=DEFAULT_STORAGE, budget={"n_trials": 5})
    assert main(["sweep", str(write_spec(tmp_path / "older.json", data)), "--quiet", "--resume"]) == 0
    assert studies.load_study(DEFAULT_STORAGE, "older").metric_names == METRIC_NAMES
