"""Proxy trials: measure a big layout on the fewest GPUs that reproduce its per-GPU work, and compose the
full-scale step and peak memory from what the proxy measured plus what only the cost model can see.

`derive_proxy(model, layout, gpu, num_gpus)` keeps every per-GPU shape and every communication pattern inside a
pipeline stage (TP, CP and its communication type, EP, ETP, MBS, the sequence, recompute, CUDA-graph scopes,
precision, dispatcher, offload) and shrinks the rest, each change with its reason:
- PP becomes 2 when it is above 1 (the stage boundary's send/recv is measured) and the model keeps, per
  pipeline rank, as many layers as the full layout's heaviest rank (its VPP chunks kept);
- DP and EDP shrink to the smallest sizes parallel folding allows: the proxy's world is
  lcm(TP*CP, EP*ETP) * PP;
- the batch shrinks to enough microbatches for the 1F1B steady state.

`compose(plan, measured, ...)` turns the proxy's measurement back into the full layout's:
    step  = per-microbatch stage time (measured) x (microbatches + pipeline bubble at full PP*VPP)
            + the optimizer step (measured, re-sharded to the full DP/EDP)
            + what the proxy cannot see (modelled): DP/EDP gradient reduce and parameter gather at full DP,
              the extra EP/CP traffic when the full layout spans more NVLink domains than the proxy,
              on CPU the extra contention of more ranks on the host's cores (ranks/cores, applied to the
              measured stage time; and at least the measured CPU-seconds of the full work over the cores)
    peak  = weights and gradients (measured) + optimizer states (measured, re-sharded)
            + activations per microbatch (measured) x microbatches in flight on stage 0 at full PP*VPP
            + buffers (modelled: dispatcher, CUDA graphs, runtime, allocator margin)
Every composed figure keeps its breakdown, measured and modelled parts side by side.
Pure Python: no torch, no orchestrator.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.breakdown import GIB, MemoryBreakdown, StepTime
from search_spaces.cost.costmodel import Estimate, estimate
from search_spaces.cost.host_terms import host_slowdown
from search_spaces.cost.memory import inflight_per_chunk, rank_memory_breakdown
from search_spaces.cost.pipeline import placement
from search_spaces.layouts.layout import Layout
from search_spaces.result import TrialResult

PROXY_PP = 2  # a pipeline proxy keeps one stage boundary: its send/recv is measured
# 1F1B reaches its steady state once every stage has work in flight; four per stage also averages the noise
STEADY_MICROBATCHES_PER_STAGE = 4
# time components of the cost model that the proxy measures itself (its own compute and communication)
MODELLED_TIME = ("dp_comm",)  # what a proxy with a smaller DP/EDP cannot see
SCALE_OUT_TIME = ("ep_comm", "cp_comm")  # what it sees only in part when it spans fewer NVLink domains
BUFFERS = ("dispatcher_buffers", "cuda_graphs", "runtime_overhead", "allocator_margin")


@dataclass(frozen=True)
class Change:
    field: str
    full: Any
    proxy: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "full": self.full, "proxy": self.proxy, "reason": self.reason}


@dataclass(frozen=True)
class ProxyPlan:
    model: ModelSpec  # the proxy's model: the full one with fewer layers
    layout: Layout  # the proxy's layout
    world: int  # the proxy's GPUs
    full_world: int
    full_layout: Layout
    full_model: ModelSpec
    heavy_rank: int  # the full layout's pipeline rank whose stage the proxy reproduces
    changes: tuple[Change, ...] = ()

    @property
    def strictly_smaller(self) -> bool:
        return self.world < self.full_world

    def to_dict(self) -> dict[str, Any]:
        return {"world": self.world, "full_world": self.full_world, "num_layers": self.model.num_layers,
                "layout": self.layout.to_dict(), "heavy_rank": self.heavy_rank,
                "changes": [c.to_dict() for c in self.changes]}


def derive_proxy(model: ModelSpec, layout: Layout, gpu: GPUSpec, num_gpus: int) -> ProxyPlan:  # noqa: ARG001 -- public
    """The smallest runnable layout that keeps `layout`'s per-GPU work (see the module docstring)."""
    changes: list[Change] = []
    heavy = _heaviest_rank(model, layout)
    pp = PROXY_PP if layout.pp > 1 else 1
    if pp != layout.pp:
        changes.append(Change("pp", layout.pp, pp, "two stages keep one stage boundary (its send/recv is "
                                                   "measured); more stages repeat the same work"))
    layers = _layers_of_rank(model, layout, heavy) * pp
    proxy_model = model.with_overrides(num_layers=layers) if layers != model.num_layers else model
    if layers != model.num_layers:
        changes.append(Change("num_layers", model.num_layers, layers,
                              f"each of the {pp} stage(s) holds the {layers // pp} layers of the full layout's "
                              f"heaviest pipeline rank ({heavy})"))
    if model.mtp_layers and pp != layout.pp:
        proxy_model = dataclasses.replace(proxy_model, mtp_layers=0)
        changes.append(Change("mtp_layers", model.mtp_layers, 0, "the MTP block sits on one stage of the full "
                              "pipeline; the cost model charges it (stage balance)"))
    world = math.lcm(layout.tp * layout.cp, layout.ep * layout.etp) * pp
    if world != num_gpus:
        changes.append(Change("world", num_gpus, world, "the smallest DP and EDP that parallel folding allows: "
                              "lcm(TP*CP, EP*ETP) * PP GPUs"))
    dp = world // (layout.tp * layout.cp * pp)
    microbatches = min(layout.grad_accum(num_gpus) or 1, STEADY_MICROBATCHES_PER_STAGE * pp)
    microbatches = max(microbatches - microbatches % pp, pp)  # the interleaved schedule wants whole rounds
    gbs = layout.mbs * dp * microbatches
    if gbs != layout.gbs:
        changes.append(Change("gbs", layout.gbs, gbs, f"{microbatches} microbatches per step reach the 1F1B "
                                                      f"steady state on {pp} stage(s)"))
    proxy_layout = layout.replace(pp=pp, gbs=gbs)
    return ProxyPlan(proxy_model, proxy_layout, world, num_gpus, layout, model, heavy, tuple(changes))


