"""Faults of the environment stop the sweep, never a layout (issue 58): the run directory turning read-only or full,
the MLflow store deleted, replaced or its folder gone mid-sweep, a server's store losing the sweep's runs, the Optuna
storage turning read-only. Each ends the sweep with one line and its exit code (7: the run directory refuses writes;
4: a full disk; 8: the MLflow store vanished or lost the sweep's runs; 9: the Optuna storage refuses writes), no
trial is its layout's `error`, and `--resume` once the fault is mended measures each layout of the budget once
(`check` clean). Before: every later trial failed as `error` ("backend failed: PermissionError"), burning the
budget; a deleted MLflow database went unnoticed (exit 0).

The faults are real where they can be: a folder refuses writes by `chattr +i` as root (CI; mode bits do not stop
root), by mode 0555 otherwise; a full disk is a small tmpfs (root: a mount) or, without one, the driver's fsync of a
file under the run directory answering ENOSPC (os.fsync monkeypatched: the driver's writes, not the trainer's); the
MLflow store is really deleted or replaced. Each lands between two trials of a real sweep (a hook on the recorder)
or, for a trainer that cannot write its result, while it runs (the fake trainer held until its folder is locked).
`python -m tests.orchestrator.test_environment_faults AFTER PATH ARGS...` is the CLI in a process of its own (the
forked MLflow writer, as for a user) with PATH deleted once AFTER trials are recorded.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0


# ---- helpers -------------------------------------------------------------------------------------------
def _after(monkeypatch, n: int, action: Callable[[], None]) -> list[int]:
    """`action()` once the sweep has recorded `n` trials (between two trials); the numbers of those recorded."""
    from orchestrator.sweep.record import Recorder

    real, seen = Recorder.finish, []

    def finish(self, proposal, result):
        row = real(self, proposal, result)
        seen.append(proposal.trial.number)
        if len(seen) == n:
            action()
        return row

    monkeypatch.setattr(Recorder, "finish", finish)
    return seen


def _refuse_on_answer(n: int, paths: list[Path]) -> None:
    """The replay backend's `n`th answer (its trial in flight) first makes `paths` immutable (chattr +i)."""
    from orchestrator.dispatch import replay

    real, answers = replay._after, []

    def answer(seconds, result):
        answers.append(result)
        if len(answers) == n:
            for path in paths:
                subprocess.run(["chattr", "+i", str(path)], check=True)
        return real(seconds, result)

    replay._after = answer


if __name__ == "__main__":  # the CLI with PATH deleted once AFTER trials are recorded (see the docstring)
    from orchestrator.commands.cli import console_main

    if sys.argv[1] == "refuse":  # ... refuse N PATH,PATH ARGS: the store refuses writes while trial N runs
        _refuse_on_answer(int(sys.argv[2]), [Path(p) for p in sys.argv[3].split(",")])
    else:
        _after(pytest.MonkeyPatch(), int(sys.argv[1]), Path(sys.argv[2]).unlink)
    sys.argv = [sys.argv[0], *sys.argv[4 if sys.argv[1] == "refuse" else 3:]]
    console_main()


@pytest.fixture
def read_only(tmp_path):
    """`read_only(folder)`: the folder refuses writes (chattr +i as root, whom mode bits do not stop; mode 0555
    otherwise); `read_only.mend(folder)` undoes it, and every folder is mended at the end."""
    made: list[Path] = []

    def refuse(folder: Path) -> None:
        made.append(folder)
        if not IS_ROOT:
            return folder.chmod(0o555)
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            raise OSError(f"chattr +i {folder} failed")

    def mend(folder: Path) -> None:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True) if IS_ROOT else folder.chmod(0o755)

    probe = tmp_path / "chattr-probe"
    probe.mkdir()
    try:
        refuse(probe)
    except OSError:
        pytest.skip("chattr +i is not available here (root ignores mode bits)")
    mend(probe)
    refuse.mend = mend  # type: ignore[attr-defined]
    yield refuse
    for folder in made:
        mend(folder)


