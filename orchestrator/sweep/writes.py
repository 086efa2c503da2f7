"""Where the sweep loop asks and tells, and when what it told reaches the storage.

    DirectWrites      the study itself: every write is stored as it is made (a trial that runs a trainer stores
                      its layout before it runs, and its result before MLflow hears of it)
    WholeTrialWrites  an analytic sweep: once the study's queue is empty, the loop asks and tells on an in-memory
                      copy of the study, and each finished trial is stored whole, in one transaction, once every
                      trial before it is stored

Why: an analytic trial is the cost model's answer, microseconds of work, while storing it write by write costs
about 35 transactions (Optuna commits each parameter and attribute on its own: 21 parameters, a dozen attributes,
the tell), most of a 200-trial what-if sweep. Stored whole, a trial is one transaction (Optuna's
`create_new_trial` with the finished trial as its template), so it is in the storage complete or not at all.

What does not change: trial numbers are the storage's (the copy starts from every stored trial, and its trials are
stored in number order); the queue (rules of thumb, re-runs) is taken from the storage itself, write by write,
before the copy starts; every write passes the lease's fence; MLflow gets each trial once it is stored. What a
killed analytic sweep loses is the answers not yet stored, which --resume asks again (a child run begun for one
is reused, or closed as superseded, by the resume: orchestrator/tracking/tracker.py).
"""

from __future__ import annotations

from typing import Callable, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from orchestrator.errors import LeaseLost
from orchestrator.storage import studies

_UNFINISHED = (TrialState.WAITING, TrialState.RUNNING)


class SweepWrites(Protocol):
    @property
    def study(self) -> optuna.Study:
        """Where the loop asks for its next trial."""

    def direct(self, trial: optuna.Trial) -> bool:
        """Each write of `trial` is stored as it is made (its MLflow run may be begun when it starts)."""

    def told(self, trial: optuna.Trial) -> list[int]:
        """`trial` was told: the numbers of the trials stored since the last call, in order."""

    def flush(self) -> list[int]:
        """Store every told trial that can be stored; their numbers, in order."""


class DirectWrites:
    """The study itself: a told trial is already stored."""

    def __init__(self, study: optuna.Study):
        self.study = study

    def direct(self, trial: optuna.Trial) -> bool:
        return True

    def told(self, trial: optuna.Trial) -> list[int]:
        return [trial.number]

    def flush(self) -> list[int]:
        return []


class WholeTrialWrites:
    """The stored study while it has queued or running trials; then an in-memory copy of it whose told trials are
    stored whole, in number order."""

    def __init__(self, stored: optuna.Study, storage: studies.StudyStorage, fence: Callable[[], None]):
        """`storage`: the stored study's storage; `fence`: the lease's, passed before every stored write."""
        self.stored = stored
        self.storage = storage
        self.fence = fence
        self.study_id = storage.get_study_id_from_name(stored.study_name)
        self.copy: optuna.Study | None = None
        self._next = 0  # the first trial of the copy not stored yet
        self._unsure = False  # a store of trial _next was cut short (Ctrl-C): it may have landed
        self._lost: str | None = None  # why this driver stopped storing (another writer's trial)

    @property
    def study(self) -> optuna.Study:
        if self.copy is None and not self.stored.get_trials(deepcopy=False, states=_UNFINISHED):
            trials = self.stored.get_trials(deepcopy=False)
            # no storage named: Optuna keeps the copy in this process's memory
            self.copy = optuna.create_study(sampler=self.stored.sampler,
                                            directions=self.stored.directions, study_name=self.stored.study_name)
            self.copy.add_trials(trials)
            self._next = len(trials)
        return self.copy or self.stored

    def direct(self, trial: optuna.Trial) -> bool:
        return trial.study is not self.copy

    def told(self, trial: optuna.Trial) -> list[int]:
        return [trial.number] if self.direct(trial) else self.flush()

    def flush(self) -> list[int]:
        if self.copy is None:
            return []
        if self._lost:
            raise LeaseLost(self._lost)
        trials = self.copy.get_trials(deepcopy=False)
        stored = []
        if self._unsure and self.storage.get_n_trials(self.study_id) > self._next:  # it landed: never stored twice
            stored.append(self._next)
            self._next += 1
        while self._next < len(trials) and trials[self._next].state.is_finished():
            self._unsure = True
            self._create(trials[self._next])
            self._unsure = False
            stored.append(self._next)
            self._next += 1
        self._unsure = False
        return stored

    def _create(self, trial: FrozenTrial) -> None:
        self.fence()
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=trial)
        # the trial numbered as ours is ours: one indexed lookup (the trial's own number would be read through
        # get_trial, every param and attribute of it)
        if self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number) != trial_id:
            # another writer created a trial: only a driver without the lease could
            self._lost = (f"trial {trial.number} was stored by another writer, this driver's as a later one: another "
                          "driver is writing this study; this driver stops")
            raise LeaseLost(self._lost)


def sweep_writes(study: optuna.Study, storage: studies.StudyStorage, backend: str,
                 fence: Callable[[], None]) -> SweepWrites:
    """Whole-trial writes for an analytic sweep, whose trials are the cost model's answers; direct ones for a
    sweep whose trials run (their layout is stored before they start)."""
    if backend != "analytic":
        return DirectWrites(study)
    return WholeTrialWrites(study, storage, fence)
