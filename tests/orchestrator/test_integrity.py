"""Nothing lost, doubled, mixed or leaked (issue 15, defects 1-5), with real processes where it matters.

Every sweep here ends with `moe-autotune check`, which compares the Optuna study and MLflow trial by trial.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from mlflow import MlflowClient

from search_spaces.layouts.layout import Layout

from orchestrator.commands.cli import main
from orchestrator.outputs.check import check
from orchestrator.records import TRIAL_TAG, queries
from orchestrator.sweep.spool import ResultSpool
from orchestrator.tracking.tracker import Tracker
from orchestrator.tracking.views import SUPERSEDED_TAG, layout_params
from tests.sweep_helpers import TO_THE_END, direct_writes, measured_count, write_spec

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("moe-autotune"))


def _write(tmp_path: Path, data: dict, name: str = "spec.json") -> Path:
    return write_spec(tmp_path / name, data)


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", **extra}


def _consistent(data: dict) -> optuna.Study:
    study, problems = check(data["storage"], data["name"])
    assert problems == [], problems
    return study




# ---- 1. two drivers on one study ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_second_driver_on_a_running_study_refuses_and_a_dead_ones_lease_is_taken_over(tmp_path, sweep_spec):
    data = sweep_spec("integrity", backend="local", launcher="python", trainer_module="tests.fake_trainer",
                      gpus_per_node=1, budget={"n_trials": 4}, free=["mbs", "recompute"])
    spec = _write(tmp_path, data)
    gate = tmp_path / "hold"  # the first driver's second trial waits while it exists: it cannot finish early
    gate.touch()
    env = _env(FAKE_TRAINER_SECONDS="1", FAKE_TRAINER_HOLD=str(gate))
    first = subprocess.Popen([CLI, "sweep", str(spec), "--quiet"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while measured_count(data["storage"], data["name"]) < 1:
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read().decode()[-2000:]
            time.sleep(0.5)
        second = subprocess.run([CLI, "sweep", str(spec), "--quiet", "--resume"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "being run by" in lines[0], second.stderr
        os.killpg(first.pid, signal.SIGKILL)  # the first driver dies mid-sweep, leaving its lease behind
        first.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        gate.unlink()
    time.sleep(2)  # its Ray processes die with it
    third = subprocess.run([CLI, "sweep", str(spec), "--quiet", "--resume"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=400)
    assert third.returncode == 0, third.stderr[-3000:]
    study = _consistent(data)
    assert len(queries.measured_trials(study)) == 4
    assert study.user_attrs.get("driver_lease") is None  # released at the end


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_resumes_started_together_measure_each_layout_once(tmp_path, sweep_spec):
    data = sweep_spec("integrity", budget={"n_trials": 4})
    spec = _write(tmp_path, data)
    assert main(["sweep", str(spec), "--quiet"]) == 0
    bigger = _write(tmp_path, {**data, "budget": {"n_trials": 30}}, "bigger.json")
    argv = [CLI, "sweep", str(bigger), "--quiet", "--resume"]
    procs = [subprocess.Popen(argv, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    refused = next(err for p, (_, err) in zip(procs, outs) if p.returncode == 2)
    assert len(refused.strip().splitlines()) == 1 and "study 'integrity'" in refused
    study = _consistent(data)
    assert len(queries.measured_trials(study)) == 30


# ---- 2. resume with another situation ---------------------------------------------------------------
@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
def test_resume_refuses_another_situation_and_accepts_another_budget(tmp_path, sweep_spec, capsys):
    data = sweep_spec("integrity", budget={"n_trials": 3})
    assert main(["sweep", str(_write(tmp_path, data)), "--quiet"]) == 0
    for field, value in (("seq_len", 512), ("gpus_per_node", 8), ("gbs", 16), ("backend", "local"),
                         ("model", "tiny-mla-moe")):
        capsys.readouterr()
        assert main(["sweep", str(_write(tmp_path, {**data, field: value}, "other.json")), "--quiet", "--resume"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"different {field}" in err[0], err
    before = len(optuna.load_study(study_name=data["name"], storage=data["storage"]).trials)
    assert len(optuna.load_study(study_name=data["name"], storage=data["storage"]).trials) == before  # untouched
    assert main(["sweep", str(_write(tmp_path, {**data, "budget": {"n_trials": 5}, "seed": 9}, "more.json")),
                 "--quiet", "--resume"]) == 0
    assert len(queries.measured_trials(_consistent(data))) == 5


# ---- 3. a child run belongs to one trial for ever ------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_child_run_of_another_layout_is_superseded_not_reused(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(uri, "owners", tmp_path / "spool.jsonl")
    first.start({}, "owners", resume=False)
    old, new = Layout(tp=2, gbs=8), Layout(pp=2, gbs=8)
    old_run = first.child(7, old, "local")  # a killed driver's run of trial 7
    again = Tracker(uri, "owners", tmp_path / "spool.jsonl")
    again.start({}, "owners", resume=True)
    assert again.child(7, old, "local") == old_run  # same trial, same layout: the run is reused
    new_run = again.child(7, new, "local")
    assert new_run != old_run
    client = MlflowClient(uri)
    superseded = client.get_run(old_run)
    assert TRIAL_TAG not in superseded.data.tags and superseded.data.tags[SUPERSEDED_TAG] == "7"
    assert superseded.data.tags["status"] == "interrupted" and superseded.info.status == "KILLED"
    assert client.get_run(new_run).data.params == layout_params(new)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_then_resume_without_a_seed_keeps_every_run_with_its_own_trial(tmp_path, sweep_spec):
    data = sweep_spec("integrity", seed=None, budget={"n_trials": 120, **TO_THE_END}, track_rejected=True,
                      gpus_per_node=8, seq_len=512, free=["tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "recompute"])
    spec = _write(tmp_path, data)
    proc = subprocess.Popen([CLI, "sweep", str(spec), "--quiet"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 200
    while measured_count(data["storage"], data["name"]) < 20:
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rerun = subprocess.run([CLI, "sweep", str(spec), "--quiet", "--resume"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=400)
    assert rerun.returncode in (0, 1), rerun.stderr[-2000:]
    study = _consistent(data)
    ran = queries.measured_trials(study)
    assert len(ran) <= 120 and len({t.user_attrs["layout_key"] for t in ran}) == len(ran)


# ---- 4. a store that cannot be used is one line, and nothing is created ---------------------------------
def _read_only_dir(tmp_path: Path) -> Path:
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() == 0:  # root writes anywhere: a read-only mount is the honest test
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)]).returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs here")
    else:
        path.chmod(0o555)
    return path


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["bogus scheme", "read-only directory"])
def test_an_unusable_tracking_store_is_one_line_and_leaves_no_study_behind(tmp_path, sweep_spec, capsys, where):
    ro = _read_only_dir(tmp_path) if where == "read-only directory" else None
    try:
        uri = "bogus://x" if ro is None else f"sqlite:///{ro / 'mlflow.db'}"
        data = sweep_spec("integrity", tracking_uri=uri)
        assert main(["sweep", str(_write(tmp_path, data)), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: cannot use the MLflow tracking URI"), err
        assert not Path(data["storage"][len("sqlite:///"):]).exists() or not optuna.get_all_study_summaries(
            data["storage"])
        fixed = {**data, "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
        assert main(["sweep", str(_write(tmp_path, fixed)), "--quiet"]) == 0  # no "already exists"
        _consistent(fixed)
    finally:
        if ro is not None and os.geteuid() == 0:
            subprocess.run(["umount", "--lazy", str(ro)])


# ---- 5. the storage refuses a measured result -----------------------------------------------------------
@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_a_result_the_storage_refuses_is_kept_and_recorded_on_resume_not_run_again(tmp_path, sweep_spec, monkeypatch):
    """The storage fails exactly at the third measured result (a fake failure; the full disk below is real,
    and may land at a proposal instead): the result survives in the spool and --resume records it."""
    direct_writes(monkeypatch)  # a measured result's contract (an analytic trial not stored is asked again)
    data = sweep_spec("integrity")
    spec = _write(tmp_path, data)
    real_tell, told = optuna.Study.tell, []

    def tell(self, trial, values=None, state=None, skip_if_finished=False):
        if values is not None:
            told.append(trial.number if hasattr(trial, "number") else trial)
            if len(told) == 3:
                raise sqlalchemy.exc.OperationalError("UPDATE trials", {}, OSError("database or disk is full"))
        return real_tell(self, trial, values, state, skip_if_finished)

    monkeypatch.setattr(optuna.Study, "tell", tell)
    assert main(["sweep", str(spec), "--quiet"]) == 4
    monkeypatch.setattr(optuna.Study, "tell", real_tell)
    kept = ResultSpool(tmp_path / "runs" / "integrity" / "results-spool.jsonl").records()
    assert list(kept) == [told[2]]
    measured = kept[told[2]].result
    assert measured.status == "ok" and measured.tokens_per_sec_per_gpu > 0

    assert main(["sweep", str(spec), "--quiet", "--resume"]) == 0
    study = _consistent(data)
    assert len(queries.measured_trials(study)) == 6
    recorded = [t for t in study.trials if t.user_attrs.get("measured_result")]
    assert [t.user_attrs["retry_of"] for t in recorded] == [told[2]]
    assert recorded[0].values[0] == pytest.approx(measured.tokens_per_sec_per_gpu)
    assert not ResultSpool(tmp_path / "runs" / "integrity" / "results-spool.jsonl").path.exists()


# ---- 6. the storage's disk fills up ---------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_a_full_disk_is_one_line_keeps_what_was_measured_and_resume_finishes(tmp_path, sweep_spec):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        data = sweep_spec("integrity", storage=f"sqlite:///{disk / 'optuna.db'}", gpus_per_node=8, seq_len=512,
                          budget={"n_trials": 150, **TO_THE_END},
                          free=["tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "recompute"])
        spec = _write(tmp_path, data)
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (15 * 2 ** 20 + 200 * 1024))  # leaves room for some dozens of trials
        full = subprocess.run([CLI, "sweep", str(spec), "--quiet"], cwd=tmp_path, env=_env(),
                              capture_output=True, text=True, timeout=300)
        assert full.returncode == 4, full.stderr[-3000:]
        lines = full.stderr.strip().splitlines()
        assert len(lines) == 1 and "tmpfs" in lines[0], lines
        assert lines[0].startswith("error: the Optuna storage's disk is full"), lines
        assert "Traceback" not in full.stderr and "max length" not in full.stderr
        stored = measured_count(data["storage"], data["name"])
        assert 0 < stored < 150
        # the disk may fill at a proposal (nothing measured in flight, an empty spool) or at a result (kept)
        kept = ResultSpool(tmp_path / "runs" / "integrity" / "results-spool.jsonl").records()
        filler.unlink()  # space is freed
        again = subprocess.run([CLI, "sweep", str(spec), "--quiet", "--resume"], cwd=tmp_path, env=_env(),
                               capture_output=True, text=True, timeout=400)
        assert again.returncode == 0, again.stderr[-3000:]
        study = _consistent(data)
        assert len(queries.measured_trials(study)) == 150
        recorded = [t for t in study.trials if t.user_attrs.get("measured_result")]
        assert {t.user_attrs["retry_of"] for t in recorded} == set(kept)  # not re-run
    finally:
        subprocess.run(["umount", "--lazy", str(disk)])  # lazy: a lingering child must not keep it mounted
