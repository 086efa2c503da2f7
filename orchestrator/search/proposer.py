"""The search as the sweep holds it: one object that owns the prior, the space and the sampler.

The sweep asks it for the next proposal (`propose`: Optuna's ask, the layout its params name, the cost model's
prediction) and for the trials to seed a new study with (`seeds`); it never reaches into the prior, the space or the
sampler itself, so what a search is can change here without the loop knowing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import optuna

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.records import PREVIOUS_LENGTH, RULE_OF_THUMB, TrialRecord
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
    exhausted: bool = False
    """Sampled from nothing: every layout of the space has been tried, the sweep stops asking."""


@dataclass
class Proposer:
    prior: Prior
    space: SweepSpace
    sampler: SweepSampler
    memory_limit_gib: float = field(init=False)
    """The memory a GPU has: above it the cost model says a layout does not fit."""
    memory_margin: float = field(init=False)
    """Proposals may exceed the cost model's memory prediction by this factor (the sampler's; the screen lets them
    through)."""

    def __post_init__(self) -> None:
        self.memory_limit_gib = self.prior.memory_limit_gib
        self.memory_margin = self.sampler.memory_margin

    @classmethod
    def make(cls, search: str, prior: Prior, seed: int | None,
             runnable: Callable[[Layout], bool] | None = None) -> "Proposer":
        """The search `search` (orchestrator.search.table) over the prior's space; `runnable`: whether a layout can
        run at all here (the layout samplers propose only those)."""
        space = SweepSpace.from_prior(prior)
        return cls(prior, space, make_sampler(search, space, prior, seed, runnable=runnable))

    def propose(self, study: Any) -> Proposed:
        """Ask `study` (the study, or the sweep's in-memory copy of it) for a trial over the space's parameters."""
        trial = study.ask(self.space.distributions())
        queued = TrialRecord.of(trial)
        if queued.proposed_by is None and self.sampler.exhausted:  # sampled from nothing: the sweep stops asking
            return Proposed(trial, queued, None, None, exhausted=True)
        try:
            layout = self.space.layout(trial.params)
        except SpecError as exc:
            return Proposed(trial, queued, None, None, invalid=str(exc))
        return Proposed(trial, queued, layout, self.prior.predict(layout))

    def chance_of_better(self, study: Any, tried: set[str], best: float, margin: float) -> float | None:
        """The chance that a layout beats the search's answer by more than `margin` (the calibrated search's
        posterior; `best`, the best measured figure, is the bar before it has an answer); None for a search that has
        no model of it."""
        ask = getattr(self.sampler, "chance_of_better", None)
        return ask(study, tried, best, margin) if ask is not None else None

    def answer(self, study: Any) -> Layout | None:
        """The measured layout the search believes fastest (the calibrated search's posterior); None for a search
        that has no model of it, or before anything was measured: then the best measured trial is the answer."""
        ask = getattr(self.sampler, "answer", None)
        return ask(study) if ask is not None else None

    def seeds(self) -> list[tuple[dict[str, Any], str]]:
        """The params of the trials a new study starts with, and who proposed each: the layouts carried from a
        previous length, then the rules of thumb (Prior.seeds)."""
        carried = {lay.replace(**self.prior.pinned) for lay in self.prior.carried}
        return [(self.space.params(seed), PREVIOUS_LENGTH if seed in carried else RULE_OF_THUMB)
                for seed in self.prior.seeds()]


__all__ = ["Proposed", "Proposer"]
