"""Interruption, then resume: no double count (issue 34).

A sweep stopped at any moment (Ctrl-C, SIGTERM) and resumed, by one driver or by two at once (the second is
refused by the lease), ends with the budget's trials, each layout measured once, and a study and MLflow
experiment `check` finds consistent. The trial the signal interrupted is either finished (recorded once) or
failed as interrupted with its MLflow child closed FAILED; never both re-run and counted, and never listed as
`ok` while it failed.

Two ways to pick "any moment": in-process (the fast lane), Hypothesis chooses the write (an Optuna storage write
or an MLflow call) at which a KeyboardInterrupt is raised, before or after the write lands, and one driver
resumes; across processes (slow: a minute or more a round), a real SIGTERM is sent after a random number of
measured trials plus a random delay, then one driver or two at once resume, round after round.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient

from search_spaces.result import MEASURED_STATUSES

from orchestrator.outputs.check import check
from orchestrator.records import StudyRecord, TrialRecord, queries
from orchestrator.sweep import run_sweep
from orchestrator.sweep.loop import Sweep, _release_what_the_stop_cut_off
from orchestrator.sweep.record import Recorder
from tests.sweep_helpers import direct_writes, make_spec, measured_count, prior_for, spec_data, write_spec

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("moe-autotune"))
FREE = ["tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "recompute"]
# the writes a signal can land beside: every Optuna storage write and every MLflow call that writes
STORAGE_WRITES = ("create_new_trial", "set_trial_param", "set_trial_state_values", "set_trial_user_attr",
                  "set_trial_system_attr", "set_study_user_attr")
MLFLOW_WRITES = ("create_run", "log_batch", "set_tag", "delete_tag", "set_terminated", "update_run", "log_dict",
                 "log_text", "log_artifact")
# in-process examples: few in the fast lane, more in the full profile (tests/conftest.py)
EXAMPLES = max(2, settings.default.max_examples // 30)
# across-process rounds (a minute each on 2 cores): both kinds of resume (one driver, two at once) in the full
# suite, ten or more in a nightly-size profile
SIGTERM_ROUNDS = max(2, settings.default.max_examples // 150)


class _Stop(KeyboardInterrupt):
    """The interruption the test raises (a KeyboardInterrupt, as SIGTERM becomes in `moe-autotune sweep`)."""


@contextmanager
def _interrupt_at(write: int, after: bool) -> Iterator[list[str]]:
    """Raise _Stop at the `write`-th write of a running sweep (counted from its first loop step), before the write
    or once it has landed; yields the names of the writes seen (the last is the one interrupted)."""
    seen: list[str] = []
    armed = [False]
    patches = []

    def wrap(owner, name):
        real = getattr(owner, name)

        def call(*args, **kwargs):
            if not armed[0]:
                return real(*args, **kwargs)
            seen.append(name)
            this = len(seen)  # a write may make others inside it (log_text logs an artifact): counted apart
            if this == write and not after:
                armed[0] = False
                raise _Stop(f"before {name}")
            out = real(*args, **kwargs)
            if this == write:
                armed[0] = False
                raise _Stop(f"after {name}")
            return out
        patches.append((owner, name, real))
        setattr(owner, name, call)

    for name in STORAGE_WRITES:
        wrap(optuna.storages.RDBStorage, name)
    for name in MLFLOW_WRITES:
        wrap(MlflowClient, name)
    real_run = Sweep.run

    def run(self):
        armed[0] = True
        try:
            return real_run(self)
        finally:
            armed[0] = False
    patches.append((Sweep, "run", real_run))
    Sweep.run = run
    try:
        yield seen
    finally:
        for owner, name, real in reversed(patches):
            setattr(owner, name, real)


def assert_counted_once(storage: str, name: str, n_trials: int) -> optuna.Study:
    """The budget and one measurement per layout; `check` (study and MLflow, trial by trial) finds nothing; no
    failed trial stored or listed as measured."""
    study = optuna.load_study(study_name=name, storage=storage)
    _, problems = check(storage, name)
    assert problems == [], problems
    measured = queries.measured_records(study)
    assert len(measured) == n_trials, f"{len(measured)} measured trials, budget {n_trials}"
    twice = {key: n for key, n in Counter(r.run_key for r in measured).items() if n > 1}
    assert not twice, f"layouts measured twice: {twice}"
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    claimed = [(t.number, t.user_attrs.get("status")) for t in failed
               if t.user_attrs.get("status") in set(MEASURED_STATUSES) - {"interrupted"}]
    assert not claimed, f"failed trials stored as measured: {claimed}"
    board = queries.leaderboard(study)
    numbers = {t.number for t in failed}
    listed = board[board["trial"].isin(numbers) & board["status"].isin(set(MEASURED_STATUSES) - {"interrupted"})]
    assert listed.empty, f"failed trials listed as measured by status --csv: {listed[['trial', 'status']]}"
    # a failed trial's child run is closed as failed (not left running, not finished as a measurement)
    runs = MlflowClient(StudyRecord.of(study).tracking_uri).search_runs(
        [study.user_attrs["mlflow_experiment_id"]], "tags.`moe_autotune.role` != 'parent'", max_results=5000)
    by_trial = {int(r.data.tags["optuna_trial_number"]): r for r in runs if "optuna_trial_number" in r.data.tags}
    for t in failed:
        if t.number in by_trial:
            assert by_trial[t.number].info.status == "FAILED", (t.number, by_trial[t.number].info.status)
    return study


# ---- in-process: an interruption at any write, then resume ----------------------------------------------------
@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(900)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(write=st.integers(1, 120), after=st.booleans())  # a sweep of 6 trials makes about 115 such writes
def test_an_interruption_at_any_write_then_resume_counts_each_layout_once(write, after):
    with tempfile.TemporaryDirectory(prefix="interrupt-") as tmp:
        n_trials = 6
        spec = make_spec(Path(tmp), "interrupted", budget={"n_trials": n_trials}, gpus_per_node=8, seq_len=512,
                         free=FREE, track_rejected=True)
        with _interrupt_at(write, after) as seen:
            try:
                run_sweep(spec, prior=prior_for(spec), show_progress=False)
                interrupted = False
            except _Stop:
                interrupted = True
        assert interrupted == (len(seen) >= write), seen[-3:]
        outcome = run_sweep(spec, resume=True, prior=prior_for(spec), show_progress=False)
        assert outcome.exit_code == 0, outcome.messages
        assert_counted_once(spec.storage, spec.name, n_trials)


def _stopped_between_result_and_tell(spec, mark_interrupted: bool = True) -> int:
    """Run `spec` until its third measured trial has stored status ok, then stop it before Optuna is told; when
    not `mark_interrupted` the driver is gone before it can mark the trial (SIGKILL, or its marking write failed).
    Returns the stopped trial's number."""
    real_tell, told = optuna.Study.tell, []

    def tell(self, trial, values=None, state=None, skip_if_finished=False):
        if values is not None and TrialRecord.of(trial).status == "ok":
            told.append(trial.number)
            if len(told) == 3:
                raise _Stop("between the result and the tell")
        return real_tell(self, trial, values, state, skip_if_finished)

    with pytest.MonkeyPatch.context() as patch:
        direct_writes(patch)  # a measured result's contract: stored before its tell (not so an analytic answer)
        patch.setattr(optuna.Study, "tell", tell)
        if not mark_interrupted:
            patch.setattr(Recorder, "interrupted", lambda self, proposals: None)
        with pytest.raises(_Stop):
            run_sweep(spec, prior=prior_for(spec), show_progress=False)
    return told[-1]