def _heaviest_rank(model: ModelSpec, layout: Layout) -> int:
    """The pipeline rank that sets the pace (the cost model's slowest rank: most layers, or the head)."""
    place = placement(model, layout.pp, layout.vpp)
    if place is None or layout.pp == 1:
        return 0
    layers = [sum(1 for u in place.rank_units(r) if u.is_layer) for r in range(layout.pp)]
    return max(range(layout.pp), key=lambda r: (layers[r], r == layout.pp - 1))


def _layers_of_rank(model: ModelSpec, layout: Layout, rank: int) -> int:
    place = placement(model, layout.pp, layout.vpp)
    if place is None or layout.pp == 1:
        return model.num_layers
    return sum(1 for u in place.rank_units(rank) if u.is_layer and not u.is_mtp)


# ---- composition ------------------------------------------------------------------------------------

@dataclass
class Composed:
    """The full layout's figures, composed from a proxy measurement; every part says where it came from."""
    step_time_s: float
    tokens_per_sec_per_gpu: float
    peak_memory_gib: float
    time_s: dict[str, dict[str, float]] = field(default_factory=dict)  # {"measured": {...}, "modelled": {...}}
    memory_gib: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "tokens_per_sec_per_gpu": self.tokens_per_sec_per_gpu,
                "peak_memory_gib": self.peak_memory_gib, "time_s": self.time_s, "memory_gib": self.memory_gib}


@dataclass(frozen=True)
class ProxyMeasurement:
    """What the proxy run measured on its heaviest rank (seconds per step, GiB)."""
    forward_backward_s: float  # the schedule's forward and backward passes of one step (bubble included)
    optimizer_s: float  # the optimizer step
    weights_gib: float
    gradients_gib: float
    optimizer_states_gib: float
    activations_per_microbatch_gib: float
    # a CPU host: the CPU-seconds a step took over all ranks, and the cores they share (None on GPUs)
    cpu_seconds_per_step: float | None = None
    host_cores: int | None = None


def compose(plan: ProxyPlan, measured: ProxyMeasurement, gpu: GPUSpec, seq_len: int) -> Composed:
    full = plan.full_layout
    est_full = estimate(plan.full_model, gpu, plan.full_world, seq_len, full)
    est_proxy = estimate(plan.model, gpu, plan.world, seq_len, plan.layout)
    time = _compose_time(plan, measured, est_full, est_proxy, gpu.is_cpu)
    memory = _compose_memory(plan, measured, est_full, _first_stages(plan, gpu, seq_len))
    step = sum(time["measured"].values()) + sum(time["modelled"].values())
    peak = sum(memory["measured"].values()) + sum(memory["modelled"].values())
    tokens = full.gbs * seq_len / step / plan.full_world
    return Composed(step, tokens, peak, time, memory)


