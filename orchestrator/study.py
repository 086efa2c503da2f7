"""The Optuna study: objectives, storage, and the read side (best, Pareto, leaderboard).

What the storage holds of the study and of each trial is the storage contract of orchestrator/records.py
(StudyRecord, TrialRecord); this module reads it through those records only.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

import optuna
import pandas as pd
import psutil
import sqlalchemy.exc

from search_spaces.errors import SpecError
from search_spaces.result import MEASURED_STATUSES

from orchestrator import economics, sqlite_tuning
from orchestrator.errors import StorageError, StorageFull
from orchestrator.records import LEADERBOARD_COLUMNS, TABLE_COLUMNS, StudyRecord, TrialRecord, row
from orchestrator.redact import redact_uri

DIRECTIONS = ["maximize", "minimize"]

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
            failure = storage_failure(exc, url)
            if isinstance(failure, StorageFull):
                raise failure from None
            raise StorageError(redact_uri(f"cannot open storage {url!r}: {_root_line(exc)}")) from None
    raise AssertionError("unreachable")


# what a storage write raises when the database cannot take it (Optuna wraps SQLAlchemy's errors)
STORAGE_ERRORS = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError, OSError)


def storage_failure(exc: BaseException, url: str) -> StorageError:
    """One line for a failed storage write: a full disk names its device (Optuna's own message, "exceeding
    max length", would mislead), anything else its first line."""
    chain, seen = [], exc
    while seen is not None:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " | ".join(str(e) for e in chain).lower()
    if "disk is full" in text or "no space left" in text or any(
            getattr(e, "errno", None) == errno.ENOSPC for e in chain):
        return StorageFull(f"the Optuna storage's disk is full: {_device(url)}; what was measured is kept "
                           f"(in the storage, or in the result spool); free space and rerun with --resume")
    return StorageError(f"the Optuna storage {url!r} failed: {_root_line(exc)}")


def _root_line(exc: BaseException) -> str:
    """The first line of the innermost cause (SQLAlchemy's and Optuna's wrappers say less)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def sqlite_path(url: str) -> Path | None:
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None


def _device(url: str) -> str:
    path = sqlite_path(url)
    if path is None:
        return f"the database server of {url}"
    where = Path(os.path.realpath(path.parent if path.parent.exists() else "."))
    mounts = [p for p in psutil.disk_partitions(all=True) if str(where).startswith(p.mountpoint)]
    mount = max(mounts, key=lambda p: len(p.mountpoint)) if mounts else None
    free = shutil.disk_usage(where).free / 2 ** 20
    device = f"{mount.device} mounted at {mount.mountpoint}" if mount else str(where)
    return f"{device} ({free:.1f} MiB free) holding {path}"


def create_or_resume(storage: optuna.storages.BaseStorage, storage_url: str, name: str, sampler,
                     resume: bool) -> tuple[optuna.Study, bool]:
    """Returns (study, existed). Without --resume an existing study is refused (nothing is overwritten)."""
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


def open_existing_storage(url: str) -> optuna.storages.BaseStorage:
    """The storage a read-only command names (status, check, export, report, promote, calibrate): it must
    already hold Optuna's tables; a missing sqlite file or an empty database is one line, and none is created."""
    from orchestrator.stores import OPTUNA_TABLE, require_existing

    require_existing(url, OPTUNA_TABLE, "Optuna storage", "run a sweep first, or pass --storage")
    return open_storage(url)


def load_study(storage: str, study_name: str | None = None) -> optuna.Study:
    """A study of an existing storage (the newest when unnamed); a SpecError naming what is missing."""
    store = open_existing_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    if study_name is None:
        if not names:
            raise SpecError(f"no study in {redact_uri(storage)}")
        study_name = names[-1]
    if study_name not in names:
        raise SpecError(f"no study {study_name!r} in {redact_uri(storage)}; found: {', '.join(names) or 'none'}")
    return optuna.load_study(study_name=study_name, storage=store)


def family_members(storage: str, name: str) -> list[optuna.Study]:
    """The studies of length family `name` (one per sequence length), shortest first; [] when it is none."""
    store = open_existing_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)
             if StudyRecord.of(s).family == name and s.study_name != name]
    members = [optuna.load_study(study_name=n, storage=store) for n in names]
    return sorted(members, key=lambda s: int(StudyRecord.of(s).seq_len or 0))


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]


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
    """Best measured tokens/s among status ok trials that fit the GPU memory."""
    ok = [t for t in finished_trials(study) if fits(t)]
    return max(ok, key=lambda t: t.values[0], default=None)


def gpu_hours(study: optuna.Study) -> tuple[float, float]:
    """(GPU-hours the study's trials used, GPU-hours the same trials would have used at full size)."""
    used = full = 0.0
    for record in measured_records(study):
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
