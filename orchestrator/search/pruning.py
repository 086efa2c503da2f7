"""The cannot-win rule (search_spaces/stopping.py) as an Optuna pruner: a running trial whose reported steps say it
cannot beat the best measured trial is pruned.

The study has two objectives, where Optuna's `Trial.report` and `Trial.should_prune` refuse to work; so the sweep
stores each measured step's tokens/s/GPU as the trial's intermediate value through the storage's public API
(orchestrator/storage/studies.py: StoredTrial.report) and asks this pruner's `prune(study, trial)` itself, as
`should_prune` would. It reads the trial's intermediate values and the COMPLETE trials that fit.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from search_spaces.stopping import cannot_win, interval

from orchestrator.records import TrialRecord


class CannotWinPruner(optuna.pruners.BasePruner):
    """Prune a full-size trial once the 95% upper bound of its per-step tokens/s/GPU, raised by `margin`, is below
    the lower bound of a COMPLETE full-size trial that fits; never before `min_steps` measured steps."""

    def __init__(self, margin: float, min_steps: int) -> None:
        self.margin = margin
        self.min_steps = min_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self.reason(study, trial) is not None

    def reason(self, study: optuna.Study, trial: FrozenTrial) -> str | None:
        """Why `trial` cannot win (the rule's line and the trial it cannot beat), or None."""
        if TrialRecord.of(trial).proxy:  # a proxy's steps are the proxy's, not its layout's
            return None
        values = [v for _, v in sorted(trial.intermediate_values.items())]
        if len(values) < max(self.min_steps, 2):
            return None
        best = best_lower_bound(study, trial.number)
        if best is None:
            return None
        number, low = best
        why = cannot_win(values, low, self.margin, self.min_steps)
        return f"{why} (trial {number})" if why else None


def best_lower_bound(study: optuna.Study, other_than: int) -> tuple[int, float] | None:
    """(number, tokens/s/GPU lower bound) of the COMPLETE full-size trial that fits with the highest lower bound."""
    best: tuple[int, float] | None = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        record = TrialRecord.of(t)
        if t.number == other_than or not record.fits_ok or record.proxy or not t.values:
            continue
        low = lower_bound(t, record)
        if low is not None and (best is None or low > best[1]):
            best = (t.number, low)
    return best


def lower_bound(trial: FrozenTrial, record: TrialRecord) -> float | None:
    """A measured trial's tokens/s/GPU lower bound: from its reported steps' interval; else from the step-time
    interval its trainer recorded (tokens/s scale as one over the step time); else its figure alone."""
    found = interval(list(trial.intermediate_values.values()))
    if found is not None:
        return found.low
    value = record.tokens_per_sec_per_gpu
    if value is None:
        return None
    spread = record.extra.get("step_time_interval_s")
    mean = record.result.step_time_s if record.result is not None else None
    if isinstance(spread, list) and len(spread) == 2 and mean and isinstance(spread[1], (int, float)) \
            and spread[1] > 0:
        return value * mean / spread[1]
    return value
