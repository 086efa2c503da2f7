"""The search as the sweep holds it: one object that owns the prior, the space and the sampler.

The sweep asks it for the next proposal (`propose`: Optuna's ask, the layout its params name, the cost model's
prediction) and for the trials to seed a new study with (`seeds`); it never reaches into the prior, the space or the
sampler itself, so what a search is can change here without the loop knowing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import optuna

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.records import TrialRecord
from orchestrator.search.prior import Prediction, Prior
from orchestrator.search.samplers import SweepSampler
from orchestrator.search.searches import make_sampler
from orchestrator.search.space import SweepSpace


@dataclass
class Proposed:
    """One proposal: the trial Optuna asked for, what it stored when queued, and the layout its params name with the
    cost model's prediction (or why they name no layout)."""
    trial: optuna.Trial
    queued: TrialRecord
    """What the trial stored before it was asked (a rule of thumb's or a re-run's attributes)."""
    layout: Layout | None
    prediction: Prediction | None
    invalid: str | None = None
    """Why the params are not even a valid Layout (e.g. GBS not a multiple of MBS)."""


@dataclass
class Proposer:
    prior: Prior
    space: SweepSpace
    sampler: SweepSampler

    @classmethod
    def make(cls, search: str, prior: Prior, seed: int | None,
             runnable: Callable[[Layout], bool] | None = None) -> "Proposer":
        """The search `search` (orchestrator.search.table) over the prior's space; `runnable`: whether a layout can
        run at all here (the layout samplers propose only those)."""
        space = SweepSpace.from_prior(prior)
        return cls(prior, space, make_sampler(search, space, prior, seed, runnable=runnable))

    @property
    def exhausted(self) -> bool:
        """Nothing untried is left to propose."""
        return self.sampler.exhausted

    @property
    def memory_margin(self) -> float:
        return self.sampler.memory_margin

    def propose(self, study: Any) -> Proposed:
        """Ask `study` (the study, or the sweep's in-memory copy of it) for a trial over the space's parameters."""
        trial = study.ask(self.space.distributions())
        queued = TrialRecord.of(trial)
        if queued.proposed_by is None and self.exhausted:  # sampled from nothing: the sweep stops asking
            return Proposed(trial, queued, None, None)
        try:
            layout = self.space.layout(trial.params)
        except SpecError as exc:
            return Proposed(trial, queued, None, None, invalid=str(exc))
        return Proposed(trial, queued, layout, self.prior.predict(layout))

    def seeds(self) -> list[tuple[dict[str, Any], str]]:
        """The params of the trials a new study starts with, and who proposed each: the layouts carried from a
        previous length, then the rules of thumb (Prior.seeds)."""
        carried = {lay.replace(**self.prior.pinned) for lay in self.prior.carried}
        return [(self.space.params(seed), "previous length" if seed in carried else "rule-of-thumb")
                for seed in self.prior.seeds()]


__all__ = ["Proposed", "Proposer"]
