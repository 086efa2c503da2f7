"""When a sweep has converged (issue 59, item 3), and what a sweep that stopped at its budget leaves open.

The calibrated search can say how likely a layout it has not settled beats its answer by more than
`budget.converge_margin` (CalibratedSearch.chance_of_better: posterior draws, measurement noise counted). Once that
chance is below `budget.converge_below` the sweep stops proposing and says so; a sweep that reaches `n_trials` or
`wall_time_s` first says the chance that remains, so that a user reads whether more trials are worth it. Other
searches have no such belief: their sweeps run to the budget.
"""

from __future__ import annotations

from typing import Any, Iterable

from orchestrator.spec.schema import Budget


class Convergence:
    """Asks the search, once per finished trial, how likely a better layout is; the last chance it was told."""

    # the search learns how far layouts stray from their values' effects once 5 are measured
    # (CalibratedSearch._interaction_variance); before that its chance rests on the prior's guess, and a replay table
    # whose rows stray +-15% "converged" after 2 trials, its best row not yet measured
    MIN_TRIALS = 5

    def __init__(self, budget: Budget, search: Any):
        self.budget = budget
        self.search = search  # the session's search (orchestrator.search.proposer): chance_of_better, or None
        self.chance: float | None = None
        self._asked_at = -1  # trials finished when last asked: a pass of the loop that finished none asks nothing

    def check(self, study: Any, finished: int, tried: Iterable[str], best: float, measured: int) -> str | None:
        """The sweep's stop reason once it has converged, else None. `finished`: trials finished so far; `best`: the
        best measured tokens/s/GPU that fits (0: nothing to compare with, nothing asked)."""
        budget = self.budget
        if budget.converge_below is None or best <= 0 or self._asked_at == finished:
            return None
        self._asked_at = finished
        self.chance = self.search.chance_of_better(study, set(tried), best, budget.converge_margin)
        if self.chance is None or self.chance >= budget.converge_below or measured < self.MIN_TRIALS:
            return None
        return (f"converged: P(a layout beats the answer by > {budget.converge_margin:.0%}) = {self.chance:.2f} < "
                f"{budget.converge_below:g}, after {measured} trials")

    def at_budget(self, out_of_time: bool, measured: int) -> str:
        """Why a sweep that did not stop itself stopped, with the chance of a better layout where it was asked."""
        budget = self.budget
        reached = (f"budget.wall_time_s ({budget.wall_time_s:g} s) reached" if out_of_time
                   else f"budget.n_trials ({budget.n_trials}) reached")
        if self.chance is None or budget.converge_below is None:
            return reached
        chance = f"P(a layout beats the answer by > {budget.converge_margin:.0%}) = {self.chance:.2f}"
        why = (f"{chance}, not below {budget.converge_below:g}" if self.chance >= budget.converge_below
               else f"{chance} after only {measured} trials (trusted from {self.MIN_TRIALS} on)")
        return (f"{reached} before converging: {why}; more trials may find a better layout (--resume with a larger "
                f"--n-trials goes on)")
