"""Result validation: a measurement that cannot be true is marked invalid, so it can never be the best.

Three ways a run can lie while exiting cleanly (all seen with earlier tools):
- more TF/s than the chip can do (a FLOP count or timing bug);
- a parallel size or MoE dispatcher that the trainer reports was not in effect (CP silently off);
- a loss that is not finite (the numbers were measured on a diverged run).

Pure function of (result, requested layout, GPU): no I/O, no Optuna, no MLflow. The trainer judges its own
result with it before writing it, and the sweep judges every result again, whatever backend produced it.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from search_spaces.errors import SpecError
from search_spaces.layout import PARALLEL_SIZES, Layout
from search_spaces.result import TrialResult
# Layout.dispatcher -> Megatron-Core token dispatcher class (deepep/hybridep are the flex dispatcher).
DISPATCHER_CLASSES = {
    "alltoall": "MoEAlltoAllTokenDispatcher",
    "allgather": "MoEAllGatherTokenDispatcher",
    "deepep": "MoEFlexTokenDispatcher",
    "hybridep": "MoEFlexTokenDispatcher",
}


def problems(result: TrialResult, layout: Layout, gpu: Any = None) -> list[str]:
    """Why the numbers of an ok result cannot be trusted (empty when they can)."""
    found: list[str] = []
    found += _above_peak(result, layout, gpu)
    found += _not_in_effect(result, layout)
    found += _non_finite(result)
    return found


def validate(result: TrialResult, layout: Layout, gpu: Any = None) -> TrialResult:
    """Return `result`, or a copy with status "invalid" and the reasons in `error` when it cannot be true.

    Only results with status ok are judged: an OOM or crash is already not a candidate for best.
    """
    if result.status != "ok":
        return result
    reasons = problems(result, layout, gpu)
    if not reasons:
        return result
    checked = copy.deepcopy(result)
    checked.status = "invalid"
    checked.error = "; ".join(reasons)
    checked.extra["status_before_validation"] = "ok"
    return checked


# ---- the checks -----------------------------------------------------------------------------------
def _above_peak(result: TrialResult, layout: Layout, gpu: Any) -> list[str]:
    if gpu is None or getattr(gpu, "is_cpu", False):
        return []  # the CPU figure only orders layouts; it is not a bound
    try:
        peak = float(gpu.peak(layout.precision))
    except SpecError:  # no peak known for this precision on this GPU: nothing to compare with
        return []
    out = []
    tflops = result.tflops_per_gpu
    if _number(tflops) and peak > 0 and tflops > peak:
        out.append(f"measured {tflops:,.1f} TF/s per GPU is above the {peak:,.1f} TF/s {layout.precision} "
                   f"peak of a {getattr(gpu, 'name', 'GPU')}")
    mfu = result.mfu
    if _number(mfu) and mfu > 1.0 and not out:
        out.append(f"MFU {mfu:.2f} is above 1")
    return out


def _not_in_effect(result: TrialResult, layout: Layout) -> list[str]:
    applied = result.applied or {}
    out = []
    for name in PARALLEL_SIZES:  # Megatron's parallel_state world sizes, as the trainer reports them
        if name not in applied or applied[name] is None:
            continue
        if _as_int(applied[name]) != getattr(layout, name):
            out.append(f"{name.upper()} {getattr(layout, name)} was requested but {applied[name]} was in effect")
    reported = applied.get("dispatcher")
    if reported:  # dense models have no dispatcher: nothing to check
        names = {str(d) for d in (reported if isinstance(reported, (list, tuple, set)) else [reported])}
        wanted = {layout.dispatcher, DISPATCHER_CLASSES.get(layout.dispatcher, layout.dispatcher)}
        if not names & wanted or names - wanted:
            out.append(f"dispatcher {layout.dispatcher} was requested but {', '.join(sorted(names))} was in effect")
    return out


def _non_finite(result: TrialResult) -> list[str]:
    out = []
    bad = [i for i, x in enumerate(result.loss or []) if not _number(x) or not math.isfinite(x)]
    if bad:
        out.append(f"loss is not finite at step {bad[0]} ({result.loss[bad[0]]!r})")
    tokens = result.tokens_per_sec_per_gpu
    if tokens is not None and not (_number(tokens) and math.isfinite(tokens) and tokens > 0):
        out.append(f"tokens/s per GPU {tokens!r} is not a positive finite number")
    return out


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _as_int(x: Any) -> Any:
    try:
        return int(x)
    except (TypeError, ValueError):
        return x
