"""`moe-autotune check STUDY`: do the Optuna study and its MLflow experiment agree, trial by trial?

The Optuna storage is the source of truth; MLflow is a view of it that must not lose, double or mix
anything. Checked: no more measured trials than the budget, no layout measured twice; one live child run
per finished trial (rejected proposals too when the sweep tracks them), whose layout params equal the
trial's layout, whose status tag, failure tags (class, rank, line) and metrics equal the stored result (one
point per summary metric); no child run that belongs to no trial (a run still running, of a trial numbered after
the study's last, is one in flight: an analytic sweep stores a trial once told), none left running by a trial
that is not running, none finished for a trial that failed (an interrupted trial is closed FAILED), and no layout
counted by two finished child runs.

While a live driver holds the study (its lease), a trial it is still running or recording is in flight, not a
difference: running in Optuna, or told while its child run is still running or not written yet (an analytic sweep
writes its MLflow records behind its trials), or a child run of a trial the study does not hold yet. They are
counted apart (`examine`); everything else is checked as for a finished sweep.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from mlflow import MlflowClient

from search_spaces.result import MEASURED_STATUSES

from orchestrator.records import HEADLINE, PROMOTION_TAG, TRIAL_TAG, StudyRecord, TrialRecord, metrics, queries
from orchestrator.redact import redact_text
from orchestrator.storage import open_mlflow, studies
from orchestrator.storage.connections import BoundedClient
from orchestrator.tracking.client import require_existing_store
from orchestrator.tracking.views import PROXY_PARAM, SUPERSEDED_TAG, layout_params

# the figures logged as one MLflow metric of the same name that must equal the study's (records.HEADLINE)
CHECKED_METRICS = tuple(m.name for m in metrics(HEADLINE))
# a failed trial's root cause, stored and tagged (search_spaces/failures.py): the child run's tags must equal it
FAILURE_TAGS = ("failure_class", "failure_rank", "failure_reason")


def storage_problems(study: optuna.Study) -> list[str]:
    """What is wrong with the study on its own: over the budget, a layout measured twice."""
    problems = []
    measured = queries.measured_records(study)
    budget = StudyRecord.of(study).n_trials
    if budget is not None and len(measured) > budget:
        problems.append(f"{len(measured)} trials were measured, over the budget of {budget}")
    # a layout may run once at each fidelity (confirm re-runs a proxy at full size)
    for (key, fidelity), n in Counter(r.run_key for r in measured).items():
        if n > 1:
            numbers = [r.number for r in measured if r.run_key == (key, fidelity)]
            problems.append(f"layout {key} was measured {n} times at {fidelity} size (trials {numbers})")
    return problems


def tracking_problems(study: optuna.Study, tracking_uri: str) -> list[str]:
    """Where MLflow's child runs disagree with the study's trials."""
    return _tracking(study, tracking_uri, live=False)[0]


def _tracking(study: optuna.Study, tracking_uri: str, live: bool) -> tuple[list[str], set[int]]:
    """(where MLflow's child runs disagree with the study's trials, the trials in flight). `live`: a live driver holds
    the study: a trial it runs, or whose MLflow record it is still writing (a running child run, or none yet; a run
    of a trial not yet stored), is in flight, not a difference."""
    context = StudyRecord.of(study)
    parent, experiment = context.mlflow_parent_run_id, context.mlflow_experiment_id
    if not parent or not experiment:
        return ["the study records no MLflow parent run (it ran with tracking_uri none?)"], set()
    client = open_mlflow(tracking_uri)  # bounded: an unreachable server is one line, not a hang
    runs: dict[int, list[Any]] = {}
    # neither a trial's run, nor one superseded (closed when its trial number ran another layout), nor a promotion's
    orphans = []
    for run in _children(client, experiment, parent):
        number = run.data.tags.get(TRIAL_TAG)
        if number is not None:
            runs.setdefault(int(number), []).append(run)
        elif SUPERSEDED_TAG not in run.data.tags and PROMOTION_TAG not in run.data.tags:
            orphans.append(run.info.run_id)
    trials = {t.number: TrialRecord.of(t) for t in study.get_trials(deepcopy=False)}
    problems = [f"child run {run_id} names no trial" for run_id in orphans]
    problems += [f"trial {n} has {len(r)} child runs" for n, r in sorted(runs.items()) if len(r) > 1]
    # runs still running, numbered after the study's last trial: trials in flight (an analytic sweep stores a trial
    # once it is told, orchestrator/sweep/writes.py), as a running trial's running run is; --resume completes or
    # closes them. With a live driver, any run of a trial not stored yet is one.
    after = max(trials, default=-1)
    in_flight = {n for n, r in runs.items() if n not in trials and (live or (
        n > after and all(run.info.status == "RUNNING" for run in r)))}
    problems += [f"child run {r[0].info.run_id} names trial {n}, which the study does not have"
                 for n, r in sorted(runs.items()) if n not in trials and n not in in_flight]
    problems += _measured_twice([run for n, r in sorted(runs.items()) for run in r])
    tracked = bool(context.track_rejected)  # a rejection has a child run only when the spec asked for one
    for number, trial in sorted(trials.items()):
        run = runs.get(number, [None])[0]
        if live and _in_flight(trial, run, tracked):
            in_flight.add(number)
            continue
        problems += _trial_problems(client, trial, run, tracked)
    return problems, in_flight if live else set()


def _in_flight(trial: TrialRecord, run, track_rejected: bool) -> bool:
    """Is the trial's record still being written by the study's live driver? Running in Optuna, or told with its
    child run still running or not made yet (an analytic sweep's records follow its trials: write-behind)."""
    if not trial.finished or not trial.status:
        return trial.state == "running"
    if run is None:
        return trial.status != "infeasible" or track_rejected
    return run.info.status == "RUNNING"


def _trial_problems(client: MlflowClient | BoundedClient, trial: TrialRecord, run, track_rejected: bool) -> list[str]:
    status = trial.status
    if not trial.finished or not status:
        if run is not None and trial.state != "running" and run.info.status == "RUNNING":
            return [f"trial {trial.number} is {trial.state} but its child run is still running"]
        if run is not None and trial.state == "fail" and run.info.status == "FINISHED":
            # the child counts a measurement its trial never committed (an interrupted trial, kept)
            return [f"trial {trial.number} failed but its child run {run.info.run_id} finished as "
                    f"{run.data.tags.get('status')!r}"]
        return []
    if run is None:
        return [] if status == "infeasible" and not track_rejected else [f"trial {trial.number} has no child run"]
    out = []
    expected = layout_params(trial.layout) if trial.layout is not None else None
    logged = {k: v for k, v in run.data.params.items() if not k.startswith(PROXY_PARAM)}  # proxy.*: what it ran
    if expected is not None and logged != expected:
        diff = sorted(k for k in set(expected) | set(logged) if expected.get(k) != logged.get(k))
        out.append(f"trial {trial.number}: child run's layout params differ in {', '.join(diff)}")
    if run.data.tags.get("status") != status:
        out.append(f"trial {trial.number}: child run says status {run.data.tags.get('status')!r}, the study {status!r}")
    out += _failure_problems(trial, run)
    if status in MEASURED_STATUSES:
        out += _metric_problems(client, trial, run)
    return out


def _failure_problems(trial: TrialRecord, run) -> list[str]:
    """The root cause the child run's tags name (class, rank, line) must be the one the study stored."""
    expected = {k: redact_text(v) for k, v in trial.mlflow_tags().items() if k in FAILURE_TAGS}
    return [f"trial {trial.number}: child run's {name} tag is {run.data.tags.get(name)!r}, the study's "
            f"{expected.get(name)!r}" for name in FAILURE_TAGS if run.data.tags.get(name) != expected.get(name)]


def _measured_twice(runs: list[Any]) -> list[str]:
    """Finished child runs that count one layout (at one fidelity) as measured more than once."""
    by_layout: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        if run.info.status == "FINISHED" and run.data.tags.get("status") in MEASURED_STATUSES:
            params = {k: v for k, v in run.data.params.items() if not k.startswith(PROXY_PARAM)}
            key = (json.dumps(params, sort_keys=True), run.data.tags.get("fidelity") or "full")
            by_layout.setdefault(key, []).append(run.data.tags.get(TRIAL_TAG, "?"))
    return [f"one layout was measured by {len(n)} child runs at {fidelity} size (trials {', '.join(sorted(n))})"
            for (_, fidelity), n in by_layout.items() if len(n) > 1]


def _metric_problems(client: MlflowClient | BoundedClient, trial: TrialRecord, run) -> list[str]:
    out = []
    for key in CHECKED_METRICS:
        value = trial.measured(key)
        logged = run.data.metrics.get(key)
        if value is None:
            if logged is not None:
                out.append(f"trial {trial.number}: child run has {key} {logged}, the study none")
            continue
        if logged is None or not math.isclose(logged, float(value), rel_tol=1e-9, abs_tol=1e-12):
            out.append(f"trial {trial.number}: child run has {key} {logged}, the study {value}")
        elif key == "tokens_per_sec_per_gpu" and len(client.get_metric_history(run.info.run_id, key)) != 1:
            out.append(f"trial {trial.number}: {key} was logged more than once to its child run")
    return out


def _children(client: MlflowClient | BoundedClient, experiment: str, parent: str):
    token = None
    while True:
        page = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent}'", max_results=1000,
                                  page_token=token)
        yield from page
        token = page.token
        if not token:
            return