def _resume_records_the_result_once(spec, n_trials: int, stopped: int) -> optuna.Study:
    assert run_sweep(spec, resume=True, prior=prior_for(spec), show_progress=False).exit_code == 0
    study = assert_counted_once(spec.storage, spec.name, n_trials)
    retry = [t for t in study.trials if t.user_attrs.get("retry_of") == stopped]
    assert len(retry) == 1 and retry[0].user_attrs.get("measured_result"), "the stored result is recorded, not re-run"
    return study


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_a_trial_stopped_between_its_result_and_its_tell_is_recorded_once_not_listed_ok(tmp_path):
    """The reported case: the signal lands after a trial stored its result and before Optuna was told. Before
    the fix the trial stayed running with status ok, was failed by the resume and re-measured beside it."""
    n_trials = 6
    spec = make_spec(tmp_path, "at-tell", budget={"n_trials": n_trials}, gpus_per_node=8, seq_len=512, free=FREE)
    number = _stopped_between_result_and_tell(spec)
    stopped = optuna.load_study(study_name=spec.name, storage=spec.storage).trials[number]
    assert stopped.state == optuna.trial.TrialState.FAIL and stopped.user_attrs["status"] == "interrupted"
    _resume_records_the_result_once(spec, n_trials, number)


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_a_trial_left_running_with_status_ok_is_stored_as_interrupted_by_the_resume(tmp_path):
    """CI's case: the driver went before it could mark the trial, leaving it running with status ok. The resume
    fails it as interrupted, with the reason, in the storage itself (not only as records read it), and records its
    measured result once in a retry."""
    n_trials = 6
    spec = make_spec(tmp_path, "left-running", budget={"n_trials": n_trials}, gpus_per_node=8, seq_len=512,
                     free=FREE)
    number = _stopped_between_result_and_tell(spec, mark_interrupted=False)
    left = optuna.load_study(study_name=spec.name, storage=spec.storage).trials[number]
    assert left.state == optuna.trial.TrialState.RUNNING and left.user_attrs["status"] == "ok"
    failed = _resume_records_the_result_once(spec, n_trials, number).trials[number]
    assert failed.state == optuna.trial.TrialState.FAIL
    assert failed.user_attrs["status"] == "interrupted" and "driver stopped" in failed.user_attrs["reason"]


