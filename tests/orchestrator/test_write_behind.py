"""An analytic sweep's MLflow records made by a forked writer (Tracker.write_behind,
orchestrator/tracking/writer_process.py):
the same records as a sweep that makes them itself, whatever happens to the writer, and a writer that never
outlives its sweep.

The writer is forked only in a single-threaded process, and a pytest-xdist worker has a second thread: the sweeps
with a writer run in a process of their own (tests/write_behind_driver.py). The reference sweep runs here, with no
writer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from orchestrator.commands.cli import LIBRARY_THREADS_OFF
from orchestrator.outputs.check import check
from orchestrator.sweep import run_sweep
from orchestrator.tracking.writer_process import WriterProcess
from tests.sweep_helpers import make_spec, prior_for, spec_data

ROOT = Path(__file__).resolve().parents[2]
DRIVER = [sys.executable, "-m", "tests.write_behind_driver"]
VOLATILE_TAGS = {"mlflow.parentRunId", "mlflow.user", "mlflow.source.name", "mlflow.source.type",
                 "mlflow.source.git.commit", "mlflow.runName"}


def _env() -> dict[str, str]:
    # as the CLI runs: no library thread pools (OpenBLAS's threads would keep any writer from being forked)
    return {**os.environ, **LIBRARY_THREADS_OFF, "PYTHONPATH": str(ROOT)}


def _driver(*args: str, timeout: int = 240) -> dict:
    done = subprocess.run([*DRIVER, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _children(uri: str, experiment: str) -> dict[int, dict]:
    """Each trial's child run as MLflow holds it: status, params, tags, and every point of every metric."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], "tags.`optuna_trial_number` != ''", max_results=1000)
    found: dict[int, dict] = {}
    for run in runs:
        number = int(run.data.tags["optuna_trial_number"])
        assert number not in found, f"trial {number} has two runs"
        points = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
                  for key in run.data.metrics}
        found[number] = {"status": run.info.status, "params": dict(run.data.params), "metrics": points,
                         "tags": {k: v for k, v in run.data.tags.items() if k not in VOLATILE_TAGS}}
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, dict]:
    """The records of the sweep below made by the sweep itself (no writer: a pytest-xdist worker cannot fork one,
    and WriterProcess.start is refused here, a module fixture running outside tests/conftest.py's refusal)."""
    tmp = tmp_path_factory.mktemp("reference")
    spec = make_spec(tmp, "behind", **_changes(tmp))
    mp = pytest.MonkeyPatch()
    mp.setattr(WriterProcess, "start", classmethod(lambda cls, serve: None))
    try:
        assert run_sweep(spec, prior=prior_for(spec), show_progress=False).exit_code == 0
    finally:
        mp.undo()
    return _children(spec.tracking_uri, spec.experiment_name)


def _changes(tmp: Path) -> dict:
    return {"budget": {"n_trials": 12}, "seed": 5, "track_rejected": True,
            "storage": f"journal:///{tmp / 'optuna.journal'}"}


@pytest.mark.timeout(400)
# the faults run in the full suite (each is a sweep of its own, about 5 s): the fast lane keeps the plain one
@pytest.mark.parametrize("mode", ["plain", *(pytest.param(m, marks=pytest.mark.slow)
                                             for m in ("dies", "quiet-over", "half-made"))])
def test_a_writer_makes_the_records_the_sweep_would_have_made_whatever_befalls_it(tmp_path, reference, mode):
    """plain: the writer makes them all. dies: it dies after making a record it never answered (the sweep makes
    that record again and the rest itself). quiet-over: the lease's quiet time is over, every record is handed back.
    half-made: each comes back with its figures logged and its run open. In every case each trial has one run,
    every figure is there once, and `check` finds nothing."""
    data = spec_data(tmp_path, "behind", **_changes(tmp_path))
    got = _driver("sweep", json.dumps(data), mode)
    assert got == {"exit_code": 0, "writers": [True]}, got
    records = _children(data["tracking_uri"], "behind")
    assert sorted(records) == sorted(reference) and len(records) >= 12
    for number, run in records.items():
        assert run == reference[number], (mode, number)
        assert run["status"] == "FINISHED"
        assert all(len(points) == len({step for step, _ in points}) for points in run["metrics"].values())
    _, problems = check(data["storage"], "behind")
    assert problems == []


@pytest.mark.timeout(120)
def test_requests_and_answers_larger_than_a_pipe_come_back_whole_and_in_order():
    """50 requests and answers of 200 KB each, sent without reading: no deadlock, every answer in order."""
    got = _driver("echo", "50", str(200_000))
    assert got == {"numbers": list(range(50)), "answers_match": True, "alive": False, "unanswered": []}


@pytest.mark.timeout(120)
def test_a_writer_that_dies_leaves_every_answer_it_gave_and_the_rest_unanswered_in_order():
    """It dies as it reads request 20 of 50 (the parent's later writes meet a closed pipe): answers 0-19 come back,
    and 20-49 are the parent's to make, in order."""
    got = _driver("echo", "50", str(100_000), "20")
    assert got == {"numbers": list(range(20)), "answers_match": True, "alive": False,
                   "unanswered": list(range(20, 50))}


@pytest.mark.timeout(60)
def test_a_writer_dies_with_its_parent():
    """A sweep SIGKILLed leaves no writer behind: a rival driver on this host takes its lease at once, and must
    find no process still writing for the dead one."""
    done = subprocess.run([*DRIVER, "orphan"], cwd=ROOT, capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == -9
    pid = int(done.stdout.strip())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running, or stopped: not gone and not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")