def _full_under(monkeypatch, folder: Path) -> None:
    """The disk under `folder` is full, for this process: an fsync of a file there answers ENOSPC (the probe's
    page, the spools' records; the trainer's own processes are not affected)."""
    real = os.fsync

    def fsync(fd: int) -> None:
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = ""
        if where.startswith(str(folder)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return lines[0]


def _statuses(data: dict) -> dict[int, str | None]:
    from orchestrator.records import TrialRecord
    from orchestrator.storage import studies

    study = studies.load_study(data["storage"], data["name"])
    return {t.number: TrialRecord.of(t).status for t in study.get_trials(deepcopy=False)}


def _measured_once(data: dict) -> None:
    """`check` is consistent, no trial failed as `error`, and the budget's layouts were each measured once."""
    from orchestrator.outputs.check import check
    from orchestrator.records import queries

    study, problems = check(data["storage"], data["name"])
    assert problems == [], problems
    assert "error" not in _statuses(data).values(), _statuses(data)
    keys = [r.layout_key for r in queries.measured_records(study)]
    assert len(keys) == data["budget"]["n_trials"] and len(set(keys)) == len(keys), keys


def _ray(sweep_spec, name: str, real: bool = False, **changes) -> dict:
    """A sweep of trainer processes on Ray: tests/fake_trainer.py, or the real Megatron-Core CPU trainer."""
    from tests.sweep_helpers import FAKE_TRAINER

    trainer = {"backend": "ray", "launcher": "python", "steps": 2, "warmup": 1, "seq_len": 128, "gbs": 4,
               "trial_timeout_s": 600} if real else FAKE_TRAINER
    return sweep_spec(name, trainer, {"gpus_per_node": 1, "budget": {"n_trials": 3},
                                      "free": ["mbs", "recompute"]}, **changes)


def _sweep(data: dict, tmp_path: Path, *extra: str) -> int:
    from orchestrator.commands.cli import main
    from tests.sweep_helpers import write_spec

    return main(["sweep", str(write_spec(tmp_path / f"{data['name']}.json", data)), "--quiet", *extra])


# ---- 1. the run directory refuses writes -----------------------------------------------------------------
@pytest.mark.slow  # Ray and a trainer process per trial
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fault, real", [("run directory read-only", False), ("run directory full", False),
                                         ("run directory read-only", True)])
def test_a_fault_between_real_trials_stops_the_sweep_and_resume_runs_the_trial_again(
        tmp_path, sweep_spec, monkeypatch, capsys, read_only, fault, real):
    """`real`: the Megatron-Core CPU trainer (one process a trial) instead of the fake one."""
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    data = _ray(sweep_spec, "between-trials", real)
    runs = tmp_path / "runs" / data["name"]
    # (an MLflow store deleted mid-sweep: the analytic sweeps below and the forked writer's test)
    act = {"run directory read-only": lambda: read_only(runs),
           "run directory full": lambda: _full_under(monkeypatch, runs)}[fault]
    recorded = _after(monkeypatch, 2, act)
    code = _sweep(data, tmp_path)
    line = _one_line(capsys)
    if fault == "run directory read-only":
        assert code == 7 and line.startswith(f"error: the run directory cannot be written: '{runs}/trial-"), line
    else:  # no mount: the driver's fsync under the run directory answers ENOSPC
        assert code == 4 and line.startswith("error: the run directory's disk is full: ") and str(runs) in line, line
    # a trial in flight: interrupted, the line says so
    assert "recorded as interrupted, not as its layout's failure" in line and "--resume" in line, line
    statuses = _statuses(data)
    assert [statuses[n] for n in recorded] == ["ok", "ok"] and "error" not in statuses.values(), statuses
    assert [s for n, s in statuses.items() if n not in recorded].count("interrupted") == 1, statuses
    read_only.mend(runs)
    monkeypatch.undo()
    assert _sweep(data, tmp_path, "--resume") == 0
    _measured_once(data)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trainer_that_cannot_write_its_result_is_the_environments_fault(tmp_path, sweep_spec, monkeypatch,
                                                                            capsys, read_only):
    """The trial's folder turns read-only while its trainer runs: the trainer fails without a result, and the
    sweep, finding the folder refuses writes, stops instead of recording the layout as `error`."""
    gate = tmp_path / "hold"
    gate.touch()
    monkeypatch.setenv("FAKE_TRAINER_HOLD", str(gate))  # every run after the first waits while the gate exists
    data = _ray(sweep_spec, "no-result", budget={"n_trials": 3})
    runs = tmp_path / "runs" / data["name"]

    def lock_the_held_trial() -> None:
        starts = Path(f"{gate}.starts")
        while not starts.exists() or len(starts.read_text().splitlines()) < 2:
            time.sleep(0.1)
        read_only(max(runs.glob("trial-*")))  # the held run's folder: the newest
        gate.unlink()

    threading.Thread(target=lock_the_held_trial, daemon=True).start()
    code = _sweep(data, tmp_path)
    line = _one_line(capsys)
    assert code == 7 and "trial-0001" in line and "not as its layout's failure" in line, line
    assert "PermissionError" in (runs / "trial-0001" / "node-0.log").read_text()  # the trainer's own failure
    statuses = _statuses(data)
    assert statuses[0] == "ok" and statuses[1] == "interrupted" and "error" not in statuses.values(), statuses
    read_only.mend(runs / "trial-0001")
    assert _sweep(data, tmp_path, "--resume") == 0
    _measured_once(data)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not IS_ROOT, reason="mounting a tmpfs needs root (CI runs as root)")
