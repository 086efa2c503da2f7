"""The report's parameter importance (issue 56, part 2): learned from the trials that measured a throughput only (a
rejected proposal or a failed trial is told 0 tokens/s, which is no measurement), and over the parameters the sweep
searched only (a fixed or pinned one is never listed)."""

from __future__ import annotations

import optuna

from orchestrator.outputs.report import charts

CHOICES = {"tp": [1, 2, 4], "ep": [1, 2, 4, 8], "mbs": [1, 2], "vpp": [1, 2]}
DISTS = {name: optuna.distributions.CategoricalDistribution(values) for name, values in CHOICES.items()}
SPEC = {"free": ["tp", "ep", "vpp"], "fixed": {"vpp": 1}}  # mbs is not searched (pinned); vpp is fixed


def _trial(params: dict, status: str, tps: float) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(params=params, distributions=DISTS, values=[tps, 10.0],
                                     user_attrs={"status": status})


def _study(with_rejections: bool) -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize"], study_name="importance")
    study.set_user_attr("spec", SPEC)
    # measured: the throughput follows tp; mbs and vpp vary too (a rule of thumb's values), as a pinned field can
    for i in range(12):
        tp, ep = CHOICES["tp"][i % 3], CHOICES["ep"][i % 4]
        study.add_trial(_trial({"tp": tp, "ep": ep, "mbs": 1 + i % 2, "vpp": 1 + (i // 2) % 2}, "ok",
                               1000.0 * tp + ep))
    if with_rejections:  # told 0 tokens/s: all at ep 8 and mbs 2, as if ep 8 were the worst choice there is
        for i in range(10):
            study.add_trial(_trial({"tp": CHOICES["tp"][i % 3], "ep": 8, "mbs": 2, "vpp": 2},
                                   ("infeasible", "oom", "error")[i % 3], 0.0))
        study.add_trial(optuna.trial.create_trial(params={"tp": 1, "ep": 8, "mbs": 2, "vpp": 2}, distributions=DISTS,
                                                  state=optuna.trial.TrialState.FAIL, user_attrs={"status": "error"}))
    return study


def _bars(fig) -> dict[str, float]:
    bars = [d for d in fig.data if d.type == "bar"]
    assert len(bars) == 1, fig
    return dict(zip(bars[0].y, bars[0].x))


def test_importance_lists_only_the_searched_parameters():
    bars = _bars(charts._importance_figure(_study(with_rejections=False)))
    assert set(bars) == {"tp", "ep"}  # vpp is fixed, mbs never searched: neither is listed
    assert bars["tp"] > bars["ep"]  # the throughput follows tp


def test_rejected_and_failed_trials_do_not_count():
    """The same importance with or without proposals told 0 tokens/s (rejected, out of memory, errored)."""
    study = _study(with_rejections=True)
    assert len(charts.measured_snapshot(study).trials) == 12
    assert _bars(charts._importance_figure(study)) == _bars(charts._importance_figure(_study(with_rejections=False)))
    title = charts._importance_figure(study).layout.title.text
    assert "12 measured trials, 2 searched parameters" in title, title


def test_an_older_study_without_a_spec_reads_the_default_free_dimensions():
    study = _study(with_rejections=False)
    study.set_user_attr("spec", {})
    assert set(_bars(charts._importance_figure(study))) == {"tp", "ep", "mbs", "vpp"}  # all are free by default


def test_too_few_measurements_say_so_instead_of_a_chart():
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("spec", SPEC)
    study.add_trial(_trial({"tp": 1, "ep": 1, "mbs": 1, "vpp": 1}, "ok", 500.0))
    for _ in range(5):
        study.add_trial(_trial({"tp": 2, "ep": 2, "mbs": 1, "vpp": 1}, "infeasible", 0.0))
    fig = charts._importance_figure(study)
    assert not [d for d in fig.data if d.type == "bar"]
    assert "1 trial(s) measured a throughput; it needs 2" in fig.layout.annotations[0].text
