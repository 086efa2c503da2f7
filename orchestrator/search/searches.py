"""Each search of orchestrator.search.table.SEARCH_KINDS made into its sampler: the sweep's side of that table.

`make_sampler(name, space, prior, seed)` is what the sweep's session calls; a search named in the table without a
maker here is refused in one line (and tests/orchestrator/test_conformance.py fails first).
"""

from __future__ import annotations

import random
from typing import Callable

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.search.prior import Prior
from orchestrator.search.samplers import CalibratedSampler, OrderedSampler, SweepSampler, TPESearch, nemo_grid_order
from orchestrator.search.space import SweepSpace
from orchestrator.search.table import SEARCH_KINDS

__all__ = ["MAKERS", "make_sampler"]

# (space, prior, seed, runnable candidates) -> the Optuna sampler (with SweepSampler's hooks)
Maker = Callable[[SweepSpace, Prior, "int | None", list[Layout]], SweepSampler]


def _feasible(prior: Prior, candidates: list[Layout]) -> list[Layout]:
    """The baselines walk the layouts the sweep's screen would let through (legal, predicted to fit)."""
    return [lay for lay in candidates if prior.predict(lay).feasible]


def _calibrated(space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout]) -> SweepSampler:
    return CalibratedSampler(space, prior, seed, candidates)


def _tpe(space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout]) -> SweepSampler:  # noqa: ARG001
    return TPESearch(seed)


def _random(space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout]) -> SweepSampler:
    feasible = _feasible(prior, candidates)
    return OrderedSampler(space, random.Random(seed).sample(feasible, len(feasible)))


def _grid(space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout]) -> SweepSampler:  # noqa: ARG001
    return OrderedSampler(space, nemo_grid_order(_feasible(prior, candidates)))


MAKERS: dict[str, Maker] = {"calibrated": _calibrated, "tpe": _tpe, "random": _random, "grid": _grid}


def make_sampler(search: str, space: SweepSpace, prior: Prior, seed: int | None,
                 runnable: Callable[[Layout], bool] | None = None) -> SweepSampler:
    """`runnable`: whether a layout can run at all here (e.g. its proxy fits in trial_gpus); the layout
    samplers propose only those."""
    maker = MAKERS.get(search) if search in SEARCH_KINDS else None
    if maker is None:
        raise SpecError(f"unknown search {search!r}; allowed: {', '.join(SEARCH_KINDS)}")
    return maker(space, prior, seed, [lay for lay in prior.candidates if runnable is None or runnable(lay)])