def test_an_older_study_with_a_failed_trial_stored_as_ok_lists_it_as_interrupted(tmp_path):
    """A study written before the fix (or by a driver SIGKILLed between result and tell, never resumed): the
    failed trial reads as interrupted everywhere (status --csv, export), whatever status it stored."""
    storage = f"sqlite:///{tmp_path / 'old.db'}"
    study = optuna.create_study(study_name="old", storage=storage, directions=queries.DIRECTIONS)
    trial = study.ask()
    trial.set_user_attr("status", "ok")
    trial.set_user_attr("layout_key", "tp1")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    record = TrialRecord.of(optuna.load_study(study_name="old", storage=storage).trials[0])
    assert record.status == "interrupted" and record.reason
    assert not queries.measured_records(study)


def test_a_write_the_stop_cut_off_does_not_keep_its_lock_from_the_stops_own_writes(tmp_path):
    """Seen under load: a SIGTERMed sweep waited minutes on its own SQLite write lock. The stop landed while a
    write's statement was active; its connection was closed, but SQLite keeps a connection whose statement is not
    finalized (and its lock) while the unwound frames still hold the cursor. The stop path releases it."""
    path = tmp_path / "study.db"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE trials (number INTEGER)")

    def write_cut_off_by_a_stop():
        conn = sqlite3.connect(path, isolation_level=None)
        cursor = conn.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        cursor.execute("INSERT INTO trials VALUES (1) RETURNING number")  # its statement still active
        conn.close()  # as SQLAlchemy closes a connection an error cut off
        raise KeyboardInterrupt("signal 15")

    other = sqlite3.connect(path, timeout=0.2)
    try:
        with pytest.raises(KeyboardInterrupt) as stopped:
            write_cut_off_by_a_stop()
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # the precondition: the lock is still held
            other.execute("INSERT INTO trials VALUES (2)")
        _release_what_the_stop_cut_off(stopped.value)
        other.execute("INSERT INTO trials VALUES (3)")
        other.commit()
        assert [n for (n,) in other.execute("SELECT number FROM trials")] == [3]
    finally:
        other.close()


# ---- across processes: SIGTERM at a random moment, then one or two drivers resume ----------------------------
def _measured(storage: str, name: str) -> int:
    try:
        return measured_count(storage, name)
    except Exception:  # noqa: BLE001 -- locked for a moment
        return 0


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}


