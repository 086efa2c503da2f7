"""The study in its store, whatever the store's kind (orchestrator/storage/base.StudyStore): opened, checked, created or
resumed, loaded by name; the storage failures of a sweep as one line each. The study's read side (best, Pareto,
leaderboard) is orchestrator/records/queries.py."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc

from search_spaces.errors import SpecError

from orchestrator.errors import StorageError
from orchestrator.records import StudyRecord
from orchestrator.records.queries import DIRECTIONS, METRIC_NAMES
from orchestrator.redact import redact_uri
from orchestrator.storage import study_store

optuna.logging.set_verbosity(optuna.logging.WARNING)

StudyStorage = optuna.storages.BaseStorage  # what an opened study store is, for the rooms that hold one


def in_memory() -> optuna.storages.BaseStorage:
    """A storage in this process's memory only (a report's or a sweep's working copy of a study)."""
    return optuna.storages.InMemoryStorage()

# what a storage raises when it cannot take a write or answer a read (Optuna wraps SQLAlchemy's errors; a journal's
# append is a file write: OSError)
STORAGE_ERRORS = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError, OSError)


def open_storage(url: str, attempts: int = 10, create: bool = True) -> optuna.storages.BaseStorage:
    """The Optuna storage at `url`, every connection bounded (StudyStore.open). `create`: a sweep will write (a
    missing file is made whole first)."""
    return study_store(url).open(create, attempts)


def check_storage(url: str, resume: bool = False) -> None:
    """The storage a sweep will write, checked before anything is created: a file (or its folder) that refuses
    writes or is held locked, a database server that cannot be reached (within the bounds) is one line; so is a
    --resume whose storage is not there."""
    study_store(url).check(resume)


def storage_failure(exc: BaseException, url: str, doing: str = "") -> StorageError:
    """One line for a failed storage write (StudyStore.failure)."""
    return study_store(url).failure(exc, doing)


def store_path(url: str) -> Path | None:
    """The file a storage URL names (None for a database server; a URL of a file no path can be: a SpecError)."""
    return study_store(url).path


def may_be_held(url: str) -> bool:
    """Can another process hold the store at `url` open now (StudyStore.may_be_held)?"""
    return study_store(url).may_be_held()


def open_existing_storage(url: str) -> optuna.storages.BaseStorage:
    """The storage a read-only command names (status, check, export, report, promote, calibrate): it must
    already hold Optuna's tables; a missing file or an empty database is one line, and none is created."""
    store = study_store(url)
    store.require_existing("run a sweep first, or pass --storage")
    return store.open(create=False)


LEASE_CLAIM_MARK = ":lease-claim-"  # in the name of a lease's claim (orchestrator/sweep/lease.py, claim_name): a
# study name never holds ':' (search_spaces/inputs.check_name), so the stores' readers never show a claim


def stored_studies(storage: optuna.storages.BaseStorage) -> list[Any]:
    """The storage's studies (name and attributes), oldest first, without their trials: Optuna's study summaries
    read and copy every trial of every study to count them (seconds for a storage of a few sweeps). A lease's claim
    (LEASE_CLAIM_MARK), alive while a driver takes the lease, is no study of ours."""
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


def open_checked(url: str, name: str, resume: bool) -> optuna.storages.BaseStorage:
    """The storage a sweep of study `name` will write, opened once it is checked (check_storage) and known to hold
    the study for --resume, or not to hold it for a new sweep (check_study): nothing is created before."""
    check_storage(url, resume)
    storage = open_storage(url)
    check_study(storage, url, name, resume)  # already there, or nothing to resume
    return storage


def let_go(storage: optuna.storages.BaseStorage) -> None:
    """Close the storage's pooled database connections (a sweep's end), so that none is left for the garbage collector
    to close later, at a moment nobody chose (SQLite then rewrites its -shm file). The storage stays usable: a later
    read opens a new connection. A journal file holds no connection."""
    engine = getattr(storage, "engine", None)
    if engine is not None:
        storage.scoped_session.remove()  # type: ignore[attr-defined]  # RDBStorage's, beside its engine
        engine.dispose()


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


def name_metrics(study: optuna.Study) -> None:
    """Name the study's objectives in Optuna (METRIC_NAMES: optuna-dashboard and Optuna's plots show them), once: a
    study made before they were named gets them on --resume."""
    if study.metric_names != METRIC_NAMES:
        with warnings.catch_warnings():  # experimental since Optuna 3.2, and stable in use since
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRIC_NAMES)


def load_study(storage: str, study_name: str | None = None) -> optuna.Study:
    """A study of an existing storage (the newest when unnamed); a SpecError naming what is missing."""
    store = open_existing_storage(storage)
    return optuna.load_study(study_name=study_named(store, storage, study_name), storage=store)


def study_named(store: optuna.storages.BaseStorage, storage: str, study_name: str | None) -> str:
    """The name of study `study_name` of the opened `store` (URL `storage`), the newest when None; a SpecError naming
    what is missing."""
    names = [s.study_name for s in stored_studies(store)]
    if study_name is None:
        if not names:
            raise SpecError(f"no study in {redact_uri(storage)}")
        study_name = names[-1]
    if study_name not in names:
        raise SpecError(f"no study {study_name!r} in {redact_uri(storage)}; found: {', '.join(names) or 'none'}")
    return study_name


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

    def report(self, step: int, value: float) -> None:
        """Store `value` as the trial's intermediate value at `step` (Optuna's `Trial.report` refuses a study of two
        objectives; the storage's public API does not). A step stored before is overwritten."""
        self.storage.set_trial_intermediate_value(self.trial_id, step, value)

    def frozen(self) -> optuna.trial.FrozenTrial:
        """The trial as stored now (its intermediate values included), as a pruner reads it."""
        return self.storage.get_trial(self.trial_id)


def running_trial(storage: optuna.storages.BaseStorage, study: optuna.Study, number: int) -> StoredTrial:
    """Trial `number` of `study`, found through the storage's public lookups."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return StoredTrial(storage, storage.get_trial_id_from_study_id_trial_number(study_id, number))
