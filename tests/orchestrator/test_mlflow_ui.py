"""`moe-autotune ui`: the MLflow UI of a sweep's store opens on its trials, with a tokens/s column, without job
workers, and stops cleanly on Ctrl-C."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from orchestrator.commands.cli import main
from orchestrator.errors import TrackingError
from orchestrator.sweep import run_sweep
from orchestrator.tracking.tracker import Tracker
from orchestrator.tracking.ui import open_sweep
from orchestrator.tracking.views import EXPERIMENT_KIND_TAG, PARENT_TAG, STUDY_TAG, TRIALS_VIEW, VIEW_TAG_PREFIX
from tests.mlflow_server import free_port
from tests.sweep_helpers import make_spec, prior_for

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _sweep_store(tmp_path, names=("first",)) -> str:
    """A store with one parent run per name, as Tracker.start leaves it (no trials needed here)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in names:
        Tracker(uri, name, tmp_path / name / "spool.jsonl").start({"name": name}, name, resume=False)
    return uri


def test_ui_refuses_a_missing_store_an_unknown_sweep_and_a_busy_port_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = f"sqlite:///{tmp_path / 'nowhere.db'}"
    assert main(["ui", "--tracking-uri", missing]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no MLflow store at") and err.count("\n") == 1
    assert not (tmp_path / "nowhere.db").exists()  # looking did not create an empty store

    uri = _sweep_store(tmp_path, ("alpha", "beta"))
    assert main(["ui", "--tracking-uri", uri, "gamma"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: no sweep 'gamma' in {uri}; it holds 'alpha', 'beta'\n"

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["ui", "--tracking-uri", uri, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --port {port}: 127.0.0.1:{port} is in use") and err.count("\n") == 1


def test_ui_picks_the_newest_sweep_and_tags_one_recorded_before_the_tag_existed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    assert client.search_experiments()  # the store exists (MLflow's Default experiment), holding no sweep
    with pytest.raises(TrackingError, match="no sweep in"):
        open_sweep(uri, None)
    for name in ("old", "older-kind"):  # experiments as earlier versions left them: no experiment tags
        exp = client.create_experiment(name)
        client.create_run(exp, run_name=name, tags={PARENT_TAG: "parent", STUDY_TAG: name})
    newest = open_sweep(uri, None)
    assert newest.name == "older-kind"
    tags = client.get_experiment(newest.experiment_id).tags
    assert tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    state = json.loads(json.loads(tags[VIEW_TAG_PREFIX + TRIALS_VIEW])["state"])
    assert state["orderByKey"] == "metrics.`tokens_per_sec_per_gpu`"
    assert open_sweep(uri, "old").name == "old"


def _dump_dom(url: str, profile: Path) -> str:
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", "--window-size=1280,800", "--virtual-time-budget=30000", "--dump-dom", url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, check=True).stdout


def _rendered(url: str, tmp_path: Path, names: list[str]) -> str:
    """The page once React has rendered the runs (a loaded machine may need a second look)."""
    for attempt in range(3):
        dom = _dump_dom(url, tmp_path / f"chromium-profile-{attempt}")  # fresh: no view state remembered
        if all(name in dom for name in names):
            return dom
    return dom


def _start_ui(uri: str, port: int, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", None)  # conftest turns the workers off: `ui` must do it itself
    return subprocess.Popen([sys.executable, "-m", "orchestrator.commands.cli", "ui", "--tracking-uri", uri,
                             "--port", str(port)], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (CI installs it)")
def test_ui_opens_on_the_trials_with_a_tokens_column_and_stops_on_ctrl_c(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands in tmp_path
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = make_spec(tmp_path, "uitest", budget={"n_trials": 4}, tracking_uri=uri)
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0
    parent = out.study.user_attrs["mlflow_parent_run_id"]
    client = MlflowClient(uri)
    names = sorted(r.info.run_name for r in client.search_runs(
        [out.study.user_attrs["mlflow_experiment_id"]], f"tags.`mlflow.parentRunId` = '{parent}'"))
    assert len(names) >= 4 and all(re.fullmatch(r"trial-\d+", n) for n in names)

    ui = _start_ui(uri, free_port(), tmp_path)
    try:
        line = ui.stdout.readline()
        while line and not line.startswith("http://"):
            line = ui.stdout.readline()
        assert line, f"no URL printed; stderr: {ui.stderr.read()}"
        url = line.strip()
        assert url.startswith("http://127.0.0.1:") and "/#/experiments/" in url

        dom = _rendered(url, tmp_path, names)
        missing = [n for n in names if n not in dom]
        assert not missing, f"trials not listed on the page: {missing}"
        # the tokens/s column: its header and one cell per run (the trials and the parent), in sight at 1280 px
        column = 'col-id="metrics.`tokens_per_sec_per_gpu`"'
        assert re.search(r'role="columnheader"[^>]*' + re.escape(column), dom)
        assert dom.count(column) >= len(names) + 1
        assert "tokens_per_sec_per_gpu" in re.sub(r"<[^>]+>", " ", dom)  # its title is on the page

        tree = psutil.Process(ui.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in tree]
        assert commands and all("mlflow server" in c or "uvicorn" in c for c in commands), commands
        assert not [c for c in commands if "mlflow.server.jobs" in c or "huey" in c]  # no job workers
        server_group = os.getpgid(tree[0].pid)
        assert server_group != os.getpgid(ui.pid)  # the server's own group, stopped as a whole
    finally:
        ui.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground `moe-autotune ui`
        rc = ui.wait(timeout=120)
    assert rc == 0, ui.stderr.read()
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    with pytest.raises(ProcessLookupError):
        os.killpg(server_group, 0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ui_of_a_tracking_server_prints_its_page_and_starts_nothing(tmp_path, mlflow_server, capsys):
    Tracker(mlflow_server.uri, "served", tmp_path / "spool.jsonl").start({"name": "served"}, "served", resume=False)
    assert main(["ui", "--tracking-uri", mlflow_server.uri, "served"]) == 0
    exp = MlflowClient(mlflow_server.uri).get_experiment_by_name("served")
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{mlflow_server.uri}/#/experiments/{exp.experiment_id}/runs"
        f"?workflowType=machine_learning&viewStateShareKey={TRIALS_VIEW}")
