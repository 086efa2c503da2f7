"""What a layout costs: the time (and dollars) to train the spec's `cost.train_tokens` on the target cluster,
and what the sweep itself spent (GPU-hours, dollars). Both from the spec's `cost:`; nothing without it.

Pure functions of numbers and the `Cost` settings (the spec's `cost:` section is this model): no study here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class Cost(BaseModel):
    # the string under each field is its documentation (as in orchestrator.spec.schema)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    usd_per_gpu_hour: float | None = Field(default=None, gt=0, strict=True, allow_inf_nan=False)
    """What one GPU-hour costs; with it every figure in GPU-hours also shows dollars."""
    train_tokens: float | None = Field(default=None, gt=0, strict=True, allow_inf_nan=False)
    """Tokens of the training run the layout is for: each layout shows the time (and dollars) to train them."""


@dataclass(frozen=True)
class Training:
    """What training cost.train_tokens at one throughput takes on the target cluster."""
    days: float
    gpu_hours: float
    usd: float | None = None
    """None without a price."""

    def metrics(self) -> dict[str, float]:
        """As MLflow metrics and leaderboard columns: train_days, train_gpu_hours, train_usd (when priced)."""
        out = {"train_days": self.days, "train_gpu_hours": self.gpu_hours}
        if self.usd is not None:
            out["train_usd"] = self.usd
        return out


def to_train(tokens_per_sec_per_gpu: float | None, num_gpus: int, cost: Cost) -> Training | None:
    """Days, GPU-hours and (with a price) dollars to train cost.train_tokens at this throughput; None when the
    spec has no train_tokens or the trial no throughput."""
    if not cost.train_tokens or not tokens_per_sec_per_gpu or not num_gpus:
        return None
    hours = cost.train_tokens / (tokens_per_sec_per_gpu * num_gpus) / 3600.0
    usd = hours * num_gpus * cost.usd_per_gpu_hour if cost.usd_per_gpu_hour else None
    return Training(days=hours / 24.0, gpu_hours=hours * num_gpus, usd=usd)


@dataclass(frozen=True)
class Spend:
    """What a sweep's trials used, and what the same trials would have used at full size."""
    gpu_hours: float
    full_size_gpu_hours: float
    usd: float | None = None
    """None without a price (as full_size_usd)."""
    full_size_usd: float | None = None


def spend(gpu_hours: float, full_size_gpu_hours: float, cost: Cost) -> Spend:
    """GPU-hours a sweep's trials used (and what they would have at full size), with dollars when priced."""
    price = cost.usd_per_gpu_hour
    if not price:
        return Spend(gpu_hours, full_size_gpu_hours)
    return Spend(gpu_hours, full_size_gpu_hours, gpu_hours * price, full_size_gpu_hours * price)


def money(usd: float) -> str:
    """Dollars rounded to what matters ($1.2M, $34k, $512)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(usd) >= size:
            return f"${usd / size:.3g}{unit}"
    return f"${usd:.3g}"
