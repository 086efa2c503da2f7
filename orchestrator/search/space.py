"""The sweep's search parameters: one categorical Optuna parameter per searchable layout dimension.

A trial's params are the layout's encoded values (`Layout.params`), so every trial in the storage names its
whole layout and any sampler (ours or Optuna's) sees the same parameters. Fields that are not searched
(the global batch, recompute method, ...) come from `base`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna

from search_spaces.layouts.dimensions import Primitive
from search_spaces.layouts.layout import BY_NAME, SEARCH_DIMENSIONS, Layout

from orchestrator.search.prior import Prior


@dataclass(frozen=True)
class SweepSpace:
    base: Layout
    choices: dict[str, tuple[Primitive, ...]]  # encoded values per searchable dimension, in a stable order

    @classmethod
    def from_prior(cls, prior: Prior) -> "SweepSpace":
        """The values each dimension takes in the prior's space, plus those of its rules of thumb."""
        choices: dict[str, tuple[Primitive, ...]] = {}
        for name in SEARCH_DIMENSIONS:
            dim = BY_NAME[name]
            values = prior.dimensions.get(name) or [getattr(prior.base, name)]
            encoded = {dim.encode(dim.parse(v)) for v in values}
            encoded |= {dim.encode(getattr(s, name)) for s in prior.seeds()}
            choices[name] = tuple(sorted(encoded, key=_order))
        return cls(prior.base, choices)

    def layout(self, params: dict[str, Any]) -> Layout:
        """The layout a trial's params name (SpecError when they are not a valid Layout, e.g. gbs % mbs)."""
        return Layout.from_params(params, base=self.base)

    def params(self, layout: Layout) -> dict[str, Primitive]:
        return layout.params(self.choices)

    def contains(self, layout: Layout) -> bool:
        return all(value in self.choices[name] for name, value in self.params(layout).items())

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:  # as Study.ask takes them
        return {name: optuna.distributions.CategoricalDistribution(values) for name, values in self.choices.items()}


def _order(value: Primitive) -> tuple:
    """Numbers by value, then names alphabetically (Optuna needs a fixed order of choices)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value))