def sigterm_then_resume(folder: Path, rng: random.Random, n_trials: int, drivers: int) -> str:
    """One round: a sweep SIGTERMed after a random number of measured trials and a random delay, then `drivers`
    resumes started together; asserts the outcome and returns a line describing the round."""
    folder.mkdir(parents=True)
    data = spec_data(folder, "sigterm", budget={"n_trials": n_trials}, gpus_per_node=8, seq_len=512, free=FREE)
    spec = write_spec(folder / "spec.json", data)
    first = subprocess.Popen([CLI, "sweep", str(spec), "--quiet"], cwd=folder, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    target = rng.randint(1, n_trials - 2)
    deadline = time.monotonic() + 300
    while _measured(data["storage"], data["name"]) < target and first.poll() is None:
        assert time.monotonic() < deadline, "the sweep made no progress"
        time.sleep(0.02)
    time.sleep(rng.random() * 0.4)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode in (0, 130), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    stopped_at = _measured(data["storage"], data["name"])
    argv = [CLI, "sweep", str(spec), "--quiet", "--resume"]
    procs = [subprocess.Popen(argv, cwd=folder, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for _ in range(drivers)]
    outs = [p.communicate(timeout=400)[1] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0] + [2] * (drivers - 1), (codes, [o[-1500:] for o in outs])
    for p, out in zip(procs, outs):
        if p.returncode == 2:  # refused by the lease: one line, nothing written
            assert len(out.strip().splitlines()) == 1 and "being run by" in out, out
    assert_counted_once(data["storage"], data["name"], n_trials)
    return f"stopped at {stopped_at}/{n_trials}, {drivers} driver(s)"


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_sigterm_then_resume_many_times_counts_each_layout_once(tmp_path):
    """Rounds (INTERRUPT_ROUNDS, else SIGTERM_ROUNDS: by the Hypothesis profile), the signal at random moments,
    resumed by one driver or by two at once; the seed is printed so that a failing round can be replayed."""
    seed = int(os.environ.get("INTERRUPT_SEED") or random.randrange(2 ** 32))  # replay a round with it
    rng = random.Random(seed)
    for i in range(int(os.environ.get("INTERRUPT_ROUNDS") or SIGTERM_ROUNDS)):
        line = sigterm_then_resume(tmp_path / f"round-{i}", rng, n_trials=40, drivers=1 + i % 2)
        print(f"seed {seed} round {i}: {line}")


# ---- check: what a double count looks like in MLflow -------------------------------------------------------------
@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_check_reports_a_layout_counted_twice_and_a_child_without_its_trial(tmp_path, capsys):
    from orchestrator.commands.cli import main
    from orchestrator.records import TRIAL_TAG

    spec = make_spec(tmp_path, "doubled", budget={"n_trials": 3}, gpus_per_node=8, seq_len=512, free=FREE)
    assert run_sweep(spec, prior=prior_for(spec), show_progress=False).exit_code == 0
    study = optuna.load_study(study_name=spec.name, storage=spec.storage)
    _, problems = check(spec.storage, spec.name)
    assert problems == []
    context = StudyRecord.of(study)
    client = MlflowClient(spec.tracking_uri)
    parent, experiment = context.mlflow_parent_run_id, context.mlflow_experiment_id
    measured = queries.measured_trials(study)[0]
    original = next(r for r in client.search_runs([experiment], f"tags.`{TRIAL_TAG}` = '{measured.number}'"))
    # the reported case: a failed trial of the same layout whose child run finished as a measurement
    failed = study.ask()
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    twin = client.create_run(experiment, tags={"mlflow.parentRunId": parent, TRIAL_TAG: str(failed.number),
                                               "status": "ok", "fidelity": "full"})
    for key, value in original.data.params.items():
        client.log_param(twin.info.run_id, key, value)
    client.set_terminated(twin.info.run_id, "FINISHED")
    orphan = client.create_run(experiment, tags={"mlflow.parentRunId": parent, "status": "ok"})
    client.set_terminated(orphan.info.run_id, "FINISHED")

    _, problems = check(spec.storage, spec.name)
    assert any("measured by 2 child runs" in p and str(failed.number) in p for p in problems), problems
    assert any(f"trial {failed.number} failed but its child run" in p for p in problems), problems
    assert any(orphan.info.run_id in p and "names no trial" in p for p in problems), problems
    capsys.readouterr()
    assert main(["check", spec.name, "--storage", spec.storage]) == 1
    assert "3 difference(s)" in capsys.readouterr().out
