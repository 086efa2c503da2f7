"""The study's read side: which trials ran, fit, lead, and what they cost (best, Pareto, leaderboard, replay table,
GPU-hours). What the storage holds of the study and of each trial is the contract of the records here (StudyRecord,
TrialRecord); this module reads it through those records only, whatever store the study is kept in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import optuna
import pandas as pd

from search_spaces.result import MEASURED_STATUSES

from orchestrator.records import LEADERBOARD_COLUMNS, TABLE_COLUMNS, StudyRecord, TrialRecord, row
from orchestrator.records.lifecycle import Tally
from orchestrator.spec import economics

# the study's objectives: tokens/s per GPU (up), peak memory (down)
DIRECTIONS: list[Literal["maximize", "minimize"]] = ["maximize", "minimize"]
# their names, as Optuna keeps them (study.metric_names): optuna-dashboard and Optuna's plots label the axes with them
METRIC_NAMES = ["tokens/s/GPU", "peak memory GiB"]


# the Optuna states of a trial told a verdict: measured (COMPLETE), failed (FAIL), rejected (PRUNED)
TOLD = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials told a verdict (TrialRecord.finished): measured, failed or rejected; not a discarded repeat, nor one
    interrupted."""
    return [t for t in study.get_trials(deepcopy=False, states=TOLD) if TrialRecord.of(t).finished]


def finished_records(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.of(t) for t in finished_trials(study)]


def measured_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that ran (counted against n_trials); infeasible proposals are free."""
    return [t for t in finished_trials(study) if TrialRecord.of(t).status in MEASURED_STATUSES]


def measured_records(study: optuna.Study) -> list[TrialRecord]:
    return [r for r in finished_records(study) if r.status in MEASURED_STATUSES]


def fits(trial: optuna.trial.FrozenTrial) -> bool:
    return TrialRecord.of(trial).fits_ok


def best_fitting_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The sweep's answer (StudyRecord.answer) when it names a status ok trial that fits, else the best measured
    tokens/s among those."""
    ok = [t for t in finished_trials(study) if fits(t)]
    chosen = StudyRecord.of(study).answer
    named = next((t for t in ok if t.number == chosen), None) if chosen is not None else None
    return named or max(ok, key=lambda t: t.values[0], default=None)


def fitting_trial_of(study: optuna.Study, layout_key: str) -> int | None:
    """The number of a status ok trial of `layout_key` that fits, a full-size one first (the sweep's answer names
    it: StudyRecord.answer); None when the layout has none."""
    ran = [TrialRecord.of(t) for t in finished_trials(study) if fits(t)]
    ours = sorted((r for r in ran if r.layout_key == layout_key), key=lambda r: (bool(r.proxy), r.number))
    return ours[0].number if ours else None


def gpu_hours(study: optuna.Study) -> tuple[float, float]:
    """(GPU-hours the study's trials used, GPU-hours the same trials would have used at full size)."""
    return _gpu_hours(measured_records(study))


def _gpu_hours(measured: list[TrialRecord]) -> tuple[float, float]:
    used = full = 0.0
    for record in measured:
        seconds, at_full = record.gpu_seconds
        used += seconds or 0.0
        full += at_full or seconds or 0.0
    return used / 3600.0, full / 3600.0


def sweep_spend(study: optuna.Study) -> economics.Spend:
    """What the sweep's trials used, in GPU-hours (and dollars with the spec's price)."""
    return economics.spend(*gpu_hours(study), StudyRecord.of(study).cost)


def pareto_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    front = [t for t in study.best_trials if fits(t)]
    return sorted(front, key=lambda t: -t.values[0])


def _on_board(record: TrialRecord, include_infeasible: bool) -> bool:
    """Every proposal judged or running (a discarded repeat is no row); rejected ones unless left out."""
    judged = record.status is not None or not record.finished
    has_layout = record.layout is not None or record.status is not None
    return judged and has_layout and (include_infeasible or record.status != "infeasible")


def leaderboard(study: optuna.Study, include_infeasible: bool = True) -> pd.DataFrame:
    """One row per finished trial, best measured first (replay-table columns first)."""
    context = StudyRecord.of(study)
    rows = [row(r, context) for r in (TrialRecord.of(t) for t in study.get_trials(deepcopy=False))
            if _on_board(r, include_infeasible)]
    frame = pd.DataFrame(rows, columns=LEADERBOARD_COLUMNS)
    if frame.empty:
        return frame
    frame["_ok"] = frame["status"].eq("ok")
    frame = frame.sort_values(["_ok", "tokens_per_sec_per_gpu", "trial"], ascending=[False, False, True],
                              na_position="last").drop(columns="_ok")
    return frame.reset_index(drop=True)


def replay_table(study: optuna.Study) -> pd.DataFrame:
    """The trials that ran, in the replay backend's CSV format (issue 8)."""
    frame = leaderboard(study, include_infeasible=False)
    return frame[frame["status"].isin(MEASURED_STATUSES)][TABLE_COLUMNS] if not frame.empty else frame[TABLE_COLUMNS]


@dataclass(frozen=True)
class StudySummary:
    """What a study amounts to, read once: every view of it (the sweep's last lines, `status`) prints this."""
    name: str
    tally: Tally
    """The trials by lifecycle state (orchestrator/records/lifecycle.py)."""
    measured: int
    """Trials that count against n_trials (search_spaces.result.MEASURED_STATUSES)."""
    best: optuna.trial.FrozenTrial | None
    """The best measured trial that fits."""
    pareto: list[optuna.trial.FrozenTrial]
    records: dict[int, TrialRecord]
    """Every trial's record, by number."""
    run_keys: set[tuple[str | None, str]]
    """(layout key, fidelity) of every finished trial: a layout runs once at each fidelity."""
    spend: economics.Spend
    gpu_hours_to_best: float | None
    """GPU-hours the sweep had spent when its best trial was first measured (its trials up to and including the best
    one, in trial order); None without a best."""
    proxies: int
    """Measured trials that ran as proxies."""
    predicted: bool
    """Its trials are predictions or recordings (a what-if backend's): nothing ran on a cluster."""
    context: StudyRecord
    train: economics.Training | None
    """What training cost.train_tokens takes at the best trial's throughput (None without train_tokens)."""


def summary(study: optuna.Study) -> StudySummary:
    """The study's summary (StudySummary), from one read of its trials."""
    records = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]
    measured = [r for r in records if r.finished and r.status in MEASURED_STATUSES]
    by_number = {r.number: r for r in records}
    context = StudyRecord.of(study)
    best = best_fitting_trial(study)
    pareto = pareto_trials(study)
    train = economics.to_train(best.values[0], int(context.num_gpus or 0), context.cost) if best else None
    predicted = bool(measured) and all(r.estimated or r.source == "replay" for r in measured)
    to_best = _gpu_hours([r for r in measured if r.number <= best.number])[0] if best else None
    return StudySummary(name=study.study_name, tally=Tally.of(records), measured=len(measured), best=best,
                        pareto=pareto, records=by_number,
                        run_keys={r.run_key for r in records if r.finished and r.layout_key},
                        spend=economics.spend(*_gpu_hours(measured), context.cost), gpu_hours_to_best=to_best,
                        proxies=sum(1 for r in measured if r.proxy), predicted=predicted, context=context, train=train)
