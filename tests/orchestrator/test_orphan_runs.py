"""Issue 58: a driver paused between its fence and an MLflow write can still make that one write after another
driver took the study over: a child run of a trial number that is not its trial's (RUNNING, no params). A later
`--resume` must never fill such an orphan with a trial's record (that counted one layout twice, for good); it
closes it as orphaned, with the reason, and `check` then finds the study and MLflow in agreement."""

from __future__ import annotations

import optuna
import pytest
from mlflow import MlflowClient

from orchestrator.commands.cli import main
from orchestrator.outputs.check import check
from orchestrator.records import StudyRecord, TrialRecord, queries
from orchestrator.tracking.views import SUPERSEDED_TAG, TRIAL_TAG
from tests.sweep_helpers import direct_writes, spec_data, write_spec


def _orphan(data: dict, number: int) -> str:
    """What the paused driver leaves: a run under the sweep's parent, numbered as trial `number`, never finished."""
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    record = StudyRecord.of(study)
    client = MlflowClient(data["tracking_uri"])
    run = client.create_run(record.mlflow_experiment_id, run_name=f"trial-{number}", tags={
        "mlflow.parentRunId": record.mlflow_parent_run_id, TRIAL_TAG: str(number), "status": "running"})
    return run.info.run_id


@pytest.mark.parametrize("writes", ["whole trials", "direct"])
def test_a_resume_closes_an_orphaned_run_and_never_fills_it(tmp_path, monkeypatch, writes):
    if writes == "direct":  # each trial stores its run's id when it starts, as a sweep whose trials run does
        direct_writes(monkeypatch)
    data = spec_data(tmp_path, "orphans", budget={"n_trials": 4})
    spec = write_spec(tmp_path / "spec.json", data)
    assert main(["sweep", str(spec), "--quiet"]) == 0
    study = optuna.load_study(study_name="orphans", storage=data["storage"])
    victim = queries.measured_records(study)[1]
    orphan = _orphan(data, victim.number)
    _, problems = check(data["storage"], "orphans")
    assert f"trial {victim.number} has 2 child runs" in problems  # what the takeover left

    assert main(["sweep", str(spec), "--quiet", "--resume", "--n-trials", "6"]) == 0

    client = MlflowClient(data["tracking_uri"])
    closed = client.get_run(orphan)
    assert closed.info.status == "KILLED" and TRIAL_TAG not in closed.data.tags
    assert closed.data.tags[SUPERSEDED_TAG] == str(victim.number)
    assert closed.data.tags["reason"].startswith("orphaned: made by a driver that had lost the study's lease")
    assert not closed.data.params and not closed.data.metrics  # never filled with the trial's record
    study, problems = check(data["storage"], "orphans")
    assert problems == [], problems
    assert len(queries.measured_records(study)) == 6
    kept = TrialRecord.of(study.trials[victim.number])
    if kept.mlflow_run_id:
        assert client.get_run(kept.mlflow_run_id).info.status == "FINISHED"
