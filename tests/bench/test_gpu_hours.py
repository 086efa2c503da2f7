"""bench/gpu_hours.py's accounting on a tiny landscape whose answer is known: five tiny-moe layouts, truths set by
hand (well apart, so the 2% run noise cannot reorder them). The grid finds the optimum at its known position and is
charged the trials up to it; a patience rule stops where it should; the per-trial rules stop a trial where the spec
says; a pruned trial is never the winner."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import gpu_hours as gh
from bench import search_efficiency as se
from orchestrator.search.samplers import nemo_grid_order

QUIET = (0.0, np.zeros(gh.MEASURED))  # no run noise, no step noise
JITTER = (0.0, np.array([0.1, -0.1] * (gh.MEASURED // 2)))  # steps 10% apart: never measured enough


@pytest.fixture(scope="module")
def land() -> se.Landscape:
    case = se.Case("tiny-moe", "cpu", 4, 128, {"precision": "fp32", "dispatcher": "alltoall"})
    landscape = se.build_landscape(case, cap=5)
    assert len(landscape.layouts) == 5 and (landscape.pred_memory <= landscape.limit_gib).all()
    return landscape


def grid_order(land: se.Landscape) -> list[int]:
    position = {k: i for i, k in enumerate(land.keys)}
    return [position[lay.key()] for lay in nemo_grid_order(land.layouts)]


def truth_in_grid_order(land: se.Landscape, tokens: list[float], fits: list[bool] | None = None) -> se.Truth:
    """A truth whose true tokens/s/GPU, listed in the grid's order, are `tokens`."""
    values = np.zeros(len(land.layouts))
    values[grid_order(land)] = tokens
    fit = np.ones(len(values), dtype=bool)
    if fits is not None:
        fit[grid_order(land)] = fits
    return se.Truth(values, land.pred_memory.copy(), fit, se.TARGET * float(values[fit].max()),
                    np.random.default_rng(0))


def grid_sweep(land: se.Landscape, truth: se.Truth, rules: bool = False) -> list[gh.TrialRun]:
    plan = gh.Plan(search="grid", rules_of_thumb=False, rules=rules)
    return gh.sweep(land, truth, 0, plan, gh.charger(land))


def test_a_trial_is_charged_start_up_plus_its_steps_of_its_step_time_on_every_gpu(land):
    truth = truth_in_grid_order(land, [100, 200, 1000, 150, 300])
    case, i = land.case, grid_order(land)[2]
    step_s = land.layouts[i].gbs * case.seq_len / (1000 * case.num_gpus)
    assert gh.charger(land)(truth, i, 20) == pytest.approx(case.num_gpus * (se.STARTUP_S + 20 * step_s) / 3600)
    assert gh.charger(land)(truth, i, 5) == pytest.approx(case.num_gpus * (se.STARTUP_S + 5 * step_s) / 3600)


def test_the_grid_finds_the_optimum_at_its_position_and_is_charged_the_trials_up_to_it(land):
    truth = truth_in_grid_order(land, [100, 200, 1000, 150, 300])
    runs = grid_sweep(land, truth)
    assert [r.index for r in runs] == grid_order(land)  # NeMo's order, every layout once, then nothing left
    assert all(r.steps == gh.WARMUP + gh.MEASURED for r in runs)
    charge = gh.charger(land)
    got = gh.outcome(runs, truth.target)
    assert got.reached == 3
    assert got.hours_to_reach == pytest.approx(sum(charge(truth, r.index, 20) for r in runs[:3]))
    assert got.spent == pytest.approx(sum(r.hours for r in runs)) and got.trials == 5
    assert not got.wrong
    early = gh.outcome(runs[:gh.fixed(2)(runs)], truth.target)  # n_trials 2: stops before the optimum
    assert early.reached is None and math.isinf(early.hours_to_reach) and early.wrong and early.trials == 2


def test_stopping_after_n_without_improvement_stops_where_expected(land):
    truth = truth_in_grid_order(land, [300, 200, 100, 1000, 50])
    runs = grid_sweep(land, truth)
    assert gh.patience(2, 60)(runs) == 3  # trials 2 and 3 bring no new best
    impatient = gh.outcome(runs[:3], truth.target)
    assert impatient.wrong and impatient.reached is None
    assert impatient.spent == pytest.approx(sum(r.hours for r in runs[:3]))
    assert gh.patience(3, 60)(runs) == 5  # trial 4 is a new best: runs to the end of the table
    assert gh.outcome(runs, truth.target).reached == 4
    assert gh.patience(3, 4)(runs) == 4  # the budget still caps it


def test_convergence_stops_after_the_first_trial_below_the_bound():
    runs = [gh.TrialRun(k, "ok", 1.0, 1.0, 1.0, 20, chance) for k, chance in enumerate([None, 0.5, 0.04, 0.01])]
    assert gh.converged(0.05, 60, min_trials=1)(runs) == 3
    assert gh.converged(0.01, 60, min_trials=1)(runs) == 4  # never below: the budget or the end
    assert gh.converged(0.05, 2, min_trials=1)(runs) == 2
    # as the sweep: not before its Convergence.MIN_TRIALS-th trial
    more = runs + [gh.TrialRun(k, "ok", 1.0, 1.0, 1.0, 20, 0.5) for k in range(4, 6)] + [runs[2]]
    assert gh.Convergence.MIN_TRIALS == 5 and gh.converged(0.05, 60)(more) == 7


