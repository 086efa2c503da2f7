"""Result validation: a measurement that cannot be true is marked invalid, so it can never be the best.

The one home of the physical bounds of a measurement (issue 21, class 4). Every entry point judges with it:
the trainer its own result, the sweep every result whatever backend produced it (and a result kept in the
spool or re-read on resume), the replay table each row, calibration each measurement. Ways a run can lie
while exiting cleanly:
- a number that is not a finite number (NaN, inf, a string), a step time <= 0, a negative memory;
- more TF/s than the chip can do at the layout's precision, directly or as tokens/s times the FLOPs of a token
  (a FLOP count or timing bug), an MFU above 1, a peak memory above the device's capacity;
- tokens/s that disagree with the step time and the tokens of a step;
- a parallel size, MoE dispatcher or routing that the trainer reports was not in effect (CP silently off);
- a loss that is not finite (the numbers were measured on a diverged run).

Pure function of (result, requested layout, GPU, and optionally the model, length and GPU count it ran at):
no I/O, no Optuna, no MLflow. A bound whose inputs are not given is not checked (the CPU's figures only order
layouts: no peak or capacity bound there).
"""

from __future__ import annotations

import copy
import math
from typing import Any, TypeGuard

from search_spaces.errors import SpecError
from search_spaces.inputs import excerpt
from search_spaces.layouts.layout import BY_NAME, PARALLEL_SIZES, Layout
from search_spaces.result import TrialResult

# Layout.dispatcher -> Megatron-Core token dispatcher class (deepep/hybridep are the flex dispatcher).
DISPATCHER_CLASSES = {
    "alltoall": "MoEAlltoAllTokenDispatcher",
    "allgather": "MoEAllGatherTokenDispatcher",
    "deepep": "MoEFlexTokenDispatcher",
    "hybridep": "MoEFlexTokenDispatcher",
}
# the catalog's capacity is nvidia-smi's total rounded to 0.1 GiB: a peak within this share above it is rounding
CAPACITY_SLACK = 0.01
# tokens/s and gbs * seq_len / step time / GPUs agree within this share (the trainer computes one from the other;
# a composed proxy and the cost model round)
CONSISTENCY_TOLERANCE = 0.05
# the measured fields, each with its name in a reason and its lower bound: "positive" (> 0) or "non-negative"
SCALARS = {"tokens_per_sec_per_gpu": ("tokens/s per GPU", "positive"), "tflops_per_gpu": ("TF/s per GPU", "positive"),
           "mfu": ("MFU", "positive"), "step_time_s": ("step time (s)", "positive"),
           "peak_memory_gib": ("peak memory (GiB)", "non-negative"), "wall_time_s": ("wall time (s)", "non-negative")}
LISTS = {"step_times_s": ("step time (s)", "positive"),
         "peak_memory_gib_per_rank": ("peak memory (GiB)", "non-negative")}


def problems(result: TrialResult, layout: Layout, gpu: Any = None, model: Any = None, seq_len: int | None = None,
             num_gpus: int | None = None, memory_measured: bool = True) -> list[str]:
    """Why the numbers of an ok result cannot be trusted (empty when they can).

    `model` (a ModelSpec) and `seq_len` bound tokens/s by the chip's peak; `seq_len` and `num_gpus` (the GPUs
    the layout ran on) tie tokens/s to the step time; `memory_measured=False` for a composed proxy, whose peak
    is a prediction (above the capacity it does not fit, which the sweep's memory constraint says)."""
    found: list[str] = []
    found += _not_numbers(result)
    found += _above_peak(result, layout, gpu, model, seq_len)
    if memory_measured:
        found += _above_capacity(result, gpu)
    found += _inconsistent(result, layout, seq_len, num_gpus)
    found += _not_in_effect(result, layout)
    found += _non_finite_loss(result)
    return found


def validate(result: TrialResult, layout: Layout, gpu: Any = None, model: Any = None, seq_len: int | None = None,
             num_gpus: int | None = None, memory_measured: bool = True) -> TrialResult:
    """Return `result`, or a copy with status "invalid" and the reasons in `error` when it cannot be true.

    Only results with status ok are judged: an OOM or crash is already not a candidate for best.
    """
    if result.status != "ok":
        return result
    reasons = problems(result, layout, gpu, model, seq_len, num_gpus, memory_measured)
    if not reasons:
        return result
    checked = copy.deepcopy(result)
    checked.status = "invalid"
    checked.error = "; ".join(reasons)
    if not isinstance(checked.extra, dict):
        checked.extra = {"extra": _short(checked.extra)}
    checked.extra["status_before_validation"] = "ok"
    _drop_non_numbers(checked)
    return checked


