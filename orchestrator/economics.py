"""What a layout costs: the time (and dollars) to train the spec's `cost.train_tokens` on the target cluster,
and what the sweep itself spent (GPU-hours, dollars). Both from the spec's `cost:`; nothing without it."""

from __future__ import annotations

from typing import Any

import optuna

from orchestrator import study as studies


def cost_of(study: optuna.Study) -> dict[str, float | None]:
    """The study's `cost:` settings (usd_per_gpu_hour, train_tokens), None where not given."""
    cost = ((study.user_attrs.get("spec") or {}).get("cost") or {})
    return {"usd_per_gpu_hour": cost.get("usd_per_gpu_hour"), "train_tokens": cost.get("train_tokens")}


def to_train(tokens_per_sec_per_gpu: float | None, num_gpus: int, cost: dict[str, Any]) -> dict[str, float]:
    """Days, GPU-hours and (with a price) dollars to train cost["train_tokens"] at this throughput; {} when the
    spec has no train_tokens or the trial no throughput."""
    tokens = cost.get("train_tokens")
    if not tokens or not tokens_per_sec_per_gpu or not num_gpus:
        return {}
    hours = tokens / (tokens_per_sec_per_gpu * num_gpus) / 3600.0
    out = {"train_days": hours / 24.0, "train_gpu_hours": hours * num_gpus}
    if cost.get("usd_per_gpu_hour"):
        out["train_usd"] = hours * num_gpus * cost["usd_per_gpu_hour"]
    return out


def sweep_spend(study: optuna.Study) -> dict[str, float]:
    """GPU-hours the sweep's trials used (and what they would have at full size), with dollars when priced."""
    used, full = studies.gpu_hours(study)
    out = {"gpu_hours": used, "full_size_gpu_hours": full}
    price = cost_of(study).get("usd_per_gpu_hour")
    if price:
        out.update(usd=used * price, full_size_usd=full * price)
    return out


def money(usd: float) -> str:
    """Dollars rounded to what matters ($1.2M, $34k, $512)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(usd) >= size:
            return f"${usd / size:.3g}{unit}"
    return f"${usd:.3g}"
