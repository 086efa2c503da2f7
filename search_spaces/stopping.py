"""When a trial is decided: the rules that stop one early, each declared once with its reason, and the statistics
they read. Pure Python: the trainer applies two of them itself (it knows its step times and its memory), the sweep
the third (it knows the other trials: orchestrator/search/pruning.py).

    measured_enough  the steady-state step time's 95% confidence interval (Student's t over the measured steps) is
                     within the tolerance: the trainer stops measuring, the figure is recorded with its interval
    cannot_win       the trial's tokens/s/GPU upper bound is below the best trial's lower bound by the margin: the
                     sweep prunes it (Optuna PRUNED), it is no measurement
    will_not_fit     its memory after a step, with what the next steps add, exceeds the GPU's: the trainer stops
                     before the OOM (status oom, the extrapolated peak recorded, fed back to the memory correction)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

MEASURED_ENOUGH, CANNOT_WIN, WILL_NOT_FIT = "measured_enough", "cannot_win", "will_not_fit"


@dataclass(frozen=True)
class StopRule:
    """One rule that stops a trial early."""
    name: str
    status: str
    """The status a trial it stops is recorded with (search_spaces.result.STATUSES)."""
    applied_by: str
    reason: str
    """Why a trial it stops is decided, in words."""


STOP_RULES: tuple[StopRule, ...] = (
    StopRule(MEASURED_ENOUGH, "ok", "the trainer (--stop-within)",
             "the steady-state step time's 95% confidence interval over the measured steps is within the tolerance: "
             "more steps would not change the figure; it is recorded with its interval"),
    StopRule(CANNOT_WIN, "pruned", "the sweep (an Optuna pruner on the reported steps)",
             "the upper bound of its tokens/s/GPU is below the best trial's lower bound by the margin: more steps "
             "cannot make it the best; it is no measurement"),
    StopRule(WILL_NOT_FIT, "oom", "the trainer (--memory-limit-gib)",
             "its peak memory after the first step, with the optimizer states that step created held through the "
             "next step's forward and backward, exceeds the GPU's memory: the next step would run out of memory"),
)
BY_RULE = {rule.name: rule for rule in STOP_RULES}

# Student's t, two-sided 95%, by degrees of freedom 1..30; beyond, 1.96 + 2.4/df (within 0.002 of the exact value)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T95[df - 1] if df <= len(_T95) else 1.96 + 2.4 / df


@dataclass(frozen=True)
class Interval:
    """A mean and its 95% confidence half-width over `n` values."""
    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def relative(self) -> float:
        """The half-width over the mean (inf for a mean that is not positive)."""
        return self.half_width / self.mean if self.mean > 0 else math.inf

    def text(self, unit: str = "s", digits: int = 4) -> str:
        return f"{self.mean:.{digits}g} {unit} ± {self.relative:.1%} (95% t-interval over {self.n} steps)"


def interval(values: Sequence[float]) -> Interval | None:
    """The mean of `values` and its 95% t-interval; None for fewer than two finite values."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return None
    half = t95(len(finite) - 1) * statistics.stdev(finite) / math.sqrt(len(finite))
    return Interval(statistics.fmean(finite), half, len(finite))


def measured_enough(step_times: Sequence[float], within: float, min_steps: int) -> Interval | None:
    """The step times' interval once there are `min_steps` (at least two) of them and it is within ±`within` of their
    mean; else None (measure on)."""
    if len(step_times) < max(min_steps, 2):
        return None
    found = interval(step_times)
    return found if found is not None and found.relative <= within else None


def cannot_win(values: Sequence[float], best_low: float, margin: float, min_steps: int) -> str | None:
    """Why a trial whose per-step tokens/s/GPU are `values` cannot beat a best trial whose lower bound is `best_low`
    (its upper bound times 1 + `margin` still below it), or None: too few steps, or it may still win."""
    if len(values) < max(min_steps, 2) or not best_low > 0:
        return None
    found = interval(values)
    if found is None or found.high * (1.0 + margin) >= best_low:
        return None
    return (f"cannot win: its tokens/s/GPU is at most {found.high:.4g} (95% upper bound over {found.n} measured "
            f"steps), more than {margin:.0%} below the best trial's lower bound {best_low:.4g}")


def extrapolated_peak(peak_gib: float, schedule_peak_gib: float, added_states_gib: float) -> float:
    """The peak the next step reaches: the first step's forward and backward ran before its optimizer step created
    the optimizer states (Adam's moments), which the next step's forward and backward then hold too. The pipeline's
    in-flight microbatches are already in the first step's peak (its schedule is every step's)."""
    return max(peak_gib, schedule_peak_gib + max(added_states_gib, 0.0))


def will_not_fit(predicted_gib: float, limit_gib: float) -> str | None:
    """Why a trial whose next step peaks at `predicted_gib` is stopped against `limit_gib`, or None when it fits."""
    if not predicted_gib > limit_gib:
        return None
    return (f"will not fit: memory extrapolated to {predicted_gib:.3g} GiB by the next step (the optimizer states the "
            f"first step created held through forward and backward), more than the {limit_gib:.3g} GiB limit; "
            f"stopped before the OOM")