def numbers_only(result: TrialResult) -> TrialResult:
    """`result`, or a copy in which what is not a finite number is gone (as in an invalid result), whatever its
    status: what the sweep records of a failed run (its memory, its GPU-seconds) is a number or nothing."""
    checked = copy.deepcopy(result)
    if not isinstance(checked.extra, dict):
        checked.extra = {"extra": _short(checked.extra)}
    return checked if _drop_non_numbers(checked) else result


def _drop_non_numbers(result: TrialResult) -> bool:
    """What is not a finite number becomes None (lists and mappings keep their numbers), the claim kept as text
    in extra["not_numbers"]: whatever reads an invalid result (objectives, GPU-seconds, JSON) reads numbers.
    True when something was dropped."""
    claimed: dict[str, str] = {}
    for name in SCALARS:
        value = getattr(result, name)
        if value is not None and not _finite(value):
            claimed[name] = _short(value)
            setattr(result, name, None)
    for name in (*LISTS, "loss"):
        values = getattr(result, name)
        if not isinstance(values, (list, tuple)) or not all(_finite(v) for v in values):
            claimed[name] = _short(values)
            setattr(result, name, [v for v in values if _finite(v)] if isinstance(values, (list, tuple)) else [])
    for name in ("memory_gib", "applied"):
        if not isinstance(getattr(result, name), dict):
            claimed[name] = _short(getattr(result, name))
            setattr(result, name, {})
    memory = {k: v for k, v in result.memory_gib.items() if _finite(v)}
    if len(memory) != len(result.memory_gib):
        claimed["memory_gib"] = _short(result.memory_gib)
        result.memory_gib = memory
    if claimed:
        result.extra["not_numbers"] = claimed
    return bool(claimed)


# ---- the checks -----------------------------------------------------------------------------------
def _not_numbers(result: TrialResult) -> list[str]:
    """Every measured number is a finite number within its lower bound."""
    out = []
    for name, (label, bound) in SCALARS.items():
        value = getattr(result, name)
        if value is not None:
            out += _bad(label, value, bound)
    for name, (label, bound) in LISTS.items():
        values = getattr(result, name)
        if not isinstance(values, (list, tuple)):
            out.append(f"{name} {_short(values)} is not a list of numbers")
            continue
        for i, value in enumerate(values):
            found = _bad(f"{label} [{i}]", value, bound)
            if found:
                out += found
                break  # the first bad entry names the problem
    memory = result.memory_gib
    if not isinstance(memory, dict):
        out.append(f"memory_gib {memory!r} is not a mapping of components to GiB")
    else:
        for part, value in memory.items():
            out += _bad(f"memory {part} (GiB)", value, "non-negative")
    return out


def _bad(name: str, value: Any, bound: str) -> list[str]:
    if not _number(value):
        return [f"{name} {_short(value)} is not a number"]
    if not math.isfinite(value):
        return [f"{name} {value!r} is not finite"]
    if bound == "positive" and value <= 0:
        return [f"{name} {value!r} is not positive"]
    if bound == "non-negative" and value < 0:
        return [f"{name} {value!r} is negative"]
    return []


def _peak(layout: Layout, gpu: Any) -> float | None:
    if gpu is None or getattr(gpu, "is_cpu", False):
        return None  # the CPU figure only orders layouts; it is not a bound
    try:
        peak = float(gpu.peak(layout.precision))
    except SpecError:  # no peak known for this precision on this GPU: nothing to compare with
        return None
    return peak if peak > 0 else None


def _above_peak(result: TrialResult, layout: Layout, gpu: Any, model: Any, seq_len: int | None) -> list[str]:
    peak = _peak(layout, gpu)
    if peak is None:
        return []
    name = getattr(gpu, "name", "GPU")
    out = []
    tflops = result.tflops_per_gpu
    if _finite(tflops) and tflops > peak:
        out.append(f"measured {tflops:,.1f} TF/s per GPU is above the {peak:,.1f} TF/s {layout.precision} "
                   f"peak of a {name}")
    tokens = result.tokens_per_sec_per_gpu
    if not out and model is not None and _finite(seq_len) and seq_len > 0 and _finite(tokens) and tokens > 0:
        from search_spaces.cost.flops import flops_per_token
        implied = tokens * flops_per_token(model, int(seq_len)) / 1e12
        if implied > peak:
            out.append(f"measured {tokens:,.0f} tokens/s per GPU needs {implied:,.1f} TF/s, above the "
                       f"{peak:,.1f} TF/s {layout.precision} peak of a {name}")
    mfu = result.mfu
    if _finite(mfu) and mfu > 1.0 and not out:
        out.append(f"MFU {mfu:.2f} is above 1")
    return out


