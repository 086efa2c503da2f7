"""SIGKILL the orchestrator mid-sweep, --resume, and find exactly n_trials trials, one MLflow child each."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient

from orchestrator.records import queries
from tests.sweep_helpers import FAKE_TRAINER, spec_data

ROOT = Path(__file__).resolve().parents[2]


def _count_measured(storage: str, name: str) -> int:
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except Exception:  # noqa: BLE001 -- not created yet
        return 0
    return len(queries.measured_trials(study))


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sigkill_then_resume_finishes_exactly_n_trials(tmp_path):
    n_trials = 5
    spec = spec_data(tmp_path, "resume-me", **FAKE_TRAINER, gpus_per_node=2, seq_len=128,
                     budget={"n_trials": n_trials}, seed=11)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "FAKE_TRAINER_SECONDS": "3", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "tests.sweep_runner", str(spec_path)]
    log = open(tmp_path / "first.log", "wb")
    first = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while _count_measured(spec["storage"], spec["name"]) < 2:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first sweep made no progress"
            time.sleep(0.5)
        time.sleep(1.0)  # most likely inside a running trial now
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        try:  # Ray's own processes of the dead driver: do not leave them on a shared machine
            time.sleep(2)
            os.killpg(first.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
    killed_at = _count_measured(spec["storage"], spec["name"])
    assert 2 <= killed_at < n_trials

    second = subprocess.run([*argv, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]

    study = optuna.load_study(study_name=spec["name"], storage=spec["storage"])
    ran = queries.measured_trials(study)
    assert len(ran) == n_trials
    keys = [t.user_attrs["layout_key"] for t in ran]
    assert len(set(keys)) == n_trials, "a layout was measured twice"
    client = MlflowClient(spec["tracking_uri"])
    exp = client.get_experiment_by_name(spec["name"])
    parents = client.search_runs([exp.experiment_id], "tags.`moe_autotune.role` = 'parent'")
    assert len(parents) == 1, "resume must reuse the parent run"
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'",
                                  max_results=1000)
    per_trial = Counter(r.data.tags["optuna_trial_number"] for r in children)
    for t in queries.finished_trials(study):
        assert per_trial[str(t.number)] == 1, f"trial {t.number} has {per_trial[str(t.number)]} child runs"
    finished_ids = {r.data.tags["optuna_trial_number"]: r for r in children}
    for t in ran:
        assert finished_ids[str(t.number)].info.status == "FINISHED"
    retried = {r.user_attrs.get("retry_of") for r in study.trials if r.user_attrs.get("proposed_by") == "resume"}
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL and t.number in retried]
    assert failed, "the kill should have caught a trial while it ran"
    for t in failed:  # the interrupted trial was re-proposed and its run marked failed
        if str(t.number) in finished_ids:
            assert finished_ids[str(t.number)].info.status == "FAILED"