@dataclass(frozen=True)
class Verdict:
    """What `check` found: the study, every difference, and the trials a live driver is still running or recording
    (in flight: not differences)."""
    study: optuna.Study
    problems: list[str]
    in_flight: list[int]
    driver: str | None = None
    """The live driver holding the study, as its lease names it (pid, host); None when no sweep runs it."""


def check(storage: str, study_name: str | None, tracking_uri: str | None = None) -> tuple[optuna.Study, list[str]]:
    """(the study, every problem found); MLflow is checked when the study records a tracking URI (or one
    is given)."""
    verdict = examine(storage, study_name, tracking_uri)
    return verdict.study, verdict.problems


def examine(storage: str, study_name: str | None, tracking_uri: str | None = None,
            live: Callable[[optuna.Study], str | None] | None = None) -> Verdict:
    """check, telling in-flight trials apart when `live(study)` names a live driver holding the study (its lease:
    orchestrator/sweep/lease.py, asked by the command)."""
    study = studies.load_study(storage, study_name)
    uri = tracking_uri or StudyRecord.of(study).tracking_uri
    if uri and uri.lower() != "none":
        require_existing_store(uri)  # a store that is not there is refused, not created by reading it
    driver = live(study) if live else None
    verdict = _examine(study, uri, driver)
    if driver is not None and verdict.in_flight and live and live(study) is None:
        verdict = _examine(study, uri, None)  # the driver ended as we read: everything is written now
    return verdict


def _examine(study: optuna.Study, uri: str | None, driver: str | None) -> Verdict:
    problems = storage_problems(study)
    in_flight: set[int] = set()
    if uri and uri.lower() != "none":
        found, in_flight = _tracking(study, uri, driver is not None)
        problems += found
    elif driver is not None:
        in_flight = {t.number for t in study.get_trials(deepcopy=False) if TrialRecord.of(t).state == "running"}
    return Verdict(study, problems, sorted(in_flight), driver)
