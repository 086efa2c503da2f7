"""The searches by name (`search:` in a spec, `sweep --search`), like Ray Tune's one table of searchers.

`SEARCH_KINDS` is the one table: the spec's `search` choices, the CLI help and the README's list derive from it.
A new search is one `SearchKind` below plus its sampler (orchestrator/sweep/samplers.py), which implements the
loop's hooks (samplers.SweepSampler); tests/test_conformance.py runs it through the common contract at once.
The samplers are imported only when one is made (a spec names its search without loading the sweep).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

if TYPE_CHECKING:
    from orchestrator.sweep.prior import Prior
    from orchestrator.sweep.samplers import SweepSampler
    from orchestrator.sweep.space import SweepSpace

__all__ = ["DEFAULT_SEARCH", "SEARCH_KINDS", "SearchKind", "choices_help", "make_sampler"]


@dataclass(frozen=True)
class SearchKind:
    name: str
    """The name a spec's `search:` and `sweep --search` take (and trials record as proposed_by)."""
    doc: str
    """What it proposes, in a few words (CLI help, README)."""
    make: Callable[["SweepSpace", "Prior", "int | None", list[Layout]], "SweepSampler"]
    """(space, prior, seed, runnable candidates) -> the Optuna sampler (with SweepSampler's hooks)."""


def _calibrated(space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout]) -> SweepSampler:
    from orchestrator.sweep.samplers import CalibratedSampler
    return CalibratedSampler(space, prior, seed, candidates)


def _tpe(space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout]) -> SweepSampler:
    from orchestrator.sweep.samplers import TPESearch
    return TPESearch(seed)


def _feasible(prior: Prior, candidates: list[Layout]) -> list[Layout]:
    """The baselines walk the layouts the sweep's screen would let through (legal, predicted to fit)."""
    return [lay for lay in candidates if prior.predict(lay).feasible]


def _random(space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout]) -> SweepSampler:
    from orchestrator.sweep.samplers import OrderedSampler
    feasible = _feasible(prior, candidates)
    return OrderedSampler(space, random.Random(seed).sample(feasible, len(feasible)))


def _grid(space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout]) -> SweepSampler:
    from orchestrator.sweep.samplers import OrderedSampler, nemo_grid_order
    return OrderedSampler(space, nemo_grid_order(_feasible(prior, candidates)))


SEARCH_KINDS: dict[str, SearchKind] = {kind.name: kind for kind in (
    SearchKind("calibrated", "the cost model's ranking, corrected from every measurement (default)", _calibrated),
    SearchKind("tpe", "Optuna's multivariate TPE over the dimensions", _tpe),
    SearchKind("random", "the legal layouts predicted to fit, in a seeded random order", _random),
    SearchKind("grid", "the legal layouts predicted to fit, in NeMo Auto-Configurator's loop order", _grid),
)}
DEFAULT_SEARCH = next(iter(SEARCH_KINDS))


def choices_help() -> str:
    """`name (what it is) | ...` for help texts."""
    return " | ".join(f"{k.name} ({k.doc})" for k in SEARCH_KINDS.values())


def make_sampler(search: str, space: SweepSpace, prior: Prior, seed: int | None,
                 runnable: Callable[[Layout], bool] | None = None) -> SweepSampler:
    """`runnable`: whether a layout can run at all here (e.g. its proxy fits in trial_gpus); the layout
    samplers propose only those."""
    kind = SEARCH_KINDS.get(search)
    if kind is None:
        raise SpecError(f"unknown search {search!r}; allowed: {', '.join(SEARCH_KINDS)}")
    return kind.make(space, prior, seed, [lay for lay in prior.candidates if runnable is None or runnable(lay)])
