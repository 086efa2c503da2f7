"""The series the report's figures plot, read off the trial views: the Pareto front, the best-so-far curve, the
(predicted, measured) pairs and the winner's memory and time components."""

from __future__ import annotations

import math
from typing import Any

from search_spaces.cost.breakdown import COUNT_KEYS, PEAK_KEYS

from orchestrator.outputs.report.values import finite_number
from orchestrator.outputs.winner import TrialView


def pareto_front(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """Non-dominated (peak memory low, tokens/s high) points, by increasing memory."""
    front, best = [], -math.inf
    for mem, tps, number in sorted(points, key=lambda p: (p[0], -p[1])):
        if tps > best:
            front.append((mem, tps, number))
            best = tps
    return front


def best_so_far(trials: list[TrialView]) -> list[tuple[int, float]]:
    """(trial number, best tokens/s/GPU among fitting ok trials up to it)."""
    curve, best = [], None
    for v in sorted(trials, key=lambda v: v.number):
        tps = finite_number(v.tokens_per_sec_per_gpu)
        if v.status == "ok" and v.fits and tps is not None:
            best = tps if best is None else max(best, tps)
        if best is not None:
            curve.append((v.number, best))
    return curve


def ok_points(trials: list[TrialView]) -> list[tuple[float, float, int]]:
    """(peak memory GiB, tokens/s/GPU, trial number) of the ok trials that measured both."""
    pts = []
    for v in trials:
        mem, tps = finite_number(v.peak_memory_gib), finite_number(v.tokens_per_sec_per_gpu)
        if v.status == "ok" and mem is not None and tps is not None:
            pts.append((mem, tps, v.number))
    return pts


def predicted_measured(trials: list[TrialView], key: str) -> list[tuple[float, float, int]]:
    """(predicted, measured, trial number) of `key` for the ok trials that have both."""
    pairs = []
    for v in trials:
        pred, meas = v.predicted(key), v.measured(key)
        if v.status == "ok" and pred is not None and meas is not None:
            pairs.append((pred, meas, v.number))
    return pairs


def memory_components(memory_gib: dict[str, Any] | None) -> dict[str, float]:
    """The GiB components of a memory breakdown; its counts (parameters, microbatches, the pipeline rank)
    are not memory and never go on a GiB axis."""
    return {k: float(v) for k, v in (memory_gib or {}).items() if k not in COUNT_KEYS and finite_number(v) is not None}


def winner_breakdown(view: TrialView | None) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(predicted memory GiB, measured memory GiB, predicted time s) components of the winner."""
    if view is None:
        return {}, {}, {}
    memory, time = view.predicted_breakdown()
    times = {k: float(v) for k, v in time.items() if finite_number(v) is not None}
    return memory_components(memory), memory_components(view.measured_memory()), times


def component_order(*parts: dict[str, float]) -> list[str]:
    """The components summed into the peak first (cost model order), then the informational ones."""
    seen = list(dict.fromkeys(k for part in parts for k in part))
    return [k for k in PEAK_KEYS if k in seen] + [k for k in seen if k not in PEAK_KEYS]
