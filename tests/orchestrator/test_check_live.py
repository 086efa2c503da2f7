"""`check` during a live sweep (issue 58): what its driver is still running or recording is in flight, not a
difference; everything else is checked as for a finished sweep.

Real processes: a sweep held mid-record (its forked MLflow writer stopped, SIGSTOP, so that the study runs ahead of
MLflow) and a sweep held mid-trial (tests/fake_trainer.py's gate file), each checked by the CLI while it runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.outputs.check import check, examine
from tests.sweep_helpers import measured_count, start_held_sweep, write_spec

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("moe-autotune"))
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}


def _check(tmp_path: Path, data: dict) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "check", data["name"], "--storage", data["storage"]], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=240)


def _until(what, proc: subprocess.Popen, limit_s: float = 240) -> None:
    deadline = time.monotonic() + limit_s
    while not what():
        assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_whose_records_lag_its_trials_is_in_flight_not_inconsistent(tmp_path, sweep_spec):
    # 40 trials: the driver runs 5 past the stopped writer in well under a second, then (its trials done, if so)
    # waits for the writer to take every record (write_behind.settle): alive, holding the lease, when `check` looks
    data = sweep_spec("live", budget={"n_trials": 40}, gpus_per_node=8,
                      free=["mbs", "recompute", "tp", "ep", "pp", "cp"])
    spec = write_spec(tmp_path / "spec.json", data)
    sweep = subprocess.Popen([CLI, "sweep", str(spec), "--quiet"], cwd=tmp_path, env=ENV, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        # once trials are told, the analytic sweep's one child is its MLflow writer (write-behind; the space was
        # explored by a child of its own before): stopped, the study runs ahead of MLflow
        _until(lambda: measured_count(data["storage"], "live") >= 1, sweep)
        children = psutil.Process(sweep.pid).children()
        assert len(children) == 1, children
        writer = children[0]
        writer.suspend()
        stopped_at = measured_count(data["storage"], "live")
        _until(lambda: measured_count(data["storage"], "live") >= min(stopped_at + 5, 40), sweep)
        assert examine(data["storage"], "live").problems  # what check said before: differences
        held = _check(tmp_path, data)
        assert held.returncode == 0, held.stdout + held.stderr
        last = held.stdout.strip().splitlines()[-1]
        assert "differs" not in held.stdout and "consistent; in flight (" in last, held.stdout
        assert f"run by pid {sweep.pid} on " in last, last
        writer.resume()
        assert sweep.wait(timeout=300) == 0, sweep.stderr.read()[-2000:]
    finally:
        if writer is not None and writer.is_running():
            writer.resume()
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    done = _check(tmp_path, data)
    assert done.returncode == 0 and "in flight" not in done.stdout, done.stdout
    assert check(data["storage"], "live")[1] == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trial_held_mid_run_is_in_flight_and_a_dead_drivers_is_not(tmp_path, sweep_spec):
    data, sweep, gate, starts = start_held_sweep(tmp_path, sweep_spec, "live", ENV)  # its 2nd trial waits on gate
    try:
        _until(lambda: starts.exists() and len(starts.read_text().splitlines()) >= 2, sweep)
        held = _check(tmp_path, data)
        assert held.returncode == 0, held.stdout + held.stderr
        last = held.stdout.strip().splitlines()[-1]
        assert f"consistent; in flight (1): trials 1, run by pid {sweep.pid} on " in last, held.stdout
        os.killpg(sweep.pid, signal.SIGKILL)  # its driver dies: nothing is in flight any more
        sweep.wait()
    finally:
        gate.unlink()
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    dead = _check(tmp_path, data)
    assert "in flight" not in dead.stdout, dead.stdout
