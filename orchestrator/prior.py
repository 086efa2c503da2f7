"""What the orchestrator knows before measuring: the model, the GPU, the legal space and the cost model.

The one place the orchestrator calls search_spaces (so a test can stand in for it, and so the space and
the predictions are computed once per sweep).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from search_spaces.layout import Layout

from orchestrator.spec import SweepSpec


@dataclass
class Prediction:
    legal: bool
    fits: bool
    reason: str | None
    tokens_per_sec_per_gpu: float
    peak_memory_gib: float | None
    data: dict[str, Any]  # Estimate.to_dict(): stored beside the measurement

    @property
    def feasible(self) -> bool:
        return self.legal and self.fits


@dataclass
class Prior:
    spec: SweepSpec
    _cache: dict[str, Prediction] = field(default_factory=dict)

    @cached_property
    def model(self):
        from search_spaces.models import load_model
        model = load_model(self.spec.model)
        o = self.spec.model_overrides
        if o.num_layers or o.hidden_size:
            model = model.with_overrides(num_layers=o.num_layers, hidden_size=o.hidden_size)
        return model

    @cached_property
    def gpu(self):
        from search_spaces.hardware import load_gpu
        return load_gpu(self.spec.gpu)

    @property
    def memory_limit_gib(self) -> float:
        return float(self.gpu.memory_gib)

    # spaces up to this many raw combinations are enumerated whole; larger ones only through explore()
    SMALL_SPACE = 50_000

    @cached_property
    def dimensions(self) -> dict[str, list[Any]]:
        """The values each layout field takes in the space (after the spec's fixed values).

        A subclass with its own `candidates` (e.g. replay: the table's layouts) gets their values."""
        if type(self).candidates is not Prior.candidates:
            values: dict[str, list[Any]] = {}
            for lay in self.candidates:
                for name, value in lay.to_dict().items():
                    value = tuple(value) if isinstance(value, list) else value
                    values.setdefault(name, [])
                    if value not in values[name]:
                        values[name].append(value)
                values.setdefault("recompute", [])
                if lay.recompute not in values["recompute"]:
                    values["recompute"].append(lay.recompute)
            return values
        from search_spaces.space import dimensions
        return dict(dimensions(self.model, self.gpu, self.spec.num_gpus, self.spec.seq_len,
                               fixed=dict(self.spec.fixed) or None, gbs=self.spec.gbs).values)

    @cached_property
    def small_space(self) -> bool:
        return math.prod(len(v) for v in self.dimensions.values()) <= self.SMALL_SPACE

    @cached_property
    def candidates(self) -> list[Layout]:
        """Legal layouts: all of a small space; of a large one (millions) the cost model's top 512."""
        from search_spaces.space import candidate_layouts
        if self.small_space:
            return candidate_layouts(self.model, self.gpu, self.spec.num_gpus, self.spec.seq_len,
                                     fixed=dict(self.spec.fixed) or None, gbs=self.spec.gbs)
        return self._explore_top(512)

    def ranked(self, limit: int = 64) -> list[Layout]:
        """Legal layouts the cost model expects to fit, fastest first (all of a small space, else the top)."""
        if self.small_space or type(self).candidates is not Prior.candidates:
            scored = [(self.predict(lay), lay) for lay in self.candidates]
            return [lay for pred, lay in sorted(scored, key=lambda x: -x[0].tokens_per_sec_per_gpu)
                    if pred.feasible]
        return self._explore_top(limit)

    def _explore_top(self, limit: int) -> list[Layout]:
        from search_spaces.space import explore
        found = explore(self.model, self.gpu, self.spec.num_gpus, self.spec.seq_len,
                        fixed=dict(self.spec.fixed) or None, gbs=self.spec.gbs, top=limit)
        return [Layout.from_dict(row["layout"]) for row in found.top]

    def seeds(self, limit: int = 8) -> list[Layout]:
        """The rules of thumb, with the spec's fixed values applied."""
        try:
            from search_spaces.heuristics import seed_layouts
        except ImportError:  # rules of thumb not available: start from the cost model's favourites
            return self.ranked(limit)[:limit]
        seeds = seed_layouts(self.model, self.gpu, self.spec.num_gpus, self.spec.seq_len,
                             gbs=self.spec.gbs, limit=limit)
        if self.spec.fixed:
            seeds = [s.replace(**_fixed_fields(self.spec)) for s in seeds]
        return list(dict.fromkeys(seeds))

    def predict(self, layout: Layout) -> Prediction:
        key = layout.key()
        if key not in self._cache:
            from search_spaces.costmodel import estimate
            est = estimate(self.model, self.gpu, self.spec.num_gpus, self.spec.seq_len, layout)
            data = est.to_dict()
            violations = list(getattr(est, "violations", []) or [])
            reason = None
            if violations:
                reason = "; ".join(f"{v.rule}: {v.reason}" for v in violations)
            elif not est.fits:
                reason = (f"predicted peak memory {est.peak_memory_gib:.1f} GiB exceeds the "
                          f"{self.memory_limit_gib:g} GiB of a {self.spec.gpu}")
            self._cache[key] = Prediction(
                legal=bool(est.legal), fits=bool(est.fits), reason=reason,
                tokens_per_sec_per_gpu=float(est.tokens_per_sec_per_gpu or 0.0),
                peak_memory_gib=None if est.peak_memory_gib is None else float(est.peak_memory_gib),
                data=data)
        return self._cache[key]


def _fixed_fields(spec: SweepSpec) -> dict[str, Any]:
    return dict(spec.fixed)
