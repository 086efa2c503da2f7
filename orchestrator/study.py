"""The Optuna study: objectives, storage contract, and the read side (best, Pareto, leaderboard).

Storage contract (read by promote/report/export):
  study.user_attrs: spec, model, seq_len, gpu, num_gpus, backend, memory_limit_gib, mlflow_experiment_id,
                    mlflow_parent_run_id, tracking_uri
  trial.user_attrs: layout, layout_key, status, result, prediction, mlflow_run_id, backend, reason, command
Objectives: [tokens/s/GPU (maximize), peak memory GiB (minimize)]; constraints (feasible when <= 0):
  memory_over_limit_gib, and not_measured_ok (1 for infeasible/oom/error/timeout trials).
"""

from __future__ import annotations

import time
from typing import Any

import optuna
import pandas as pd
import sqlalchemy.exc

from search_spaces.errors import SpecError

from orchestrator import sqlite_tuning
from orchestrator.redact import redact_uri

DIRECTIONS = ["maximize", "minimize"]
MEASURED = ("ok", "oom", "error", "invalid", "timeout", "interrupted")  # statuses of trials that ran
# replay-table columns (issue 8), in order
TABLE_COLUMNS = ["model", "gpu", "num_gpus", "seq_len", "tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs",
                 "recompute", "cuda_graphs", "precision", "dispatcher", "optimizer_offload", "status",
                 "tokens_per_sec_per_gpu", "tflops_per_gpu", "peak_memory_gib"]

optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_storage(url: str, attempts: int = 10) -> optuna.storages.BaseStorage:
    sqlite_tuning.install()
    for attempt in range(attempts):
        try:
            if url.startswith("sqlite:///"):
                # several processes (resume, status) may touch the file: wait instead of failing on locks
                return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
            return optuna.storages.RDBStorage(url)
        except Exception as exc:
            text = str(exc)
            # two sweeps creating one new storage at once race on the schema: the loser retries
            racing = isinstance(exc, sqlalchemy.exc.IntegrityError) or (
                isinstance(exc, sqlalchemy.exc.OperationalError) and ("already exists" in text or "locked" in text))
            if racing and attempt + 1 < attempts:
                time.sleep(0.2 + 0.1 * attempt)
                continue
            why = text.splitlines()[0] if text else type(exc).__name__
            raise SpecError(redact_uri(f"cannot open storage {url!r}: {why}")) from None
    raise AssertionError("unreachable")


def create_or_resume(storage_url: str, name: str, sampler, resume: bool) -> tuple[optuna.Study, bool]:
    """Returns (study, existed). Without --resume an existing study is refused (nothing is overwritten)."""
    storage = open_storage(storage_url)
    existing = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    shown = redact_uri(storage_url)
    already = (f"study {name!r} already exists in {shown}; pass --resume to continue it "
               f"or --study-name for a new one")
    if name in existing and not resume:
        raise SpecError(already)
    if name not in existing and resume:
        raise SpecError(f"no study {name!r} in {shown} to resume")
    try:  # a second sweep creating the same name at the same moment loses here, not by sharing the study
        study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, directions=DIRECTIONS,
                                    load_if_exists=resume)
    except optuna.exceptions.DuplicatedStudyError:
        raise SpecError(already) from None
    return study, name in existing


def load_study(storage: str, study_name: str | None = None) -> optuna.Study:
    store = open_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    if study_name is None:
        if not names:
            raise SpecError(f"no study in {redact_uri(storage)}")
        study_name = names[-1]
    if study_name not in names:
        raise SpecError(f"no study {study_name!r} in {redact_uri(storage)}; found: {', '.join(names) or 'none'}")
    return optuna.load_study(study_name=study_name, storage=store)


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]


def measured_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that ran (counted against n_trials); infeasible proposals are free."""
    return [t for t in finished_trials(study) if t.user_attrs.get("status") in MEASURED]


def fits(trial: optuna.trial.FrozenTrial) -> bool:
    return trial.user_attrs.get("status") == "ok" and all(v <= 0 for v in trial.constraints.values())


def best_fitting_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """Best measured tokens/s among status ok trials that fit the GPU memory."""
    ok = [t for t in finished_trials(study) if fits(t)]
    return max(ok, key=lambda t: t.values[0], default=None)


def pareto_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    front = [t for t in study.best_trials if fits(t)]
    return sorted(front, key=lambda t: -t.values[0])


def _row(study_attrs: dict[str, Any], trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    ua = trial.user_attrs
    layout = ua.get("layout") or {}
    result = ua.get("result") or {}
    pred = ua.get("prediction") or {}
    graphs = layout.get("cuda_graphs") or []
    recompute = layout.get("recompute_granularity", "none")
    if recompute == "selective":
        recompute = ",".join(layout.get("recompute_modules") or [])
    row = {
        "trial": trial.number,
        "model": study_attrs.get("model"), "gpu": study_attrs.get("gpu"),
        "num_gpus": study_attrs.get("num_gpus"), "seq_len": study_attrs.get("seq_len"),
        **{k: layout.get(k) for k in ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs")},
        "recompute": recompute.replace(",", ";"),
        "cuda_graphs": ";".join(graphs) or "none",
        "precision": layout.get("precision"), "dispatcher": layout.get("dispatcher"),
        "optimizer_offload": layout.get("optimizer_offload"),
        "status": ua.get("status") or trial.state.name.lower(),
        "tokens_per_sec_per_gpu": result.get("tokens_per_sec_per_gpu"),
        "tflops_per_gpu": result.get("tflops_per_gpu"),
        "peak_memory_gib": result.get("peak_memory_gib"),
        "predicted_tokens_per_sec_per_gpu": pred.get("tokens_per_sec_per_gpu"),
        "predicted_peak_memory_gib": pred.get("peak_memory_gib"),
        "reason": ua.get("reason"),
        "mlflow_run_id": ua.get("mlflow_run_id"),
    }
    return row


def leaderboard(study: optuna.Study, include_infeasible: bool = True) -> pd.DataFrame:
    """One row per finished trial, best measured first (replay-table columns first)."""
    attrs = study.user_attrs
    trials = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("status")
              or t.state != optuna.trial.TrialState.COMPLETE]
    rows = [_row(attrs, t) for t in trials if t.user_attrs.get("layout")
            and (include_infeasible or t.user_attrs.get("status") != "infeasible")]
    frame = pd.DataFrame(rows, columns=["trial", *TABLE_COLUMNS, "predicted_tokens_per_sec_per_gpu",
                                        "predicted_peak_memory_gib", "reason", "mlflow_run_id"])
    if frame.empty:
        return frame
    frame["_ok"] = frame["status"].eq("ok")
    frame = frame.sort_values(["_ok", "tokens_per_sec_per_gpu", "trial"], ascending=[False, False, True],
                              na_position="last").drop(columns="_ok")
    return frame.reset_index(drop=True)


def replay_table(study: optuna.Study) -> pd.DataFrame:
    """The trials that ran, in the replay backend's CSV format (issue 8)."""
    frame = leaderboard(study, include_infeasible=False)
    return frame[frame["status"].isin(MEASURED)][TABLE_COLUMNS] if not frame.empty else frame[TABLE_COLUMNS]