def _above_capacity(result: TrialResult, gpu: Any) -> list[str]:
    if gpu is None or getattr(gpu, "is_cpu", False):
        return []  # the host's memory is not the catalog's figure
    capacity = float(gpu.memory_gib)
    peaks = [result.peak_memory_gib] + list(result.peak_memory_gib_per_rank
                                             if isinstance(result.peak_memory_gib_per_rank, (list, tuple)) else [])
    worst = max((p for p in peaks if _finite(p)), default=None)
    if worst is not None and worst > capacity * (1 + CAPACITY_SLACK):
        return [f"peak memory {worst:,.1f} GiB is above the {capacity:,.1f} GiB of a {getattr(gpu, 'name', 'GPU')}"]
    return []


def _inconsistent(result: TrialResult, layout: Layout, seq_len: int | None, num_gpus: int | None) -> list[str]:
    tokens, step = result.tokens_per_sec_per_gpu, result.step_time_s
    if not (_finite(tokens) and tokens > 0 and _finite(step) and step > 0 and _finite(seq_len) and seq_len > 0
            and _finite(num_gpus) and num_gpus > 0):
        return []
    expected = layout.gbs * seq_len / step / num_gpus * _useful_share(result)
    if abs(tokens / expected - 1) > CONSISTENCY_TOLERANCE:
        return [f"tokens/s per GPU {tokens:,.1f} disagrees with a step of {step:.4g} s over {layout.gbs} x "
                f"{seq_len} tokens on {num_gpus} GPUs ({expected:,.1f} tokens/s per GPU)"]
    return []


def _useful_share(result: TrialResult) -> float:
    """Real tokens over all tokens of a step: packed documents leave padding, which tokens/s does not count
    (trainers/packed_batches.py); 1 for one document per sequence or a share that is not one."""
    packing = (result.extra or {}).get("packing") if isinstance(result.extra, dict) else None
    share = packing.get("useful_token_share") if isinstance(packing, dict) else None
    return share if _finite(share) and 0 < share <= 1 else 1.0


def _not_in_effect(result: TrialResult, layout: Layout) -> list[str]:
    applied = result.applied if result.applied is not None else {}
    if not isinstance(applied, dict):
        return [f"applied {_short(applied)} is not a mapping of what was in effect"]
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
    routing = applied.get("routing")
    if routing and _routing_value(routing) != layout.routing:  # dense models have no router: nothing to check
        out.append(f"routing {layout.routing} was requested but {_short(routing)} was in effect")
    overlap = applied.get("ep_overlap")
    if isinstance(overlap, bool) and overlap != layout.ep_overlap:  # reported by MoE trainers (None: dense)
        out.append(f"ep_overlap {layout.ep_overlap} was requested but {overlap} was in effect")
    return out


def _routing_value(reported: Any) -> Any:
    """The canonical routing a trainer reported (its own spelling otherwise: it differs from any request)."""
    try:
        return BY_NAME["routing"].parse(reported)
    except SpecError:
        return reported


def _non_finite_loss(result: TrialResult) -> list[str]:
    loss = result.loss if result.loss is not None else []
    if not isinstance(loss, (list, tuple)):
        return [f"loss {_short(loss)} is not a list of numbers"]
    bad = [i for i, x in enumerate(loss) if not _finite(x)]
    if bad:
        return [f"loss is not finite at step {bad[0]} ({_short(loss[bad[0]])})"]
    return []


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _finite(x: Any) -> TypeGuard[float]:  # where it holds, the value is an int or float (mypy narrows)
    return _number(x) and math.isfinite(x)


def _short(value: Any) -> str:
    if isinstance(value, str):  # read from a file (a replay table's cell): quoted as an excerpt, secrets masked
        return excerpt(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_int(x: Any) -> Any:
    try:
        return int(x)
    except (TypeError, ValueError, OverflowError):
        return x