def _compose_time(plan: ProxyPlan, m: ProxyMeasurement, est_full: Estimate, est_proxy: Estimate,
                  on_cpu: bool) -> dict[str, dict[str, float]]:
    full, proxy = plan.full_layout, plan.layout
    m_full = full.grad_accum(plan.full_world) or 1
    m_proxy = proxy.grad_accum(plan.world) or 1
    t_full, t_proxy = est_full.time, est_proxy.time
    if t_full is None or t_proxy is None:  # an illegal layout has no times to compose
        raise ValueError("composition needs the cost model's times of both layouts (legal layouts)")
    # per-microbatch stage time: the schedule's time over its microbatches plus its own bubble
    per_mb = m.forward_backward_s / (m_proxy + (proxy.pp - 1) / proxy.vpp)
    slots = m_full + (full.pp - 1) / full.vpp  # microbatch times in a full step: m plus the bubble
    measured = {"stage_compute_and_comm": per_mb * m_full, "pipeline_bubble": per_mb * (full.pp - 1) / full.vpp,
                "optimizer": m.optimizer_s * _ratio(t_full, t_proxy, "optimizer", "optimizer_offload")}
    # the full pipeline's slowest stage need not be the proxy's (the embedding, the output head, an MTP
    # block, an uneven split): the cost model's compute per microbatch of each slowest stage corrects it
    balance = _per_mb(t_full, ("compute", "recompute"), m_full) / _per_mb(t_proxy, ("compute", "recompute"), m_proxy)
    modelled = {"stage_balance": per_mb * (balance - 1.0) * slots}
    modelled.update({k: max(0.0, getattr(t_full, k) - getattr(t_proxy, k)) for k in MODELLED_TIME})
    for k in SCALE_OUT_TIME:  # per microbatch, the full layout's extra over what the proxy paid:
        extra = getattr(t_full, k) / m_full - getattr(t_proxy, k) / m_proxy  # in every slot, the bubble's too
        modelled[f"{k}_scale_out"] = max(0.0, extra) * slots
    if on_cpu:
        modelled["host_contention"] = _host_contention(plan, m, per_mb * slots)
    modelled["cpu_contention"] = _cpu_contention(plan, m, m_full / m_proxy,
                                                 sum(measured.values()) + sum(modelled.values()))
    return {"measured": measured, "modelled": modelled}


def _host_contention(plan: ProxyPlan, m: ProxyMeasurement, stage_time: float) -> float:
    """cpu only: the cost model's law (throughput.host_slowdown) applied to the measured stage time rather
    than to the cost model's own estimate of it: the proxy measured the work; only the two worlds' ratio is
    modelled."""
    if not m.host_cores:
        return 0.0
    return stage_time * (host_slowdown(plan.full_world, m.host_cores) / host_slowdown(plan.world, m.host_cores) - 1.0)


def _cpu_contention(plan: ProxyPlan, m: ProxyMeasurement, work_ratio: float, composed: float) -> float:
    """CPU ranks share the host's cores (GPUs do not): the full layout's CPU work per step, the proxy's
    scaled by its ranks and microbatches, cannot finish faster than the cores allow; the step waits for it."""
    if not m.cpu_seconds_per_step or not m.host_cores:
        return 0.0
    work = m.cpu_seconds_per_step * (plan.full_world / plan.world) * work_ratio
    return max(0.0, work / m.host_cores - composed)


def _per_mb(times: StepTime, keys: tuple[str, ...], microbatches: int) -> float:
    return max(sum(getattr(times, k) for k in keys) / microbatches, 1e-30)


def _first_stages(plan: ProxyPlan, gpu: GPUSpec, seq_len: int) -> tuple[MemoryBreakdown, MemoryBreakdown]:
    """The first pipeline rank's memory in the full layout and in the proxy: the rank the proxy measures (the most
    loaded rank of the two can differ: each has its own share of embedding, MTP and layers)."""
    return (rank_memory_breakdown(plan.full_model, gpu, plan.full_world, seq_len, plan.full_layout, 0),
            rank_memory_breakdown(plan.model, gpu, plan.world, seq_len, plan.layout, 0))