def test_a_real_full_disk_under_the_run_directory_is_exit_4_and_resume_finishes(tmp_path, sweep_spec, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        data = _ray(sweep_spec, "full-tmpfs", workdir=str(disk))
        filler = disk / "filler"

        def fill() -> None:
            with open(filler, "wb") as fh:
                fh.write(b"\0" * shutil.disk_usage(disk).free)

        with pytest.MonkeyPatch.context() as patch:
            _after(patch, 2, fill)
            code = _sweep(data, tmp_path)
        line = _one_line(capsys)
        assert code == 4 and line.startswith("error: the run directory's disk is full: tmpfs mounted at "), line
        assert "error" not in _statuses(data).values()
        filler.unlink()
        assert _sweep(data, tmp_path, "--resume") == 0
        _measured_once(data)
    finally:
        subprocess.run(["umount", "--lazy", str(disk)])


@pytest.mark.parametrize("fault", ["refuses writes", "full"])
def test_mlflow_down_and_a_run_directory_that_refuses_its_spool_is_one_line(tmp_path, sweep_spec, monkeypatch,
                                                                            capsys, read_only, fault):
    """An analytic sweep writes nothing in its run directory but its spools: MLflow down, and the record it could not
    take refused by the run directory too, is the run directory's line (before: the Optuna storage was blamed)."""
    from orchestrator.tracking.tracker import Tracker

    data = sweep_spec("spool-refused", budget={"n_trials": 6})
    runs = tmp_path / "runs" / data["name"]

    def mlflow_down(self, run):
        raise ConnectionError("MLflow is down")

    def down_and_refused() -> None:
        monkeypatch.setattr(Tracker, "_record", mlflow_down)
        read_only(runs) if fault == "refuses writes" else _full_under(monkeypatch, runs)

    _after(monkeypatch, 2, down_and_refused)
    code = _sweep(data, tmp_path)
    line = _one_line(capsys)
    if fault == "full":
        assert code == 4 and line.startswith("error: the run directory's disk is full: "), line
    else:
        assert code == 7 and f"'{runs}/mlflow-spool.jsonl' is " in line, line
    assert "error" not in _statuses(data).values()
    read_only.mend(runs)
    monkeypatch.undo()
    assert _sweep(data, tmp_path, "--resume") == 0
    _measured_once(data)


# ---- 2. the MLflow store vanishes ------------------------------------------------------------------------
def _replace(path: Path) -> None:
    """The store deleted, a new empty database made under its name (as MLflow's engine does at its next connection)."""
    path.unlink()
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()


@pytest.mark.parametrize("how", ["deleted", "replaced", "folder gone"])
def test_an_mlflow_store_that_vanishes_mid_sweep_stops_it_and_resume_records_everything(tmp_path, sweep_spec,
                                                                                        monkeypatch, capsys, how):
    store = tmp_path / "mlflow" / "mlflow.db"
    store.parent.mkdir()
    data = sweep_spec("store-gone", budget={"n_trials": 6}, tracking_uri=f"sqlite:///{store}")
    vanish = {"deleted": store.unlink, "replaced": lambda: _replace(store),
              "folder gone": lambda: shutil.rmtree(store.parent)}[how]
    _after(monkeypatch, 2, vanish)
    code = _sweep(data, tmp_path)
    line = _one_line(capsys)
    assert code == 8, line
    said = {"deleted": "was deleted", "replaced": "was replaced by another file",
            "folder gone": "was deleted (its folder is gone)"}[how]
    assert line.startswith(f"error: the MLflow store sqlite:///{store} vanished mid-sweep: '{store}' {said}"), line
    assert "kept in the Optuna storage" in line and "--resume" in line, line
    assert "error" not in _statuses(data).values()
    if how == "replaced":
        store.unlink()  # mended: the stray file out of the way (a new store is made there)
    store.parent.mkdir(exist_ok=True)
    monkeypatch.undo()
    assert _sweep(data, tmp_path, "--resume") == 0
    _measured_once(data)


@pytest.mark.slow  # a CLI process of its own, its records made by the forked writer
@pytest.mark.timeout(300)
def test_an_mlflow_store_deleted_under_the_forked_writer_is_exit_8(tmp_path, sweep_spec):
    from tests.sweep_helpers import write_spec

    data = sweep_spec("writer-store-gone", budget={"n_trials": 8})
    spec = write_spec(tmp_path / "spec.json", data)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    store = tmp_path / "mlflow.db"
    gone = subprocess.run([sys.executable, "-m", "tests.orchestrator.test_environment_faults", "3", str(store),
                           "sweep", str(spec), "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    lines = gone.stderr.strip().splitlines()
    assert gone.returncode == 8 and len(lines) == 1, gone.stderr[-3000:]
    assert lines[0].startswith(f"error: the MLflow store sqlite:///{store} vanished mid-sweep"), lines
    again = subprocess.run([sys.executable, "-m", "orchestrator.commands.cli", "sweep", str(spec), "--quiet",
                            "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    _measured_once(data)


# ---- 3. the Optuna storage stops taking writes; a server's store loses the sweep's runs ----------------------
@pytest.mark.slow  # two CLI processes (a driver that failed exits: its lease is then taken over at once)
@pytest.mark.timeout(300)
@pytest.mark.skipif(not IS_ROOT, reason="chattr +i needs root (CI runs as root)")
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_an_optuna_storage_that_turns_read_only_mid_sweep_is_exit_9_and_resume_finishes(tmp_path, sweep_spec,
                                                                                         read_only, kind):
    """Before: a journal was exit 2 (the bad-input code, `failed: Operation not permitted`); SQLite in WAL mode went
    on into its -wal file and ended with exit 0, its main file never holding the sweep. Now: one line, exit 9, the
    trial in flight not charged to its layout, and --resume once it is writable measures each layout once."""
    from tests.sweep_helpers import write_spec

    store = tmp_path / "store"
    store.mkdir()
    path = store / ("optuna.journal" if kind == "journal" else "optuna.db")
    data = sweep_spec("store-refuses", seq_len=128, backend="replay", fixed={}, budget={"n_trials": 5},
                      replay_table=str(ROOT / "tests" / "data" / "replay_small.csv"),
                      storage=f"{kind}:///{path}", tracking_uri="none")
    spec = write_spec(tmp_path / "spec.json", data)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOE_AUTOTUNE_REPLAY_DELAY_S": "0.2"}
    refused = subprocess.run([sys.executable, "-m", "tests.orchestrator.test_environment_faults", "refuse", "3",
                              f"{path},{store}", "sweep", str(spec), "--quiet"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=240)
    lines = refused.stderr.strip().splitlines()
    for locked in (path, store):  # mended before anything is asserted: tmp_path can then be removed
        read_only.mend(locked)
    assert refused.returncode == 9 and len(lines) == 1, refused.stderr[-3000:]
    assert lines[0].startswith(f"error: the Optuna storage {data['storage']} stopped taking writes mid-sweep: "
                               f"'{path}' is immutable (chattr +i)"), lines
    assert "not charged to its layout" in lines[0] and lines[0].endswith("rerun with --resume"), lines
    statuses = _statuses(data)  # trial 2 was in flight: left running or interrupted, never its layout's failure
    assert "error" not in statuses.values() and statuses.get(2) in (None, "interrupted", "running"), statuses
    again = subprocess.run([sys.executable, "-m", "orchestrator.commands.cli", "sweep", str(spec), "--quiet",
                            "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    _measured_once(data)


@pytest.mark.slow  # a real MLflow server (the session's), and `mlflow gc`
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["deleted", "gone for good"])
def test_a_server_store_that_loses_the_sweeps_runs_is_exit_8_and_resume_records_everything(
        tmp_path, sweep_spec, monkeypatch, capsys, mlflow_server, how):
    """The sweep's experiment deleted on the server mid-sweep (in MLflow's trash; or removed by `mlflow gc`, as a
    store wiped): before, every later record was spooled (`must be in the 'active' state`) and the sweep ended with
    exit 3, and its --resume was an internal error (exit 70). Now exit 8 and one line saying what to do."""
    from mlflow import MlflowClient

    name = f"server-lost-{how.split()[0]}-{os.getpid()}"
    data = sweep_spec(name, budget={"n_trials": 6}, tracking_uri=mlflow_server.uri)
    client = MlflowClient(mlflow_server.uri)

    def experiment_id() -> str:
        experiment = client.get_experiment_by_name(name)
        assert experiment is not None, name
        return experiment.experiment_id

    def delete() -> None:
        gone = experiment_id()
        client.delete_experiment(gone)
        if how == "gone for good":
            gc = subprocess.run([str(Path(sys.executable).with_name("mlflow")), "gc", "--backend-store-uri",
                                 f"sqlite:///{mlflow_server.root / 'mlflow-server.db'}", "--experiment-ids",
                                 gone, "--tracking-uri", mlflow_server.uri],
                                capture_output=True, text=True, timeout=120)
            assert gc.returncode == 0, gc.stderr[-2000:]

    _after(monkeypatch, 2, delete)
    code = _sweep(data, tmp_path)
    line = _one_line(capsys)
    assert code == 8 and line.startswith(f"error: the MLflow store {mlflow_server.uri} lost the sweep's runs: "), line
    said = "was deleted; " if how == "deleted" else "no longer exists"
    assert said in line and "kept in the Optuna storage" in line and "--resume" in line, line
    assert "error" not in _statuses(data).values()
    monkeypatch.undo()
    if how == "deleted":  # a resume into the trash says so, then the restored experiment is recorded into
        assert _sweep(data, tmp_path, "--resume") == 8
        assert "mlflow experiments restore --experiment-id" in _one_line(capsys)
        client.restore_experiment(experiment_id())
    assert _sweep(data, tmp_path, "--resume") == 0
    _measured_once(data)


# ---- 4. the pieces -----------------------------------------------------------------------------------
def test_the_probe_names_the_path_and_the_cause(tmp_path, read_only):
    from orchestrator.errors import RunDirectoryError, RunDirectoryFull
    from orchestrator.storage import run_directory

    assert run_directory.probe(tmp_path / "a" / "trial-0000") is None
    assert (tmp_path / "a" / "trial-0000").is_dir() and not list((tmp_path / "a" / "trial-0000").iterdir())
    (tmp_path / "file").write_text("")
    refused = run_directory.probe(tmp_path / "file" / "trial-0001")
    assert refused is not None and "is not a folder (a file stands in its path)" in str(run_directory.failure(refused))
    read_only(tmp_path / "a")
    refused = run_directory.probe(tmp_path / "a" / "trial-0002")
    assert refused is not None
    error = run_directory.failure(refused, 2)
    assert type(error) is RunDirectoryError and error.exit_code == 7
    assert str(error).startswith(f"the run directory cannot be written: '{tmp_path / 'a' / 'trial-0002'}' is ")
    full = run_directory.failure(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x")), 3)
    assert isinstance(full, RunDirectoryFull) and full.exit_code == 4 and "trial 3 was stopped" in str(full)


def test_a_watched_store_knows_when_it_vanished(tmp_path):
    from orchestrator.errors import TrackingLost
    from orchestrator.storage import tracking_store
    from orchestrator.tracking.store_watch import StoreWatch

    path = tmp_path / "m.db"
    store = tracking_store(f"sqlite:///{path}")
    watch = StoreWatch(store)
    watch.opened()
    watch.check()  # not made yet: nothing to compare
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    watch = StoreWatch(store)
    watch.opened()
    watch.check()
    assert watch.identity is not None
    _replace(path)  # deleted and made again at once: its inode is held, so the new file never reuses it
    for _ in range(2):  # and every later write is refused too
        with pytest.raises(TrackingLost, match=re.escape(f"{str(path)!r} was replaced by another file")):
            watch.check()
    watch.release()
    watch = StoreWatch(store)
    watch.opened()
    path.unlink()
    with pytest.raises(TrackingLost, match=re.escape(f"{str(path)!r} was deleted;")):
        watch.check()
    watch.release()
    server = StoreWatch(tracking_store("http://127.0.0.1:1"))  # a server answers for itself (parent_gone)
    server.opened()
    server.check()


def test_each_environment_fault_has_its_own_documented_exit_code():
    from search_spaces.errors import MoeAutotuneError

    from orchestrator import errors

    codes = {c.__name__: c.exit_code for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, MoeAutotuneError)}
    assert codes["RunDirectoryError"] == 7 and codes["TrackingLost"] == 8 and codes["RunDirectoryFull"] == 4
    assert codes["StorageRefused"] == 9
    own = ("RunDirectoryError", "TrackingLost", "StorageRefused")
    others = {code for name, code in codes.items() if name not in own}
    assert 7 not in others and 8 not in others and 9 not in others
    exits = (ROOT / "docs" / "reliability.md").read_text().split("## Exit codes", 1)[1].split("##", 1)[0]
    assert "7 means" in exits and "8 means" in exits and "9 means" in exits, exits
