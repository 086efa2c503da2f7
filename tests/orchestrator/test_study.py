"""The study (analytic backend): storage contract, infeasible proposals, dedup, resume, leaderboard, status."""

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from search_spaces.errors import SpecError

from orchestrator.commands.cli import main
from orchestrator.records import TABLE_COLUMNS, queries
from orchestrator.search.calibrated import CalibratedSearch
from orchestrator.search.prior import Prediction, Prior
from orchestrator.spec.schema import load_spec, parse_spec
from orchestrator.storage import studies
from orchestrator.sweep import run_sweep
from orchestrator.sweep.record import Screen
from tests.sweep_helpers import prior_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
def test_analytic_sweep_storage_contract(sweep_spec):
    spec = parse_spec(sweep_spec("analytic-small", budget={"n_trials": 8}))
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    study = studies.load_study(spec.storage, spec.name)
    for key in ("spec", "model", "seq_len", "gpu", "num_gpus", "backend", "mlflow_experiment_id",
                "mlflow_parent_run_id", "tracking_uri"):
        assert key in study.user_attrs, key
    ran = queries.measured_trials(study)
    assert out.n_measured == len(ran) == 8
    keys = [t.user_attrs["layout_key"] for t in queries.finished_trials(study)]
    assert len(keys) == len(set(keys)), "a layout was run twice"
    for t in ran:
        ua = t.user_attrs
        assert {"layout", "layout_key", "status", "result", "prediction", "backend", "mlflow_run_id"} <= set(ua)
        assert ua["status"] in ("ok", "oom", "invalid")
    for t in queries.finished_trials(study):
        if t.user_attrs["status"] == "infeasible":
            assert t.user_attrs["reason"] and "result" not in t.user_attrs
            assert max(t.constraints.values()) > 0
    best = queries.best_fitting_trial(study)
    assert best is not None and best.number == out.best.number
    assert best.values[0] == max(t.values[0] for t in ran if queries.fits(t))
    # the rules of thumb came first
    first = study.trials[0]
    assert first.user_attrs.get("proposed_by") == "rule-of-thumb"
    assert all(queries.fits(t) for t in out.pareto)


def test_the_first_fitting_rule_of_thumb_is_tried_and_the_rest_only_near_the_models_best(sweep_spec, monkeypatch):
    prior = prior_for(parse_spec(sweep_spec("analytic-small", budget={"n_trials": 8})))
    thumbs = [s.replace(**prior.pinned) for s in prior.rules_of_thumb]
    best = prior.predict(prior.ranked(limit=1)[0]).tokens_per_sec_per_gpu
    seeds = prior.seeds()
    assert seeds[0] == next(s for s in thumbs if prior.predict(s).feasible)
    assert all(prior.predict(s).tokens_per_sec_per_gpu >= Prior.SEED_FLOOR * best for s in seeds[1:])
    assert len(seeds) < min(len(thumbs), 4)  # on CPU the (GPU) rules of thumb are far from the best: dropped
    monkeypatch.setattr(Prior, "SEED_FLOOR", 0.0)
    assert prior.seeds() == thumbs[:4]


@pytest.mark.slow  # end to end (an analytic sweep, ~5 s): the full suite runs it, the fast lane does not
@pytest.mark.timeout(300)
def test_only_the_searchs_own_proposals_may_be_memory_near_misses_never_a_rule_of_thumb(sweep_spec):
    """The calibrated search may try a layout predicted a little over the GPU's memory, once its measured peaks say
    it fits (CalibratedSearch.MEMORY_MARGIN); a rule of thumb nothing has measured is held to the prediction. Seen:
    Llama-4-Maverick cut to 4 layers on 8 H100s, whose rules of thumb are all predicted 9-24% over: the margin let
    two of them run into an OOM."""
    maverick = Path(__file__).resolve().parents[2] / "tests/data/hf_configs/llama-4-maverick-17b-128e-instruct.json"
    spec = parse_spec(sweep_spec("thumbs", model=str(maverick), model_overrides={"num_layers": 4}, gpu="h100",
                                 gpus_per_node=8, seq_len=4096, fixed={}, budget={"n_trials": 4}))
    prior = prior_for(spec)
    limit = prior.memory_limit_gib
    over = [s for s in prior.seeds() if limit < prior.predict(s).peak_memory_gib <= CalibratedSearch.MEMORY_MARGIN
            * limit]
    assert over, "the case needs a rule of thumb inside the search's margin"
    study = run_sweep(spec, prior=prior, show_progress=False).study
    thumbs = [t for t in study.trials if t.user_attrs.get("proposed_by") == "rule-of-thumb"]
    assert thumbs and all(t.user_attrs["status"] == "infeasible" for t in thumbs), [
        (t.number, t.user_attrs["status"]) for t in thumbs]
    assert queries.measured_trials(study) and not [t for t in study.trials if t.user_attrs.get("status") == "oom"]


@pytest.mark.parametrize("proposed_by, runs", [(None, True), ("resume", True), ("confirm", True),
                                                ("rule-of-thumb", False), ("previous length", False)])
