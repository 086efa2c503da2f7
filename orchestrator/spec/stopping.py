"""The spec's `stopping:` section: when a running trial is decided (the rules: search_spaces/stopping.py), each rule
with its off-switch. What-if backends (analytic, replay) have no steps: these apply to trials that run."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Stopping(BaseModel):
    """Stop a trial once it is decided: measured enough, cannot win, will not fit."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    measured_within: float | None = Field(default=0.02, gt=0, lt=1, allow_inf_nan=False)
    """measured enough: the trainer stops measuring once the 95% confidence interval of the measured steps' step
    time (Student's t) is within +- this fraction of its mean, after `min_measured_steps`; the figure is recorded
    with its interval. null: every measured step runs."""
    min_measured_steps: int = Field(default=3, ge=2, strict=True)
    """Measured steps before a rule on step times (measured enough, cannot win) may decide."""
    cannot_win_margin: float | None = Field(default=0.05, ge=0, lt=1, allow_inf_nan=False)
    """cannot win: a full-size trial is pruned (Optuna PRUNED, status pruned, no measurement) once the 95% upper
    bound of its per-step tokens/s/GPU, raised by this fraction, is still below the best full-size trial's lower
    bound. null: never pruned. Proxy trials are not pruned: their steps are the proxy's, not the layout's."""
    will_not_fit: bool = True
    """will not fit: the trainer stops a trial whose memory after a step, with the optimizer states its first step
    created held through the next forward and backward, exceeds `memory_limit_gib`: status oom, before the OOM, the
    extrapolated peak recorded (the calibrated search's memory correction reads it). false: off."""
    memory_limit_gib: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """The memory `will_not_fit` holds a running trial's ranks to (GiB); default the GPU's (the hardware catalog's
    memory, the limit the cost model screens with)."""
