"""Which size a trial runs at, what it costs in GPU time, and the full-scale result of a proxy trial.

`fidelity: full` runs every layout at its target size; `proxy` runs its proxy (search_spaces.proxy) whenever
that is smaller; `auto` (the default) runs at full size when the layout's world fits in `trial_gpus`, else as
a proxy. A proxy that does not fit in `trial_gpus` either cannot run: the screen says so, for free.
The analytic backend predicts the full layout directly; it records the fidelity a real sweep would use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.costmodel import estimate
from search_spaces.layouts.layout import Layout
from search_spaces.proxy import ProxyPlan, composed_result, derive_proxy
from search_spaces.result import TrialResult
from search_spaces.validation import validate

from orchestrator.spec.schema import SweepSpec

# a trial's fixed cost (job start, model build, first compile), for GPU-time estimates of what-if trials
STARTUP_S = 300.0
WHAT_IF_SOURCES = ("costmodel", "replay")  # TrialResult.extra["source"] of the analytic and replay backends


@dataclass(frozen=True)
class TrialSize:
    """How one proposal runs: at full size, or as a proxy (with its plan)."""
    fidelity: str  # full | proxy
    layout: Layout  # what the backend runs
    world: int
    num_layers: int | None  # a model override for the trainer (None: the spec's)
    plan: ProxyPlan | None = None
    refusal: str | None = None  # why it cannot run within trial_gpus

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fidelity": self.fidelity, "world": self.world}
        if self.plan is not None:
            out["proxy"] = self.plan.to_dict()
        return out


@dataclass(frozen=True)
class Sizing:
    """What decides a trial's size and its GPU time, read from the spec once (the sweep's door to it)."""
    model: ModelSpec
    gpu: GPUSpec
    num_gpus: int  # the target cluster's
    gpus_per_node: int
    limit: int  # the most GPUs one trial may use (trial_gpus, else the whole cluster)
    fidelity: str  # full | proxy | auto
    num_layers: int | None  # the spec's model override
    steps: int  # warm-up included: what a trial runs

    @classmethod
    def of(cls, spec: SweepSpec, model: ModelSpec, gpu: GPUSpec, num_gpus: int) -> "Sizing":
        """`model`, `gpu` and `num_gpus` (the target cluster's GPUs) as the sweep's prior read them from `spec`."""
        return cls(model, gpu, num_gpus, spec.gpus_per_node, spec.trial_gpus or num_gpus, spec.fidelity,
                   spec.model_overrides.num_layers, spec.steps + spec.warmup)

    def size(self, layout: Layout) -> TrialSize:
        """How `layout` runs: at full size, or as its proxy; with the reason when it cannot run within the limit."""
        full = TrialSize("full", layout, self.num_gpus, self.num_layers)
        if self.fidelity == "full" or (self.fidelity == "auto" and self.num_gpus <= self.limit):
            return full
        plan = derive_proxy(self.model, layout, self.gpu, self.num_gpus)
        if not plan.strictly_smaller:  # the layout is its own proxy
            too_big = (f"it needs its full {self.num_gpus} GPUs (no smaller proxy), more than trial_gpus "
                       f"({self.limit})")
            return full if self.num_gpus <= self.limit else TrialSize("full", layout, self.num_gpus, self.num_layers,
                                                                      refusal=too_big)
        refusal = (f"its proxy needs {plan.world} GPUs, more than trial_gpus ({self.limit})"
                   if plan.world > self.limit else None)
        return TrialSize("proxy", plan.layout, plan.world, plan.model.num_layers, plan, refusal)

    def placement(self, world: int) -> tuple[int, int]:
        """(nodes, GPUs per node) of a trial on `world` GPUs: the cluster's own shape at full size."""
        per_node = min(self.gpus_per_node, world)
        return math.ceil(world / per_node), per_node

    def gpu_seconds(self, size: TrialSize, result: TrialResult) -> tuple[float | None, float | None]:
        """(GPU-seconds the trial used, GPU-seconds the same trial would have used at full size); estimated from
        the step time for what-if trials (a start-up of STARTUP_S plus the steps)."""
        steps = self.steps
        step = result.step_time_s
        if result.extra.get("source") in WHAT_IF_SOURCES or not result.wall_time_s:
            if step is None:
                return None, None
            proxy_step = (result.extra.get("proxy_measured") or {}).get("step_time_s") or step
            return (STARTUP_S + steps * proxy_step) * size.world, (STARTUP_S + steps * step) * self.num_gpus
        used = result.wall_time_s * size.world
        if size.fidelity == "full":
            return used, used
        proxy_step = (result.extra.get("proxy_measured") or {}).get("step_time_s") or 0.0
        fixed = max(result.wall_time_s - steps * proxy_step, 0.0)
        return used, (fixed + steps * (step or proxy_step)) * self.num_gpus


def trial_size(spec: SweepSpec, model: ModelSpec, gpu: GPUSpec, layout: Layout) -> TrialSize:
    """`layout`'s size under `spec` (Sizing.size)."""
    return Sizing.of(spec, model, gpu, spec.num_gpus).size(layout)


def full_scale(size: TrialSize, raw: TrialResult, gpu: GPUSpec, seq_len: int) -> TrialResult:
    """The result the sweep records: a full-size run's as measured; a proxy's composed to the full layout,
    the proxy's own figures kept beside it. Judged (validation) against what actually ran."""
    if raw.extra.get("source") in WHAT_IF_SOURCES:  # a prediction (or recording) of the full layout itself
        raw.extra.update(size.record())
        if size.plan is not None:
            proxy = estimate(size.plan.model, gpu, size.plan.world, seq_len, size.plan.layout, with_time=True)
            raw.extra["proxy_measured"] = {"step_time_s": proxy.step_time_s}  # what the proxy would take
        return validate(raw, size.layout if size.plan is None else size.plan.full_layout, gpu)
    raw = validate(raw, size.layout, gpu)
    if size.plan is None or raw.status != "ok":
        raw.extra.update(size.record())
        return raw
    out = composed_result(size.plan, raw, gpu, seq_len)
    out.extra.update(size.record())
    return out
