"""A `--resume` of a study whose SQLite storage is busy because its driver holds it names that driver, as the
lease's refusal does, and does not blame the locked file (issue 58).

Real processes: a first driver held mid-trial (tests/fake_trainer.py's gate file), its storage's write lock held
(as a driver paused mid-write holds it), and a second driver's `sweep --resume`.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest

from orchestrator.commands.cli import main
from orchestrator.records import StudyRecord
from orchestrator.sweep.lease import Holder
from tests.sweep_helpers import start_held_sweep, write_spec

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("moe-autotune"))
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}


def _locked(storage: str):
    """A connection holding the SQLite file's write lock (until it is closed)."""
    conn = sqlite3.connect(storage[len("sqlite:///"):], isolation_level=None, timeout=60)
    conn.execute("BEGIN IMMEDIATE")
    return closing(conn)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_resume_of_a_study_whose_driver_holds_its_locked_storage_names_the_driver(tmp_path, sweep_spec):
    data, first, gate, starts = start_held_sweep(tmp_path, sweep_spec, "held", ENV)  # its 2nd trial waits on gate
    spec = tmp_path / "spec.json"
    try:
        deadline = time.monotonic() + 240
        while not (starts.exists() and len(starts.read_text().splitlines()) >= 2):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-2000:]
            time.sleep(0.1)
        with _locked(data["storage"]):  # the storage busy, as when its driver is paused mid-write
            second = subprocess.run([CLI, "sweep", str(spec), "--quiet", "--resume"], cwd=tmp_path, env=ENV,
                                    capture_output=True, text=True, timeout=240)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"study 'held' is being run by pid {first.pid} on " in lines[0], lines
        assert "locked" not in lines[0], lines
        assert first.poll() is None  # the first driver goes on
    finally:
        gate.unlink()
        if first.poll() is None:
            try:
                first.wait(timeout=240)
            except subprocess.TimeoutExpired:
                os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, first.stderr.read()[-2000:]


@pytest.mark.timeout(300)
def test_a_storage_locked_while_a_driver_elsewhere_holds_the_study_names_that_driver(tmp_path, sweep_spec, capsys,
                                                                                      monkeypatch):
    data = sweep_spec("held", budget={"n_trials": 2})
    spec = write_spec(tmp_path / "spec.json", data)
    assert main(["sweep", str(spec), "--quiet"]) == 0
    study = optuna.load_study(study_name="held", storage=data["storage"])
    elsewhere = Holder(token="t" * 32, epoch=7, host="elsewhere", pid=4242, heartbeat=time.time())
    StudyRecord.write(study, driver_lease=elsewhere.to_attr())  # a driver on another host holds it
    monkeypatch.setattr("orchestrator.storage.connections.SQLITE_BUSY_S", 0.5)  # the storage's wait, shortened
    capsys.readouterr()
    with _locked(data["storage"]):
        assert main(["sweep", str(spec), "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study 'held' is being run by pid 4242 on elsewhere" in err[0], err
    # a lease released: the locked file is what stops it, and the line says so
    StudyRecord.write(study, driver_lease=None)
    with _locked(data["storage"]):
        assert main(["sweep", str(spec), "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is locked by another process" in err[0], err