def test_the_stop_rules_decide_a_trial_where_the_spec_says(land):
    truth = truth_in_grid_order(land, [100, 200, 1000, 150, 300], fits=[True, True, True, True, False])
    low, best, oom = grid_order(land)[0], grid_order(land)[2], grid_order(land)[4]
    enough = gh.measure(truth, best, 0, True, 0.0, QUIET)  # steps alike: measured enough after the minimum
    assert (enough.status, enough.steps) == ("ok", gh.WARMUP + gh.STOPPING.min_measured_steps)
    assert enough.figure == pytest.approx(1000)
    pruned = gh.measure(truth, low, 0, True, 900.0, JITTER)  # 10x slower than the best's lower bound
    assert (pruned.status, pruned.figure, pruned.steps) == ("pruned", None, gh.WARMUP + gh.STOPPING.min_measured_steps)
    kept = gh.measure(truth, best, 0, True, 900.0, JITTER)  # noisy but it may win: every step runs
    assert (kept.status, kept.steps) == ("ok", gh.WARMUP + gh.MEASURED)
    assert gh.measure(truth, best, 0, False, 0.0, QUIET).steps == gh.WARMUP + gh.MEASURED  # rules off
    assert gh.measure(truth, oom, 0, True, 0.0).steps == 1  # an OOM: start-up and one step


def test_a_pruned_trial_is_never_the_winner_and_a_noisy_winner_is_a_wrong_stop():
    best = gh.TrialRun(0, "ok", 990.0, 1000.0, 1.0, 20, None)
    pruned = gh.TrialRun(1, "pruned", None, 2000.0, 0.5, 5, None)
    lucky = gh.TrialRun(2, "ok", 1010.0, 900.0, 1.0, 20, None)  # measured above the best, truly 10% worse
    assert gh.outcome([pruned, best], 1960.0).wrong  # the pruned optimum is no answer: the winner is the other
    got = gh.outcome([best, lucky], 980.0)
    assert got.reached == 1 and got.wrong  # it was within 2%, then a noisy figure took the lead


def test_with_the_rules_the_grid_charges_fewer_steps_and_still_finds_the_optimum(land):
    truth = truth_in_grid_order(land, [100, 200, 1000, 150, 300])
    plain, ruled = grid_sweep(land, truth), grid_sweep(land, truth, rules=True)
    assert [r.index for r in ruled] == [r.index for r in plain]  # the grid's order does not listen
    assert gh.outcome(ruled, truth.target).reached == 3
    assert all(r.steps < gh.WARMUP + gh.MEASURED for r in ruled)  # 2% step noise: measured enough early
    # far below the optimum once it is measured: measured enough or pruned at the first step a rule may decide
    assert all(r.steps == gh.WARMUP + gh.STOPPING.min_measured_steps for r in ruled[3:])
    assert gh.outcome(ruled, truth.target).spent < gh.outcome(plain, truth.target).spent


def test_the_winner_is_the_sweeps_answer_when_its_search_names_one():
    """Issue 59: a calibrated sweep stores the layout its search believes fastest as its answer
    (orchestrator/sweep/loop.py _record_answer), not the luckiest measured figure; the outcome follows it."""
    best = gh.TrialRun(0, "ok", 990.0, 1000.0, 1.0, 20, None, answer=1000.0)
    lucky = gh.TrialRun(2, "ok", 1010.0, 900.0, 1.0, 20, None, answer=1000.0)  # measured above, not believed
    got = gh.outcome([best, lucky], 980.0)
    assert got.reached == 1 and not got.wrong
    misled = gh.TrialRun(2, "ok", 1010.0, 900.0, 1.0, 20, None, answer=900.0)
    assert gh.outcome([best, misled], 980.0).wrong


def test_deepspeed_as_right_as_the_candidate_is_the_smallest_patience_that_stops_wrong_no_more_often():
    case = se.Case("tiny-moe", "cpu", 4, 128, {"precision": "fp32", "dispatcher": "alltoall"})
    row = gh.run_case(case, seeds=2, cap=5)
    strategies, outcomes = row["strategies"], row["outcomes"]
    as_right = strategies[gh.AS_RIGHT]
    assert as_right["wrong_stops"] <= strategies[gh.CANDIDATE]["wrong_stops"]
    assert as_right["n"] == gh.AS_RIGHT_N[0]  # five layouts: a patience of 8 sees them all, never wrong
    assert len(outcomes[gh.AS_RIGHT]) == 2 and all(o.trials == 5 for o in outcomes[gh.AS_RIGHT])
    assert gh.targets(row)["beats_as_right"] == (strategies[gh.CANDIDATE]["spent_median"] < as_right["spent_median"])
