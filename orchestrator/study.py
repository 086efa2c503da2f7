"""The Optuna study: objectives, storage, and the read side (best, Pareto, leaderboard).

What the storage holds of the study and of each trial is the storage contract of orchestrator/records/
(StudyRecord, TrialRecord); this module reads it through those records only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
import pandas as pd
import sqlalchemy.exc

from search_spaces.errors import SpecError
from search_spaces.result import MEASURED_STATUSES

from orchestrator import connections, economics, journal, sqlite_tuning, stores
from orchestrator.errors import StorageError, StorageFull
from orchestrator.records import LEADERBOARD_COLUMNS, TABLE_COLUMNS, StudyRecord, TrialRecord, row
from orchestrator.redact import redact_uri

DIRECTIONS: list[Literal["maximize", "minimize"]] = ["maximize", "minimize"]

optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_storage(url: str, attempts: int = 10, create: bool = True) -> optuna.storages.BaseStorage:
    """The Optuna storage at `url`, every connection bounded (orchestrator/connections.py). A missing SQLite file
    is created all at once (`create`; stores.create_sqlite): a failure leaves no file behind. A `journal:///` URL
    is Optuna's journal file (orchestrator/journal.py), opened for appending when `create`."""
    if journal.is_journal_url(url):
        try:
            return journal.open_journal(journal.check_url(url), url, write=create)
        except OSError as exc:  # a full disk or a refusing folder as the journal is made or its torn tail cut
            raise storage_failure(exc, url, "cannot create" if create else "cannot read") from None
    sqlite_tuning.install()
    path = store_path(url)
    if create and path is not None:
        try:
            stores.create_sqlite(path, _optuna_schema)
        except Exception as exc:  # noqa: BLE001 -- a full disk, a folder that refuses the file
            raise storage_failure(exc, url, "cannot create") from None
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=connections.engine_kwargs(url))
        except Exception as exc:  # noqa: BLE001 -- read below: a schema race is retried, the rest re-raised
            text = str(exc)
            # two sweeps creating one new database server's schema at once race: the loser retries (a SQLite file
            # is created whole, above; "locked" was already waited for, SQLITE_BUSY_S)
            racing = path is None and (isinstance(exc, sqlalchemy.exc.IntegrityError) or (
                isinstance(exc, sqlalchemy.exc.OperationalError) and "already exists" in text))
            if racing and attempt + 1 < attempts:
                time.sleep(0.2 + 0.1 * attempt)
                continue
            failure = storage_failure(exc, url)
            if isinstance(failure, StorageFull):
                raise failure from None
            raise connections.unreachable(url, exc, "Optuna storage", StorageError) from None
    raise AssertionError("unreachable")


def _optuna_schema(url: str) -> None:
    """Optuna's tables in a new SQLite file (stores.create_sqlite links it into place)."""
    from sqlalchemy.pool import NullPool

    # no pool: a connection is closed as soon as it is let go, also when the creation fails half way
    storage = optuna.storages.RDBStorage(url, engine_kwargs={**connections.engine_kwargs(url), "poolclass": NullPool})
    storage.scoped_session.remove()
    storage.engine.dispose()


def check_storage(url: str, resume: bool = False) -> None:
    """The storage a sweep will write, checked before anything is created: a SQLite file (or its folder) that
    refuses writes or is held locked, a database server that cannot be reached (within the bounds) is one line;
    so is a --resume whose storage is not there."""
    connections.probe_sql(url, "Optuna storage", StorageError)
    if resume:
        _require_existing(url, "nothing to resume")
    stores.require_writable(url, "Optuna storage", store_path(url))


# what a storage raises when it cannot take a write or answer a read (Optuna wraps SQLAlchemy's errors; a journal's
# append is a file write: OSError)
STORAGE_ERRORS = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError, OSError)


def storage_failure(exc: BaseException, url: str, doing: str = "") -> StorageError:
    """One line for a failed storage write: a full disk names its device (Optuna's own message, "exceeding
    max length", would mislead), a store that refuses writes or is locked says so, anything else its first
    line. `doing`: what failed ("cannot create": nothing was stored)."""
    shown = redact_uri(url)
    if stores.disk_full(exc, store_path(url)):
        kept = ("nothing was stored; free space and rerun" if doing else
                "what was measured is kept (in the storage, or in the result spool); free space and rerun with "
                "--resume")
        return StorageFull(f"the Optuna storage's disk is full: {stores.device(store_path(url), url)}; {kept}")
    line = _root_line(exc)
    low = line.lower()
    if "readonly" in low or "read-only" in low or "permission denied" in low:
        return StorageError(f"the Optuna storage {shown} refuses writes: {line} (a read-only or immutable file "
                            "or folder: make it writable, or use another --storage)")
    if "locked" in low:
        return StorageError(f"the Optuna storage {shown} is locked by another process: {line} (waited "
                            f"{connections.SQLITE_BUSY_S} s; stop it or wait, then rerun)")
    if doing:
        return StorageError(f"{doing} the Optuna storage {shown}: {redact_uri(line)}")
    return StorageError(f"the Optuna storage {shown} failed: {redact_uri(line)}")


