"""The trainer's step report and the rules it applies itself (trainers/step_watch.py), on one CPU process: no
Megatron, a torch optimizer whose states appear at its first step."""

import argparse
import json

import pytest
import torch

from search_spaces.result import TrialResult

from trainers import step_watch
from trainers.megatron_moe import build_parser


def _args(tmp_path, **changes) -> argparse.Namespace:
    values = {"warmup": 1, "progress": str(tmp_path / "p" / "progress.jsonl"), "stop_within": None,
              "min_measured": 3, "memory_limit_gib": None}
    return argparse.Namespace(**{**values, **changes})


def _watch(args) -> step_watch.StepWatch:
    params = [torch.nn.Parameter(torch.zeros(1024, 1024))]
    return step_watch.StepWatch(args, torch.device("cpu"), torch.optim.Adam(params), tokens_per_step=128, world=1,
                                rank=0, holds_loss=True)


def test_rank_zero_reports_every_step_as_it_goes(tmp_path):
    watch = _watch(_args(tmp_path))
    for step, seconds in enumerate([0.3, 0.2, 0.2]):
        assert not watch.after_step(step, seconds, 0.0, [10.0, 2.0])
    watch.close()
    lines = [json.loads(line) for line in (tmp_path / "p" / "progress.jsonl").read_text().splitlines()]
    assert [(s["step"], s["phase"]) for s in lines] == [(0, "warmup"), (1, "measured"), (2, "measured")]
    assert lines[1]["tokens_per_sec_per_gpu"] == pytest.approx(128 / 0.2) and lines[0]["loss"] == 5.0
    assert all(s["peak_memory_gib"] > 0 for s in lines) and "stop_rule" not in lines[-1]


def test_measured_enough_stops_after_the_minimum_within_the_tolerance(tmp_path):
    watch = _watch(_args(tmp_path, stop_within=0.02, min_measured=3))
    stops = [watch.after_step(step, seconds, 0.0, None) for step, seconds in enumerate([0.5, 0.2, 0.2, 0.2])]
    assert stops == [False, False, False, True]  # the warm-up step, then three measured steps
    assert watch.decision.rule == "measured_enough" and "within ±2.0%" in watch.decision.reason
    result = TrialResult(status="ok", step_times_s=[0.2, 0.2, 0.2])
    step_watch.annotate(result, watch.decision)
    assert result.extra["stop_rule"] == "measured_enough" and result.extra["measured_steps"] == 3
    assert result.extra["step_time_interval_s"] == pytest.approx([0.2, 0.2])


def test_will_not_fit_counts_the_optimizer_states_the_first_step_creates(tmp_path):
    args = _args(tmp_path, memory_limit_gib=1e-6)
    watch = _watch(args)
    assert watch.after_step(0, 0.1, 0.0, None) and watch.decision.rule == "will_not_fit"
    assert watch.decision.figures["predicted_peak_gib"] > 1e-6
    # the states Adam makes at its first step (two moments of 4 MiB) are added to the forward/backward peak
    watch = _watch(_args(tmp_path, memory_limit_gib=1e3))
    watch.optimizer.param_groups[0]["params"][0].grad = torch.zeros(1024, 1024)
    watch.optimizer.step()
    assert not watch.after_step(0, 0.1, schedule_peak_gib=0.0, loss=None)
    added = watch._optimizer_states_gib() - watch._states_gib
    assert added == pytest.approx(8 / 1024, rel=0.01)


def test_without_a_report_or_a_rule_the_steps_run_as_before(tmp_path):
    watch = _watch(_args(tmp_path, progress=None))
    assert not watch.active and not watch.after_step(0, 0.1, 0.0, None) and watch.decision is None


@pytest.mark.parametrize("flags", [["--stop-within", "1.5"], ["--stop-within", "0"], ["--min-measured", "1"],
                                   ["--memory-limit-gib", "-1"], ["--memory-limit-gib", "inf"]])
def test_bad_stopping_flags_are_refused(flags):
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["--model", "tiny-moe", *flags])
    assert refused.value.code == 2
