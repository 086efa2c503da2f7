"""Issue 59: the real trainer on a CPU rank through Ray reports each step (MLflow `step/` metrics, Optuna intermediate
values), and each rule that stops a trial early (search_spaces/stopping.py) stops one: measured enough (the trainer),
cannot win (the sweep's pruner: forced here by a best lower bound no trial reaches), will not fit (the trainer, held
to a memory limit below what any rank uses)."""

import psutil
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from orchestrator.records import TrialRecord, lifecycle, queries
from orchestrator.search import pruning
from orchestrator.spec.schema import parse_spec
from orchestrator.sweep import run_sweep
from tests.sweep_helpers import prior_for

# one CPU rank per trial, a short sequence, up to 8 measured steps after one warm-up step
REAL = {"backend": "ray", "gpus_per_node": 1, "seq_len": 64, "gbs": 2, "free": ["mbs"], "fixed": {"precision": "fp32"},
        "steps": 8, "warmup": 1, "trial_timeout_s": 300, "budget": {"n_trials": 1}, "seed": 1}


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if any(text in part for part in proc.cmdline()):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _check(spec) -> int:
    """`moe-autotune check`: the study and MLflow agree, trial by trial."""
    from orchestrator.commands.cli import main

    return main(["check", spec.name, "--storage", spec.storage, "--tracking-uri", spec.tracking_uri])


def _one_trial(spec):
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    [trial] = queries.measured_trials(out.study)
    return out, trial, TrialRecord.of(trial), MlflowClient(spec.tracking_uri)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_step_is_reported_and_the_trainer_stops_once_measured_enough(sweep_spec, monkeypatch):
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    # a tolerance any few steps meet: the trainer stops soon after the minimum of 4 measured steps
    spec = parse_spec(sweep_spec("steps-enough", REAL, stopping={"measured_within": 0.99, "min_measured_steps": 4,
                                                                 "cannot_win_margin": None}))
    out, trial, record, client = _one_trial(spec)
    assert out.exit_code == 0 and record.status == "ok" and trial.state == TrialState.COMPLETE
    measured = len(record.result.step_times_s)
    assert record.stop_rule == "measured_enough" and 4 <= measured < spec.steps
    assert record.extra["measured_steps"] == measured and len(record.extra["step_time_interval_s"]) == 2
    # Optuna: each measured step's tokens/s/GPU at the trainer's step index (after the warm-up step)
    assert sorted(trial.intermediate_values) == list(range(1, 1 + measured))
    run = client.get_run(record.mlflow_run_id)
    assert run.data.tags["stop_rule"] == "measured_enough" and run.data.tags["reason"].startswith("measured enough")
    # MLflow: every step the trainer ran (the warm-up one too), as it ran
    for key in ("step/step_time_s", "step/tokens_per_sec_per_gpu", "step/peak_memory_gib", "step/loss"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == list(range(1 + measured))
    assert [m.value for m in sorted(client.get_metric_history(run.info.run_id, "step/measured"),
                                    key=lambda m: m.step)] == [0.0] + [1.0] * measured
    assert _check(spec) == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trial_that_cannot_win_is_pruned_and_its_process_stopped(sweep_spec, monkeypatch):
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    monkeypatch.setattr(pruning, "best_lower_bound", lambda study, other_than: (-1, 1e12))  # a best none can beat
    monkeypatch.setenv("MOE_AUTOTUNE_FAULT", "slow@3:120")  # from its third measured step on, it would take minutes
    spec = parse_spec(sweep_spec("steps-prune", REAL, stopping={"measured_within": None, "min_measured_steps": 2}))
    out, trial, record, client = _one_trial(spec)
    assert trial.state == TrialState.PRUNED and record.status == "pruned" and record.stop_rule == "cannot_win"
    assert lifecycle.state_of(record) == lifecycle.PRUNED and out.summary.tally.counts[lifecycle.PRUNED] == 1
    assert record.reason.startswith("cannot win") and record.tokens_per_sec_per_gpu is None  # no measurement
    assert out.best is None and out.exit_code == 1
    assert len(trial.intermediate_values) >= 2 and record.gpu_seconds[0] > 0
    run = client.get_run(record.mlflow_run_id)
    assert run.info.status == "KILLED" and run.data.tags["stop_rule"] == "cannot_win"
    assert run.data.tags["status"] == "pruned" and run.data.tags["reason"].startswith("cannot win")
    assert len(client.get_metric_history(run.info.run_id, "step/step_time_s")) >= 3
    assert _processes_mentioning(spec.workdir) == [], "the pruned trial's trainer outlived its stop"
    assert _check(spec) == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trial_that_will_not_fit_is_stopped_before_its_oom(sweep_spec, monkeypatch):
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    spec = parse_spec(sweep_spec("steps-oom", REAL, stopping={"memory_limit_gib": 0.05}))  # below any rank's memory
    out, trial, record, client = _one_trial(spec)
    assert record.status == "oom" and record.stop_rule == "will_not_fit" and trial.state == TrialState.FAIL
    assert record.failure_class == "oom" and record.reason.startswith("will not fit")
    assert record.peak_memory_gib > 0.05 and record.extra["memory_limit_gib"] == 0.05
    assert record.extra["steps_run"] == 1 and not record.result.step_times_s  # stopped after its first step
    run = client.get_run(record.mlflow_run_id)
    assert run.info.status == "FAILED" and run.data.tags["stop_rule"] == "will_not_fit"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "step/peak_memory_gib")] == [0]
    assert _check(spec) == 0
