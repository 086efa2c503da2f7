"""Issue 59's parts apart from a running sweep: the spec's `stopping:` section, the trainer's flags it becomes, the
progress file's tail, the step metrics, the intermediate values through the storage, the cannot-win pruner."""

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.dispatch.base import TrialRequest
from orchestrator.dispatch.steps import ProgressTail, StepFeed, parse_step
from orchestrator.dispatch.trainer_process import trainer_argv
from orchestrator.records import TrialRecord
from orchestrator.search.pruning import CannotWinPruner, lower_bound
from orchestrator.spec.schema import parse_spec
from orchestrator.storage import studies
from orchestrator.tracking.runs import step_metrics
from tests.sweep_helpers import write_spec

FITS = {"memory_over_limit_gib": 0.0, "not_measured_ok": 0.0}


def test_the_rules_are_on_by_default_and_each_can_be_switched_off():
    stop = parse_spec({}).stopping
    assert (stop.measured_within, stop.min_measured_steps, stop.cannot_win_margin, stop.will_not_fit) == \
        (0.02, 3, 0.05, True) and stop.memory_limit_gib is None
    off = parse_spec({"stopping": {"measured_within": None, "cannot_win_margin": None, "will_not_fit": False}})
    assert off.stopping.measured_within is None and off.stopping.cannot_win_margin is None


@pytest.mark.parametrize("bad", [{"measured_within": 1.5}, {"measured_within": 0}, {"min_measured_steps": 1},
                                 {"cannot_win_margin": -0.1}, {"memory_limit_gib": 0}, {"will_not_fit": "maybe"},
                                 {"measure_within": 0.02}])
def test_a_bad_stopping_value_is_one_line(bad):
    with pytest.raises(SpecError) as refused:
        parse_spec({"stopping": bad})
    assert "\n" not in str(refused.value) and "stopping" in str(refused.value)


def test_a_bad_stopping_value_exits_2_before_anything_is_made(tmp_path, sweep_spec, capsys):
    from orchestrator.commands.cli import main

    spec = write_spec(tmp_path / "spec.json", sweep_spec("bad-stop", stopping={"min_measured_steps": 0}))
    assert main(["sweep", str(spec), "--quiet"]) == 2
    assert "stopping.min_measured_steps" in capsys.readouterr().err
    assert not (tmp_path / "optuna.db").exists()


def _request(tmp_path: Path, **stop) -> TrialRequest:
    return TrialRequest(layout=Layout(gbs=8, precision="fp32"), model="tiny-moe", seq_len=64, gpu="cpu", num_gpus=1,
                        nodes=1, gpus_per_node=1, steps=8, warmup=1, timeout_s=60, workdir=tmp_path, **stop)


def test_the_trainer_is_told_where_to_report_and_which_rules_to_apply(tmp_path):
    result = tmp_path / "trial-0001" / "result.json"
    argv = trainer_argv(_request(tmp_path, stop_within=0.02, min_measured=4, memory_limit_gib=80.0),
                        "trainers.megatron_moe", "torchrun", result)
    flags = " ".join(argv)
    assert f"--progress {result.parent / 'progress.jsonl'}" in flags
    assert "--stop-within 0.02 --min-measured 4" in flags and "--memory-limit-gib 80" in flags
    argv = trainer_argv(_request(tmp_path), "trainers.megatron_moe", "torchrun", result)
    assert "--progress" in argv and "--stop-within" not in argv and "--memory-limit-gib" not in argv


def test_a_session_asks_the_trainer_for_the_specs_rules(tmp_path, sweep_spec):
    from orchestrator.sweep.session import Session

    spec = parse_spec(sweep_spec("stop-flags", stopping={"measured_within": 0.05, "min_measured_steps": 5}))
    session = Session.__new__(Session)  # the request's fields only: no stores
    session.spec, session.memory_limit_gib = spec, 16.0
    assert session._stopping() == {"stop_within": 0.05, "min_measured": 5, "memory_limit_gib": 16.0}
    session.spec = parse_spec(sweep_spec("stop-flags", stopping={"memory_limit_gib": 0.5}))
    assert session._stopping()["memory_limit_gib"] == 0.5
    session.spec = parse_spec(sweep_spec("stop-flags", stopping={"will_not_fit": False, "measured_within": None}))
    assert session._stopping() == {"stop_within": None, "min_measured": 3, "memory_limit_gib": None}


def _line(step: int, phase: str = "measured", **figures) -> str:
    return json.dumps({"step": step, "phase": phase, "step_time_s": 0.1, **figures}) + "\n"


