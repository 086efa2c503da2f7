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

    @cached_property
    def dimensions(self) -> dict[str, list[Any]]:
        """The values each layout field takes in the space (after the spec's fixed values)."""
        from search_spaces.space import dimensions
        return dict(dimensions(self.model, self.gpu, self.spec.num_gpus, self.spec.seq_len,
                               fixed=dict(self.spec.fixed) or None, gbs=self.spec.gbs).values)

    def ranked(self, limit: int = 64) -> list[Layout]:
        """Legal layouts the cost model expects to fit, fastest first (all of a small space, else the top)."""
        from search_spaces.space import candidate_layouts, explore
        fixed = dict(self.spec.fixed) or None
        if math.prod(len(v) for v in self.dimensions.values()) <= 50_000:
            pool = candidate_layouts(self.model, self.gpu, self.spec.num_gpus, self.spec.seq_len, fixed=fixed,
                                     gbs=self.spec.gbs)
            scored = [(self.predict(lay), lay) for lay in pool]
            return [lay for pred, lay in sorted(scored, key=lambda x: -x[0].tokens_per_sec_per_gpu)
                    if pred.feasible]
        found = explore(self.model, self.gpu, self.spec.num_gpus, self.spec.seq_len, fixed=fixed,
                        gbs=self.spec.gbs, top=limit)
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
