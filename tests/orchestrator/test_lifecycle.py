"""One trial lifecycle, one vocabulary (issue 56): every view of a sweep counts the same trials in the same states.

A sweep with trials that finish, one that errors and proposals the cost model rejects is read back through the
study summary (what the sweep's last lines and `status` print), Optuna's API, `status --csv`, MLflow (its client) and
`check`: the counts agree, the errored trial's child run is FAILED with its reason, and no rejected proposal is a
child run at all (a row of the parent run's table instead).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st
from mlflow import MlflowClient

from search_spaces.result import STATUSES, TrialResult

from orchestrator.commands.cli import main
from orchestrator.dispatch.analytic import AnalyticBackend
from orchestrator.outputs import report
from orchestrator.records import TrialRecord, lifecycle, queries
from orchestrator.records.trial import PROMOTION_TAG, TRIAL_TAG
from orchestrator.sweep import run_sweep
from orchestrator.tracking.views import trials_view
from tests.sweep_helpers import make_spec, prior_for


def test_every_view_counts_the_same_trials_in_the_same_states(tmp_path, monkeypatch, capsys):
    real = AnalyticBackend._result
    seen: list[int] = []

    def one_errors(est):  # the second trial that runs fails the way a trainer's crash is recorded
        seen.append(1)
        if len(seen) == 2:
            return TrialResult(status="error", error="RuntimeError: injected on rank 1")
        return real(est)

    monkeypatch.setattr(AnalyticBackend, "_result", staticmethod(one_errors))
    # TPE's first proposals are drawn at random over the dimensions: most are illegal, rejected for free
    spec = make_spec(tmp_path, "views", budget={"n_trials": 5}, search="tpe", seed=1)
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    study = out.study
    found = queries.summary(study)
    tally = found.tally.counts
    assert tally[lifecycle.FAILED] == 1 and tally[lifecycle.FINISHED] == 4 and out.n_measured == 5

    # Optuna's API: every trial's state is its lifecycle's; only a measurement has values (none is a made-up 0)
    records = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]
    assert Counter(lifecycle.state_of(r) for r in records) == tally
    assert out.n_infeasible == tally[lifecycle.REJECTED]
    optuna_states = _optuna_states(study.get_trials(deepcopy=False))
    assert optuna_states == {"COMPLETE": tally[lifecycle.FINISHED], "FAIL": tally[lifecycle.FAILED],
                             "REJECTED": tally[lifecycle.REJECTED]}
    assert all(t.values is None for t in study.get_trials(deepcopy=False) if t.state.name != "COMPLETE")

    # the optuna CLI reads the same study from the same URL, and counts the same
    optuna_cli = str(Path(sys.executable).with_name("optuna"))
    listed = subprocess.run([optuna_cli, "trials", "--study-name", spec.name, "--storage", spec.storage, "-f",
                             "json"], capture_output=True, text=True, timeout=120, check=True)
    assert _optuna_states(json.loads(listed.stdout)) == optuna_states

    # the report's summary line says the same
    page = report.write(study, tmp_path / "report", pngs=False, compare_packing=False, importance=False)
    assert f"trials: {found.tally.line()}" in page.html_path.read_text()

    # status --csv: one row per trial judged, its status the record's
    csv = tmp_path / "board.csv"
    assert main(["status", spec.name, "--storage", spec.storage, "--csv", str(csv)]) == 0
    printed = capsys.readouterr().out
    assert found.tally.line() in printed
    board = pd.read_csv(csv)
    by_state = Counter(lifecycle.state_of_status(s if isinstance(s, str) else None) for s in board["status"])
    ran = (lifecycle.FINISHED, lifecycle.FAILED)
    assert {s: by_state[s] for s in ran} == {s: tally[s] for s in ran}

    # MLflow: a child run per trial that ran, in its lifecycle's status; none for a rejected proposal
    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name).experiment_id
    children = [r for r in client.search_runs([experiment]) if TRIAL_TAG in r.data.tags]
    statuses = Counter(r.info.status for r in children)
    assert statuses == {"FINISHED": tally[lifecycle.FINISHED], "FAILED": tally[lifecycle.FAILED]}
    failed = next(r for r in children if r.info.status == "FAILED")
    assert failed.data.tags["status"] == "error" and "injected on rank 1" in failed.data.tags["reason"]
    rejected = {str(r.number) for r in records if lifecycle.state_of(r) == lifecycle.REJECTED}
    assert rejected and not rejected & {r.data.tags[TRIAL_TAG] for r in children}
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.metrics["rejected_by_model"] == sum(1 for r in records if r.status == "infeasible")
    assert {state: parent.data.metrics.get(f"trials_{state}", 0) for state in lifecycle.STATES} == {
        state: tally[state] for state in lifecycle.STATES}
    # an analytic sweep's GPU-hours: what its trials would take, labelled so; until the best, at most all of them
    assert 0 < parent.data.metrics["gpu_hours_to_best"] <= parent.data.metrics["gpu_hours"] == found.spend.gpu_hours
    assert parent.data.tags["gpu_hours"].startswith("predicted")

    # the runs page's saved view lists the trials alone: not the parent run, not a promotion's run
    client.create_run(experiment, run_name="promote-trial-0", tags={PROMOTION_TAG: "0"})
    listed = client.search_runs([experiment], trials_view()["searchFilter"])
    assert {r.info.run_id for r in listed} == {r.info.run_id for r in children}

    assert main(["check", spec.name, "--storage", spec.storage]) == 0


def _optuna_states(trials) -> Counter:
    """Optuna's states of the trials (FrozenTrials, or the `optuna trials -f json` rows), a rejection counted as one:
    PRUNED (the cost model's), or FAIL with no status stored (a discarded repeat)."""
    out: Counter = Counter()
    for t in trials:
        state = t.state.name if hasattr(t, "state") and not isinstance(t, dict) else t["state"]
        status = (t.user_attrs if not isinstance(t, dict) else t.get("user_attrs") or {}).get("status")
        out["REJECTED" if state == "PRUNED" or (state == "FAIL" and status is None) else state] += 1
    return out


@given(st.sampled_from([*STATUSES, None]))
def test_each_status_has_one_state_and_only_a_measurement_is_a_finished_run(status):
    state = lifecycle.state_of_status(status)
    assert state in lifecycle.STATES
    assert (lifecycle.mlflow_status(status) == "FINISHED") == (status == "ok")
    assert (state == lifecycle.REJECTED) == (status in (None, "infeasible"))
