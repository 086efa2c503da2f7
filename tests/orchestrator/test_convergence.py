"""A sweep that stops once it has converged (issue 59, item 3): with `budget.converge_below`, the calibrated search
stops proposing when the chance (its posterior over the cost model's per-value corrections) that a layout not yet
measured beats the best measured one by more than `converge_margin` falls below the bound, and says so."""

from __future__ import annotations

import json
import math

from mlflow import MlflowClient

from orchestrator.records import StudyRecord, queries
from orchestrator.search.calibrated import CalibratedSearch
from orchestrator.storage import studies
from orchestrator.sweep import run_sweep
from tests.sweep_helpers import make_spec, prior_for


def test_a_converged_sweep_stops_early_with_the_same_best_and_says_why(tmp_path):
    (tmp_path / "all").mkdir()
    (tmp_path / "conv").mkdir()
    # the analytic backend has no run noise, the search assumes 3%: its chance falls slowly (a bound of 0.2 here)
    ran_out = run_sweep(make_spec(tmp_path / "all", "all", budget={"n_trials": 60, "converge_below": None},
                                  tracking_uri="none"), show_progress=False)
    spec = make_spec(tmp_path / "conv", "conv", budget={"n_trials": 60, "converge_below": 0.2})
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert ran_out.n_measured == 60 and not any(m.startswith("converged") for m in ran_out.messages)
    assert StudyRecord.of(ran_out.study).stopped == "budget.n_trials (60) reached"  # convergence off: no chance
    assert not any("n_trials" in m for m in ran_out.messages)
    assert out.n_measured < 60
    reason = next(m for m in out.messages if m.startswith("converged: P(a layout beats the answer by > 2%) = "))
    assert f"after {out.n_measured} trials" in reason
    assert queries.summary(out.study).best.values[0] >= 0.98 * queries.summary(ran_out.study).best.values[0]
    # the answer the sweep stored (the calibrated search's belief) is the best every view reads
    assert StudyRecord.of(out.study).answer == queries.summary(out.study).best.number
    client = MlflowClient(spec.tracking_uri)  # the parent run's summary says why it stopped
    summary = json.loads(client.download_artifacts(out.study.user_attrs["mlflow_parent_run_id"], "summary.json",
                                                   str(tmp_path)) and (tmp_path / "summary.json").read_text())
    assert reason in summary["notes"]
    assert StudyRecord.of(out.study).stopped == reason  # `status` and the report read it there


def test_convergence_is_on_by_default_and_a_sweep_at_its_ceiling_says_how_likely_a_better_layout_is(tmp_path, capsys):
    """Issue 59: the spec's default converges (budget.converge_below 0.05); a sweep whose n_trials come first says the
    chance that remains, `status` and the report say why it stopped, and --resume with more trials goes on."""
    from orchestrator.commands.cli import main
    from orchestrator.outputs.report.page import headline
    from orchestrator.outputs.winner import views
    from tests.sweep_helpers import spec_data, write_spec

    data = spec_data(tmp_path, "ceiling", budget={"n_trials": 4})
    assert "converge_below" not in data["budget"]  # the default
    spec = write_spec(tmp_path / "spec.json", data)
    assert main(["sweep", str(spec), "--quiet"]) == 0
    said = capsys.readouterr()
    printed = " ".join(said.out.split())  # rich may wrap the line
    assert "stopped: budget.n_trials (4) reached before converging: P(a layout beats the answer by > 2%) = " in printed
    assert "n_trials" not in said.err  # news, not a warning
    study = studies.load_study(data["storage"], "ceiling")
    stopped = StudyRecord.of(study).stopped or ""
    chance = float(stopped.split(" = ")[1].split(",")[0])
    assert 0.05 <= chance <= 1.0 and f"stopped: {stopped}" in printed
    assert main(["status", "ceiling", "--storage", data["storage"]]) == 0
    assert f"stopped: {stopped}" in " ".join(capsys.readouterr().out.split())  # rich may wrap the line
    assert f"It stopped: {stopped}." in headline(study, views(study), None)
    assert main(["sweep", str(spec), "--quiet", "--resume", "--n-trials", "6"]) == 0
    again = studies.load_study(data["storage"], "ceiling")
    assert queries.summary(again).measured == 6
    assert (StudyRecord.of(again).stopped or "").startswith(("budget.n_trials (6) reached", "converged: "))


def test_the_chance_of_better_falls_as_the_search_measures_and_is_zero_with_nothing_left(tmp_path):
    spec = make_spec(tmp_path, "chance")
    search = CalibratedSearch.from_prior(prior_for(spec), seed=0)
    best = max(search.predicted(lay) or 0.0 for lay in search.layouts)
    before = search.chance_of_better(set(), best, 0.02)
    for lay in search.layouts[:30]:
        search.observe(lay, "ok", search.predicted(lay), None)  # measured as predicted
    after = search.chance_of_better({lay.key() for lay in search.layouts[:30]}, best, 0.02)
    assert 0.0 <= after <= before <= 1.0
    fresh = CalibratedSearch.from_prior(prior_for(spec), seed=0)  # nothing measured, nothing left to try
    assert fresh.chance_of_better({lay.key() for lay in fresh.layouts}, best, 0.02) == 0.0


