"""Proposals: Optuna samples each free dimension on its own, the orchestrator builds the Layout.

Sampling per dimension (not from the list of legal layouts) lets the sampler wander outside the legal
space; the cost model then rejects such proposals for free (told to Optuna as infeasible), and TPE learns
to avoid them. The first trials are the rules of thumb; when TPE repeats itself, the untried layout the
cost model likes best is proposed instead.
"""

from __future__ import annotations

import random
from typing import Any

import optuna

from search_spaces.errors import SpecError
from search_spaces.layout import Layout

from orchestrator.prior import Prior

# The dimensions as Optuna parameters (primitive values), read off a Layout.
_GETTERS = {
    "recompute": lambda lay: lay.recompute,
    "cuda_graphs": lambda lay: ",".join(lay.cuda_graphs) or "none",
    "optimizer_offload": lambda lay: float(lay.optimizer_offload),
}


def param_value(layout: Layout, dim: str) -> Any:
    return _GETTERS[dim](layout) if dim in _GETTERS else getattr(layout, dim)


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    # multivariate: layout dimensions interact (TP·CP·PP must divide the world...)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8)


class LayoutProposer:
    """Turns Optuna trials into Layouts over the sweep's free dimensions."""

    def __init__(self, prior: Prior, free: list[str], seed: int | None = None, n_seeds: int = 4):
        self.prior = prior
        self.seeds = prior.seeds(limit=n_seeds)
        dims = prior.dimensions
        self.base = self.seeds[0] if self.seeds else _first_layout(dims)
        self.choices: dict[str, list[Any]] = {}
        for dim in free:
            values = {_param(dim, v) for v in dims.get(dim, [])} | {param_value(s, dim) for s in self.seeds}
            if len(values) > 1:
                self.choices[dim] = sorted(values, key=_sort_key)
        self._rng = random.Random(seed)
        self._ranked: list[Layout] | None = None

    # ---- Layout <-> params ---------------------------------------------------------------------
    def params_of(self, layout: Layout) -> dict[str, Any]:
        return {dim: param_value(layout, dim) for dim in self.choices}

    def layout_of(self, params: dict[str, Any]) -> Layout:
        """Raises SpecError when the combination is not even a valid Layout (e.g. gbs % mbs)."""
        return self.base.replace(**params)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        return {dim: trial.suggest_categorical(dim, values) for dim, values in self.choices.items()}

    # ---- what to try first / instead -----------------------------------------------------------
    def enqueue_seeds(self, study: optuna.Study) -> None:
        for seed in self.seeds:
            study.enqueue_trial(self.params_of(seed), user_attrs={"proposed_by": "rule-of-thumb"},
                                skip_if_exists=True)

    def instead_of(self, repeated: Layout, tried: set[str], attempts: int = 50) -> tuple[dict | None, str]:
        """Params to propose instead of a repeat: the best untried layout by the cost model, else a random
        one-dimension mutation of the repeated layout (it may be illegal: then the cost model rejects it)."""
        best = self.best_untried(tried)
        if best is not None:
            return self.params_of(best), "cost-model"
        params = self.params_of(repeated)
        for _ in range(attempts):
            if not self.choices:
                break
            dim = self._rng.choice(sorted(self.choices))
            trial = {**params, dim: self._rng.choice(self.choices[dim])}
            try:
                if self.layout_of(trial).key() not in tried:
                    return trial, "mutation"
            except SpecError:
                return trial, "mutation"
        return None, ""

    def best_untried(self, tried: set[str]) -> Layout | None:
        """The feasible layout with the highest predicted throughput not tried yet."""
        if self._ranked is None:
            ranked = []
            for cand in self.prior.ranked():
                try:
                    ranked.append(self.layout_of(self.params_of(cand)))
                except SpecError:
                    continue
            self._ranked = list(dict.fromkeys(ranked))
        for lay in self._ranked:
            if lay.key() not in tried:
                return lay
        return None


def _param(dim: str, value: Any) -> Any:
    """A space value as an Optuna categorical choice."""
    if dim == "cuda_graphs":
        return (",".join(value) if isinstance(value, (list, tuple)) else value) or "none"
    if dim == "optimizer_offload":
        return float(value)
    if dim == "recompute":
        return Layout().replace(recompute=value).recompute  # canonical spelling
    return value


def _first_layout(dims: dict[str, list[Any]]) -> Layout:
    values = {k: v[0] for k, v in dims.items() if v}
    values["mbs"] = min(dims.get("mbs") or [1])
    return Layout().replace(**values)


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))