def test_the_memory_margin_is_the_searchs_and_a_re_runs_never_a_seeds(proposed_by, runs):
    """A near miss predicted 10% over: the search's own proposal may run it, and so may a re-run of a trial that was
    let through before (a resume's retry of an interrupted near miss, or its measured result re-recorded: screened
    out, it would be lost); a seed nothing has measured may not."""
    near_miss = Prediction(legal=True, fits=False, reason=None, tokens_per_sec_per_gpu=1.0, peak_memory_gib=88.0,
                           data={})
    screen = Screen(memory_limit_gib=80.0, margin=CalibratedSearch.MEMORY_MARGIN)
    assert (screen(near_miss, proposed_by) is None) is runs
    assert screen(replace(near_miss, peak_memory_gib=80.0 * CalibratedSearch.MEMORY_MARGIN + 1), proposed_by)


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
def test_existing_study_needs_resume_and_resume_adds_trials(sweep_spec):
    spec = parse_spec(sweep_spec("analytic-small", budget={"n_trials": 4}))
    run_sweep(spec, prior=prior_for(spec), show_progress=False)
    with pytest.raises(SpecError, match="--resume"):
        run_sweep(spec, prior=prior_for(spec), show_progress=False)
    bigger = parse_spec(sweep_spec("analytic-small", budget={"n_trials": 6}))
    out = run_sweep(bigger, resume=True, prior=prior_for(bigger), show_progress=False)
    assert out.n_measured == 6
    keys = [t.user_attrs["layout_key"] for t in queries.measured_trials(out.study)]
    assert len(keys) == len(set(keys)) == 6
    with pytest.raises(SpecError, match="no study"):
        run_sweep(parse_spec(sweep_spec("never-ran", budget={"n_trials": 8})), resume=True, prior=prior_for(spec),
                  show_progress=False)


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
def test_status_prints_and_writes_replay_csv(tmp_path, sweep_spec, capsys):
    spec = parse_spec(sweep_spec("analytic-small", budget={"n_trials": 4}))
    run_sweep(spec, prior=prior_for(spec), show_progress=False)
    csv = tmp_path / "board.csv"
    assert main(["status", spec.name, "--storage", spec.storage, "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "best that fits" in out and spec.name in out
    frame = pd.read_csv(csv)
    assert list(frame.columns[1:1 + len(TABLE_COLUMNS)]) == TABLE_COLUMNS
    assert (frame["status"] != "infeasible").sum() == 4
    ok = frame[frame["status"] == "ok"]["tokens_per_sec_per_gpu"].tolist()
    assert ok == sorted(ok, reverse=True)
    assert main(["status", "nope", "--storage", spec.storage]) == 2


# The example's budget (200 trials) for the layout samplers; multivariate TPE's proposals cost more as the trials
# grow (200 took 220 s on 2 cores; 30 took 83 s in CI), so it runs 15 here: the same properties, the example's full
# run is bench/sweep_speed.py's. TPE samples every dimension freely and in this memory-tight situation about 2% of its
# proposals fit (since optimizer offload keeps the fp32 master shard on the GPU): it may stop at the proposal cap
# (budget.max_proposals_per_trial x n_trials) before its budget, and says so.
@pytest.mark.slow  # with SQLite and MLflow stores: 40-50 s per search on 2 cores
@pytest.mark.timeout(600)
@pytest.mark.parametrize("search, n_trials", [("calibrated", 200), ("tpe", 15), ("grid", 200)])
def test_deepseek_v3_1024_h100_analytic_200_trials(tmp_path, search, n_trials):
    """The example's what-if trials at full scale: the seeds first, never worse than them (its speed:
    bench/sweep_speed.py)."""
    spec = load_spec(EXAMPLES / "deepseek-v3-128k-h100x1024.yaml", {
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}", "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "search": search, "budget": {"n_trials": n_trials}})
    spec = spec.model_copy(update={"workdir": str(tmp_path / "runs")})
    out = run_sweep(spec, show_progress=False)
    seeds = [t for t in out.study.trials if t.user_attrs.get("proposed_by") == "rule-of-thumb"
             and queries.fits(t)]
    assert seeds, "no seed recipe fitted"
    assert out.best.values[0] >= max(t.values[0] for t in seeds)
    cap = n_trials * spec.budget.max_proposals_per_trial
    if search == "tpe":  # TPE samples dimensions freely: the cost model must screen some proposals out
        assert out.n_infeasible >= 1 and out.n_measured > len(seeds)  # it measured layouts of its own
        assert out.n_measured == n_trials or f"stopped proposing after {cap} proposals" in out.messages
    else:  # the layout samplers only propose legal layouts, and reach their budget
        assert out.n_measured == n_trials
        assert all(t.user_attrs.get("status") != "infeasible" or t.user_attrs.get("proposed_by") != search
                   for t in out.study.trials)


def test_the_stored_studies_are_optunas_summaries_without_their_trials(tmp_path):
    """studies.stored_studies lists what optuna.get_all_study_summaries lists (names, attributes, order), without
    reading every trial; load_study without a name takes the newest."""
    import optuna

    from orchestrator.storage import studies as studies_mod

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    for n, name in enumerate(["b", "a", "c"]):
        made = optuna.create_study(storage=url, study_name=name)
        made.set_user_attr("family", "f" if n else "g")
        made.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=n + 1)
    storage = studies_mod.open_storage(url)
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    stored = studies_mod.stored_studies(storage)
    assert [(s.study_name, s.user_attrs) for s in stored] == [(s.study_name, s.user_attrs) for s in summaries]
    assert studies_mod.load_study(url).study_name == "c"
    assert [s.study_name for s in studies_mod.family_members(url, "f")] == ["a", "c"]