def test_the_answer_is_what_the_search_believes_not_the_luckiest_run(tmp_path):
    """Issue 59: at 2% run noise the best measured figure is often a slower layout's lucky run. The search's answer
    is the measured layout it believes fastest: its figure shrunk toward what the model (corrected by every other
    measurement) expects of it."""
    spec = make_spec(tmp_path, "answer")
    search = CalibratedSearch.from_prior(prior_for(spec), seed=0)
    ranked = sorted(search.layouts, key=lambda lay: -(search.predicted(lay) or 0.0))
    top = search.predicted(ranked[0]) or 0.0
    fastest = [lay for lay in ranked if (search.predicted(lay) or 0) >= 0.999 * top]  # tied
    slower = next(lay for lay in ranked if 0.92 * top < (search.predicted(lay) or 0) < 0.94 * top)
    for lay in [lay for lay in ranked if lay != slower][:20]:  # measured as predicted: the model is right
        search.observe(lay, "ok", search.predicted(lay), None)
    assert search.answer() in fastest
    search.observe(slower, "ok", 1.01 * top, None)  # a run 7-10% above what it runs at, 1% above the best
    assert (search.believed(slower) or 0.0) < (search.believed(fastest[0]) or 0.0)
    assert search.answer() in fastest  # though the best measured figure is the slower layout's


def test_the_calibrated_search_learns_a_pruned_trials_reported_steps(tmp_path):
    """Issue 59: a trial stopped because it cannot win still measured steps; the search learns their median as its
    layout's figure (before, it learnt nothing from it, and needed more trials to reach the best)."""
    import optuna

    from orchestrator.records import TrialRecord
    from orchestrator.search.samplers import CalibratedSampler
    from orchestrator.search.space import SweepSpace

    spec = make_spec(tmp_path, "pruned")
    prior = prior_for(spec)
    space = SweepSpace.from_prior(prior)
    sampler = CalibratedSampler(space, prior, seed=0)
    layout = sampler.search.layouts[0]
    pruned = optuna.trial.create_trial(params=space.params(layout), distributions=space.distributions(),
                                       intermediate_values={2: 90.0, 3: 100.0, 4: 110.0},
                                       user_attrs=TrialRecord.attrs(status="pruned"),
                                       state=optuna.trial.TrialState.PRUNED)
    before = list(sampler.search._obs_y)
    sampler._learn([pruned])
    assert len(sampler.search._obs_y) == len(before) + 1
    i = sampler.search.index[layout.key()]
    assert abs(sampler.search._obs_y[-1] - (math.log(100.0) - sampler.search.log_pred[i])) < 1e-9


class _Told:
    """A search that tells the chance it is given (Convergence asks nothing else of it)."""

    def __init__(self, chance):
        self.chance, self.asked = chance, 0

    def chance_of_better(self, study, tried, best, margin):
        self.asked += 1
        return self.chance


def test_convergence_asks_once_per_finished_trial_and_trusts_a_low_chance_from_five_trials_on():
    from orchestrator.spec.schema import Budget
    from orchestrator.sweep.convergence import Convergence

    search = _Told(0.01)
    rule = Convergence(Budget(), search)
    assert rule.check(None, 0, [], 0.0, 0) is None and search.asked == 0  # nothing measured: nothing to compare
    assert rule.check(None, 2, [], 100.0, 2) is None and search.asked == 1  # low, but before 5 trials
    assert rule.check(None, 2, [], 100.0, 2) is None and search.asked == 1  # no trial finished since: not asked
    said = rule.at_budget(False, 2)
    assert said.startswith("budget.n_trials (8) reached before converging: P(a layout beats the answer by > 2%) = "
                           "0.01 after only 2 trials (trusted from 5 on)") and "not below" not in said
    assert rule.check(None, 5, [], 100.0, 5) == ("converged: P(a layout beats the answer by > 2%) = 0.01 < 0.05, "
                                                 "after 5 trials")
    high = Convergence(Budget(wall_time_s=60.0), _Told(0.3))
    assert high.check(None, 9, [], 100.0, 9) is None
    assert high.at_budget(True, 9).startswith("budget.wall_time_s (60 s) reached before converging: "
                                              "P(a layout beats the answer by > 2%) = 0.30, not below 0.05; ")
    off = Convergence(Budget(converge_below=None), _Told(0.01))
    assert off.check(None, 9, [], 100.0, 9) is None and off.at_budget(False, 9) == "budget.n_trials (8) reached"


def test_a_new_run_forgets_the_last_runs_stop(tmp_path, monkeypatch):
    """`status` reads why the sweep stopped: a later run cut short (Ctrl-C) must not leave the earlier run's reason."""
    import pytest

    from orchestrator.sweep.loop import Sweep

    spec = make_spec(tmp_path, "again", budget={"n_trials": 3})
    done = run_sweep(spec, show_progress=False)
    assert StudyRecord.of(done.study).stopped
    monkeypatch.setattr(Sweep, "_loop", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec.model_copy(update={"budget": spec.budget.model_copy(update={"n_trials": 5})}), resume=True,
                  show_progress=False)
    assert StudyRecord.of(studies.load_study(spec.storage, "again")).stopped is None
