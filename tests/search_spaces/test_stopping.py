"""The statistics of the rules that stop a trial early (search_spaces/stopping.py)."""

import math
import statistics

import pytest

from search_spaces import stopping
from search_spaces.result import STATUSES


def test_each_rule_is_declared_once_with_a_status_a_trial_can_have_and_a_reason():
    names = [rule.name for rule in stopping.STOP_RULES]
    assert names == [stopping.MEASURED_ENOUGH, stopping.CANNOT_WIN, stopping.WILL_NOT_FIT]
    for rule in stopping.STOP_RULES:
        assert rule.status in STATUSES and rule.reason and rule.applied_by
    assert stopping.BY_RULE[stopping.CANNOT_WIN].status == "pruned"


def test_t_quantiles_are_students_and_approach_the_normal():
    assert stopping.t95(1) == 12.706 and stopping.t95(2) == 4.303 and stopping.t95(30) == 2.042
    assert stopping.t95(60) == pytest.approx(2.000, abs=0.002) and stopping.t95(120) == pytest.approx(1.980, abs=0.002)
    assert all(stopping.t95(df) > stopping.t95(df + 1) for df in range(1, 200))
    with pytest.raises(ValueError):
        stopping.t95(0)


def test_the_interval_is_the_t_interval_of_the_mean():
    values = [1.0, 1.1, 0.9, 1.05]
    found = stopping.interval(values)
    half = 3.182 * statistics.stdev(values) / 2
    assert found.mean == pytest.approx(1.0125) and found.half_width == pytest.approx(half) and found.n == 4
    assert found.low == pytest.approx(1.0125 - half) and found.relative == pytest.approx(half / 1.0125)
    assert stopping.interval([1.0]) is None and stopping.interval([1.0, math.nan]) is None
    assert stopping.interval([2.0, 2.0]).half_width == 0.0


def test_measured_enough_waits_for_its_minimum_then_for_the_tolerance():
    steady = [0.100, 0.1005, 0.0995, 0.100, 0.100]  # ±1.2% after three steps (t = 4.303)
    assert stopping.measured_enough(steady[:2], within=0.02, min_steps=3) is None  # too few
    assert stopping.measured_enough(steady[:3], within=0.02, min_steps=3) is not None
    noisy = [0.1, 0.15, 0.08, 0.13]
    assert stopping.measured_enough(noisy, within=0.02, min_steps=3) is None
    assert stopping.measured_enough(noisy, within=0.9, min_steps=3) is not None  # a huge tolerance: at the minimum
    assert stopping.measured_enough(steady, within=0.5, min_steps=1) is not None  # never from fewer than two


def test_cannot_win_needs_its_upper_bound_below_the_best_lower_bound_by_the_margin():
    slow = [500.0, 510.0, 490.0]  # upper bound ~525
    assert stopping.cannot_win(slow, best_low=1000.0, margin=0.05, min_steps=2).startswith("cannot win")
    assert stopping.cannot_win(slow, best_low=540.0, margin=0.05, min_steps=2) is None  # within the margin
    assert stopping.cannot_win(slow[:1], best_low=1e9, margin=0.0, min_steps=1) is None  # one step: no interval
    assert stopping.cannot_win(slow, best_low=1e9, margin=0.0, min_steps=4) is None  # before its minimum
    assert stopping.cannot_win(slow, best_low=0.0, margin=0.0, min_steps=2) is None  # no best yet


def test_the_next_step_holds_the_optimizer_states_the_first_step_made():
    # forward and backward peaked at 10 GiB before the optimizer step made 4 GiB of states: the next step holds both
    assert stopping.extrapolated_peak(12.0, schedule_peak_gib=10.0, added_states_gib=4.0) == 14.0
    assert stopping.extrapolated_peak(12.0, schedule_peak_gib=10.0, added_states_gib=0.0) == 12.0
    assert stopping.will_not_fit(14.0, limit_gib=80.0) is None
    assert stopping.will_not_fit(81.0, limit_gib=80.0).startswith("will not fit")