def _root_line(exc: BaseException) -> str:
    """The first line of the innermost cause (SQLAlchemy's and Optuna's wrappers say less)."""
    return connections.root_line(exc)[:300]


def store_path(url: str) -> Path | None:
    """The file a SQLite or journal storage URL names (None for a database server; a journal URL of another form:
    one SpecError line)."""
    return journal.check_url(url) if journal.is_journal_url(url) else stores.sqlite_file(url)


def _require_existing(url: str, hint: str) -> None:
    """The storage holds Optuna's tables, or is a journal (a SpecError line when it is not, or is missing)."""
    if journal.is_journal_url(url):
        journal.require_journal(journal.check_url(url), "Optuna storage", redact_uri(url), f" ({hint})")
    else:
        store_path(url)  # a path no file can have: one line before the file system is asked
        stores.require_existing(url, stores.OPTUNA_TABLE, "Optuna storage", hint)


LEASE_CLAIM_MARK = ":lease-claim-"  # a study name never holds ':' (search_spaces/inputs.check_name)


def lease_claim_name(study_name: str, epoch: int) -> str:
    """The name of the study a driver creates to claim `epoch` of `study_name`'s lease (orchestrator/sweep/lease.py):
    it never clashes with a study's name, and the stores' readers never show it."""
    return f"{study_name}{LEASE_CLAIM_MARK}{epoch}"


def stored_studies(storage: optuna.storages.BaseStorage) -> list[Any]:
    """The storage's studies (name and attributes), oldest first, without their trials: Optuna's study summaries
    read and copy every trial of every study to count them (seconds for a storage of a few sweeps). A lease's claim
    (lease_claim_name), alive while a driver takes the lease, is no study of ours."""
    return [s for s in storage.get_all_studies() if LEASE_CLAIM_MARK not in s.study_name]


def check_study(storage: optuna.storages.BaseStorage, storage_url: str, name: str, resume: bool):
    """Refuse (SpecError) a new sweep of a study that exists (nothing is overwritten) and a --resume of one that does
    not; the existing study (its name and attributes, stored_studies), or None. Asked before anything else is
    created (the MLflow store)."""
    found = next((s for s in stored_studies(storage) if s.study_name == name), None)
    shown = redact_uri(storage_url)
    if found is not None and not resume:
        raise SpecError(_already(name, shown))
    if found is None and resume:
        raise SpecError(f"no study {name!r} in {shown} to resume")
    return found


def _already(name: str, shown: str) -> str:
    return f"study {name!r} already exists in {shown}; pass --resume to continue it or --study-name for a new one"


def create_or_resume(storage: optuna.storages.BaseStorage, storage_url: str, name: str, sampler,
                     resume: bool) -> tuple[optuna.Study, bool]:
    """Returns (study, existed); refusals as check_study. A study whose setup never finished (created, then the
    storage failed before its spec was recorded: no spec, no trial) is set up again by --resume, as a new one (the
    lease's claim decides between two drivers that find it)."""
    found = check_study(storage, storage_url, name, resume)
    if found is not None:  # reading it writes nothing: a store that refuses writes says so at the first write
        set_up = bool(found.user_attrs.get("spec") or storage.get_n_trials(storage.get_study_id_from_name(name)))
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler), set_up
    try:  # a second sweep creating the same name at the same moment loses here, not by sharing the study
        study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, directions=DIRECTIONS)
    except optuna.exceptions.DuplicatedStudyError:
        raise SpecError(_already(name, redact_uri(storage_url))) from None
    return study, False


def open_existing_storage(url: str) -> optuna.storages.BaseStorage:
    """The storage a read-only command names (status, check, export, report, promote, calibrate): it must
    already hold Optuna's tables; a missing sqlite file or an empty database is one line, and none is created."""
    _require_existing(url, "run a sweep first, or pass --storage")
    return open_storage(url, create=False)


def load_study(storage: str, study_name: str | None = None) -> optuna.Study:
    """A study of an existing storage (the newest when unnamed); a SpecError naming what is missing."""
    store = open_existing_storage(storage)
    names = [s.study_name for s in stored_studies(store)]
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
    names = [s.study_name for s in stored_studies(store)
             if StudyRecord.of(s).family == name and s.study_name != name]
    members = [optuna.load_study(study_name=n, storage=store) for n in names]
    return sorted(members, key=lambda s: int(StudyRecord.of(s).seq_len or 0))


@dataclass(frozen=True)
class StoredTrial:
    """A trial another driver left running, as something TrialRecord.write can store attributes on (Optuna's
    Trial would call the sampler's before_trial; a FrozenTrial keeps its id private)."""
    storage: optuna.storages.BaseStorage
    trial_id: int

    def set_user_attr(self, key: str, value: object) -> None:
        self.storage.set_trial_user_attr(self.trial_id, key, value)


def running_trial(storage: optuna.storages.BaseStorage, study: optuna.Study, number: int) -> StoredTrial:
    """Trial `number` of `study`, found through the storage's public lookups."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return StoredTrial(storage, storage.get_trial_id_from_study_id_trial_number(study_id, number))


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