def _compose_memory(plan: ProxyPlan, m: ProxyMeasurement, est_full: Estimate,
                    first_stages: tuple[MemoryBreakdown, MemoryBreakdown]) -> dict[str, dict[str, float]]:
    full = plan.full_layout
    counts = inflight_per_chunk(full, 0, full.grad_accum(plan.full_world) or 1)
    inflight = sum(counts) / len(counts)  # the measured activations cover all of a rank's chunks
    measured = {"weights": m.weights_gib, "gradients": m.gradients_gib,
                "optimizer_states": m.optimizer_states_gib * _ratio(*first_stages, "optimizer_states"),
                "activations": m.activations_per_microbatch_gib * inflight}
    modelled = {k: getattr(est_full.memory, k) / GIB for k in BUFFERS}
    return {"measured": measured, "modelled": modelled}


def _ratio(full: StepTime | MemoryBreakdown, proxy: StepTime | MemoryBreakdown, *keys: str) -> float:
    """How the cost model scales a measured part from the proxy to the full layout (re-sharding): the ratio of
    the components `keys` (seconds or bytes) of its two breakdowns."""
    a = sum(getattr(full, k) for k in keys)
    b = sum(getattr(proxy, k) for k in keys)
    return a / b if b > 0 else 1.0


# ---- a proxy's TrialResult, composed (the sweep and bench/proxy_accuracy.py both use this) -------------

def composed_result(plan: ProxyPlan, raw: TrialResult, gpu: GPUSpec, seq_len: int) -> TrialResult:
    """The proxy's result as the full layout's: composed tokens/s, step time, peak memory and components;
    the proxy's own figures kept in extra["proxy_measured"], the breakdown in extra["composed"]."""
    composed = compose(plan, measurement(raw), gpu, seq_len)
    out = TrialResult.from_dict(raw.to_dict())
    out.tokens_per_sec_per_gpu = composed.tokens_per_sec_per_gpu
    out.step_time_s = composed.step_time_s
    out.peak_memory_gib = composed.peak_memory_gib
    out.tflops_per_gpu = _scaled(raw.tflops_per_gpu, composed, raw)
    out.mfu = _scaled(raw.mfu, composed, raw)
    out.memory_gib = {k: v for part in composed.memory_gib.values() for k, v in part.items()}
    out.extra["composed"] = composed.to_dict()
    out.extra["proxy_measured"] = {k: getattr(raw, k) for k in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu",
                                                                "step_time_s", "peak_memory_gib", "applied")}
    # what was in effect is the proxy's (judged against the proxy's layout): the full layout never ran
    out.applied = {}
    return out


def _first_stage_memory(raw: TrialResult) -> dict[str, float]:
    """The measured components of the proxy's first pipeline stage (the stage composition scales: it holds the
    most microbatches in flight), its heaviest rank; the trainer's heaviest rank when it does not say."""
    per_rank = raw.extra.get("memory_gib_per_rank") or []
    stages = raw.extra.get("pipeline_rank_per_rank") or []
    first = [m for m, stage in zip(per_rank, stages) if stage == 0]
    if not first:
        return raw.memory_gib
    return max(first, key=lambda m: m.get("activations_per_microbatch", 0.0) + m.get("weights", 0.0))


def measurement(raw: TrialResult) -> ProxyMeasurement:
    """What composition reads from a proxy's TrialResult (the trainer's extra fields)."""
    parts = raw.extra.get("step_parts_s") or {}
    mem = _first_stage_memory(raw)
    step = raw.step_time_s or 0.0
    fwd_bwd = parts.get("forward_backward")
    if fwd_bwd is None:
        fwd_bwd = step
    optimizer = parts.get("optimizer")
    if optimizer is None:
        optimizer = max(step - fwd_bwd, 0.0)
    return ProxyMeasurement(forward_backward_s=fwd_bwd, optimizer_s=optimizer, weights_gib=mem.get("weights", 0.0),
                            gradients_gib=mem.get("gradients", 0.0),
                            optimizer_states_gib=mem.get("optimizer_states", 0.0),
                            activations_per_microbatch_gib=mem.get("activations_per_microbatch", 0.0),
                            cpu_seconds_per_step=raw.extra.get("cpu_seconds_per_step"),
                            host_cores=raw.extra.get("host_cores"))


def _scaled(value: float | None, composed: Composed, raw: TrialResult) -> float | None:
    """A per-GPU rate scales with tokens/s (same FLOPs per token)."""
    if value is None or not raw.tokens_per_sec_per_gpu:
        return None
    return value * composed.tokens_per_sec_per_gpu / raw.tokens_per_sec_per_gpu