def test_the_tail_reads_whole_lines_once_and_passes_over_what_is_not_a_step(tmp_path):
    path = tmp_path / "progress.jsonl"
    tail = ProgressTail(path)
    assert tail.read() == []  # not written yet
    path.write_text(_line(0, "warmup") + "not json\n" + '{"step": -1, "phase": "measured"}\n' + _line(1)[:10])
    assert [s["step"] for s in tail.read()] == [0]  # the torn line waits
    with open(path, "a") as fh:
        fh.write(_line(1)[10:] + _line(2))
    assert [s["step"] for s in tail.read()] == [1, 2] and tail.read() == []
    assert parse_step('{"step": true, "phase": "measured"}') is None and parse_step('{"step": 3}') is None


def test_a_feed_hands_each_step_over_once_and_a_stopped_trial_is_pruned_with_its_steps():
    feed = StepFeed()
    feed.put([parse_step(_line(0, "warmup", peak_memory_gib=1.5)), parse_step(_line(1, peak_memory_gib=2.0))])
    assert [s["step"] for s in feed.take()] == [0, 1] and feed.take() == []
    feed.stop("cannot win: because")
    feed.stop("a second reason is not kept")
    result = feed.pruned(wall_time_s=12.0)
    assert (result.status, result.error, result.step_times_s, result.peak_memory_gib) == \
        ("pruned", "cannot win: because", [0.1], 2.0)
    assert result.tokens_per_sec_per_gpu is None and result.extra["stop_rule"] == "cannot_win"


def test_each_step_is_an_mlflow_metric_at_its_trainer_index():
    steps = [parse_step(_line(0, "warmup", loss=5.0)), parse_step(_line(1, loss=float("nan"), peak_memory_gib=1.0))]
    metrics = {(m.key, m.step): m.value for m in step_metrics(steps, 1)}
    assert metrics == {("step/measured", 0): 0.0, ("step/step_time_s", 0): 0.1, ("step/loss", 0): 5.0,
                       ("step/measured", 1): 1.0, ("step/step_time_s", 1): 0.1, ("step/peak_memory_gib", 1): 1.0}


def test_a_study_of_two_objectives_keeps_intermediate_values_through_its_storage():
    study = optuna.create_study(directions=["maximize", "minimize"])
    trial = study.ask()
    with pytest.raises(NotImplementedError):
        trial.report(1.0, 1)  # what Optuna's Trial refuses for two objectives
    stored = studies.running_trial(trial.storage, study, trial.number)
    stored.report(1, 900.0)
    stored.report(2, 950.0)
    assert stored.frozen().intermediate_values == {1: 900.0, 2: 950.0}
    study.tell(trial, state=TrialState.PRUNED)  # two objectives: Optuna keeps no single value for a pruned trial
    assert study.trials[0].state == TrialState.PRUNED and study.trials[0].values is None


def _measured(values, tokens, fidelity="full", **extra):
    result = {"status": "ok", "tokens_per_sec_per_gpu": tokens, "step_time_s": 1.0, "extra": extra}
    return create_trial(values=[tokens, 1.0], intermediate_values=dict(enumerate(values, start=1)),
                        user_attrs=TrialRecord.attrs(status="ok", fidelity=fidelity, result=result), constraints=FITS)


def _running(values, fidelity="full"):
    return create_trial(state=TrialState.RUNNING, intermediate_values=dict(enumerate(values, start=1)),
                        user_attrs=TrialRecord.attrs(fidelity=fidelity))


def test_the_pruner_prunes_a_full_size_trial_that_cannot_reach_the_best_lower_bound():
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.add_trial(_measured([1000.0, 1010.0, 990.0], 1000.0))
    study.add_trial(_measured([3000.0, 3100.0], 3050.0, fidelity="proxy"))  # a proxy's figures are not compared
    pruner = CannotWinPruner(margin=0.05, min_steps=2)
    slow = _running([500.0, 510.0, 490.0])
    assert pruner.prune(study, slow) and pruner.reason(study, slow).endswith("(trial 0)")
    assert not pruner.prune(study, _running([500.0]))  # too few steps for an interval
    assert not pruner.prune(study, _running([960.0, 965.0, 955.0]))  # within the margin of the best
    assert not pruner.prune(study, _running([500.0, 510.0, 490.0], fidelity="proxy"))  # its steps are a proxy's
    assert not CannotWinPruner(margin=0.05, min_steps=4).prune(study, slow)
    assert not pruner.prune(optuna.create_study(directions=["maximize", "minimize"]), slow)  # no best yet


def test_a_best_without_reported_steps_is_bounded_by_its_recorded_interval():
    trial = _measured([], 1000.0, step_time_interval_s=[0.9, 1.25])
    assert lower_bound(trial, TrialRecord.of(trial)) == pytest.approx(800.0)  # tokens/s scale as 1 / step time
    trial = _measured([], 1000.0)
    assert lower_bound(trial, TrialRecord.of(trial)) == 1000.0
