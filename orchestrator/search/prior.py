"""What the sweep knows before measuring: the model, the GPU, the layout space and the cost model.

The one place the sweep calls search_spaces for the space and the predictions (computed once per sweep, so
a test or the replay backend can stand in for it). A dimension the spec does not free is *pinned*: held at
the first rule of thumb's value (or the spec's fixed value), so the space varies exactly the free ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from search_spaces.calibration.fit import Calibration, load_calibration
from search_spaces.catalog.hardware import GPUSpec, load_gpu
from search_spaces.catalog.models import ModelSpec, load_model
from search_spaces.cost.costmodel import estimate
from search_spaces.errors import SpecError
from search_spaces.layouts.forked import Ahead
from search_spaces.layouts.heuristics import seed_layouts
from search_spaces.layouts.layout import BY_NAME, SEARCH_DIMENSIONS, Layout, distinct
from search_spaces.layouts.space import candidate_layouts, default_gbs, dimensions, explore

from orchestrator.dispatch.replay import ReplayTable, table_for
from orchestrator.spec.schema import SweepSpec


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
    _cache: dict[Layout, Prediction] = field(default_factory=dict)
    # layouts carried over from elsewhere (a length family's previous length), tried before the rules of thumb
    carried: list[Layout] = field(default_factory=list)
    exploring: Ahead[list[Layout]] | None = field(default=None, repr=False, compare=False)
    """The exploration explore_ahead began in a forked child, until the ranking is taken (not part of what the prior
    is): whoever asked for it stops it when it leaves (Ahead.stop)."""
    num_gpus: int = field(init=False)
    """The target cluster's GPUs (nodes x GPUs per node), read from the spec once."""

    # spaces up to this many raw combinations are enumerated whole; larger ones only through explore()
    SMALL_SPACE = 50_000

    def __post_init__(self) -> None:
        self.num_gpus = self.spec.num_gpus

    @cached_property
    def model(self) -> ModelSpec:
        model = load_model(self.spec.model)
        o = self.spec.model_overrides
        if o.num_layers or o.hidden_size:
            model = model.with_overrides(num_layers=o.num_layers, hidden_size=o.hidden_size)
        return model

    @cached_property
    def gpu(self) -> GPUSpec:
        return load_gpu(self.spec.gpu)

    @cached_property
    def cal(self) -> Calibration:
        """The cost model's constants: the spec's calibration file over the packaged ones (data handed in), at the
        spec's software release (search_spaces/catalog/maturity.py)."""
        from search_spaces.catalog.maturity import at_software
        return at_software(load_calibration(self.spec.calibration), self.spec.software, [self.gpu.name])

    @cached_property
    def packing(self):
        """The packed documents' histogram (search_spaces/cost/packing.py), None for full-length documents."""
        return self.spec.packing.histogram(self.spec.seq_len)

    @property
    def memory_limit_gib(self) -> float:
        return float(self.gpu.memory_gib)

    @property
    def gbs(self) -> int:
        return self.spec.gbs or default_gbs(self.spec.seq_len, self.gpu)

    # ---- where the search starts -----------------------------------------------------------------
    @cached_property
    def rules_of_thumb(self) -> list[Layout]:
        """The rules of thumb (search_spaces.layouts.heuristics), with the spec's fixed values applied."""
        fixed = self.fixed
        seeds = seed_layouts(self.model, self.gpu, self.num_gpus, self.spec.seq_len, gbs=self.spec.gbs,
                             cal=self.cal)
        return distinct(s.replace(**fixed) for s in seeds)

    @cached_property
    def fixed(self) -> dict[str, Any]:
        return {name: BY_NAME[name].parse(value) for name, value in self.spec.fixed.items()}

    @cached_property
    def base(self) -> Layout:
        """The layout every proposal starts from: the first rule of thumb (else the defaults), fixed applied."""
        if self.rules_of_thumb:
            return self.rules_of_thumb[0]
        return Layout(gbs=self.gbs).replace(**self.fixed)

    @cached_property
    def pinned(self) -> dict[str, Any]:
        """Field values the whole space shares: the spec's fixed ones and every dimension it does not free."""
        held = {name: getattr(self.base, name) for name in SEARCH_DIMENSIONS if name not in self.spec.free}
        return {**held, **self.fixed}

    # a rule of thumb the cost model expects below this share of its best layout's throughput is not worth a
    # trial: the model's error per dimension value is about 10%, so it is unlikely to be the best, and the
    # search gets there sooner from the ranking (bench/search_efficiency.py: median 15 -> 12 trials)
    SEED_FLOOR = 0.9

    def seeds(self, limit: int = 4) -> list[Layout]:
        """The carried layouts, then the rules of thumb, inside the space (pinned values applied), best first:
        the first rule of thumb that fits (the recipe a user would have guessed, measured beside the search),
        the others only where the cost model expects them within SEED_FLOOR of its best layout."""
        thumbs = [s.replace(**self.pinned) for s in self.rules_of_thumb]
        fitting = [s for s in thumbs if self.predict(s).feasible]
        best = self.ranked(limit=1)
        if fitting and best:
            floor = self.SEED_FLOOR * self.predict(best[0]).tokens_per_sec_per_gpu
            thumbs = [fitting[0], *(s for s in fitting[1:] if self.predict(s).tokens_per_sec_per_gpu >= floor)]
        return distinct([*(s.replace(**self.pinned) for s in self.carried), *thumbs])[:limit]

    # ---- the space -------------------------------------------------------------------------------
    @cached_property
    def dimensions(self) -> dict[str, list[Any]]:
        """The values each layout field takes in the space."""
        return dict(dimensions(self.model, self.gpu, self.num_gpus, self.spec.seq_len,
                               fixed=self.pinned, gbs=self.spec.gbs, free=self.spec.free).values)

    @cached_property
    def small_space(self) -> bool:
        return math.prod(len(v) for v in self.dimensions.values()) <= self.SMALL_SPACE

    @cached_property
    def candidates(self) -> list[Layout]:
        """Legal layouts: all of a small space; of a large one (millions) the cost model's top 512."""
        if self.small_space:
            return candidate_layouts(self.model, self.gpu, self.num_gpus, self.spec.seq_len,
                                     fixed=self.pinned, gbs=self.spec.gbs, free=self.spec.free)
        return self._explored

    def ranked(self, limit: int = 64) -> list[Layout]:
        """Legal layouts the cost model expects to fit, fastest first (all of a small space, else the top)."""
        if not self.small_space:
            return self._explored[:limit]
        scored = [(self.predict(lay), lay) for lay in self.candidates]
        return [lay for pred, lay in sorted(scored, key=lambda x: -x[0].tokens_per_sec_per_gpu) if pred.feasible]

    EXPLORED = 512  # how many of a large space's fitting layouts the cost model ranks (explore's top)

    def explore_ahead(self) -> Ahead[list[Layout]] | None:
        """Begin a large space's exploration in a forked child, to be taken when the sweep first needs the ranking
        (None for a small space, enumerated whole when needed): the caller loads the sweep's libraries meanwhile,
        and stops the returned child when it leaves (Ahead.stop)."""
        if self.small_space or "_explored" in self.__dict__:
            return None
        self.exploring = Ahead(self._explore)
        return self.exploring

    @cached_property
    def _explored(self) -> list[Layout]:
        ahead, self.exploring = self.exploring, None
        return ahead.result() if ahead is not None else self._explore()

    def _explore(self) -> list[Layout]:
        # no time budget (budget_s=None): how much is ranked is a count (explore's max_grids), so a seeded sweep
        # proposes the same layouts on a loaded machine as on a quiet one
        found = explore(self.model, self.gpu, self.num_gpus, self.spec.seq_len, fixed=self.pinned,
                        gbs=self.spec.gbs, top=self.EXPLORED, budget_s=None, cal=self.cal, free=self.spec.free,
                        packing=self.packing)
        return [Layout.from_dict(row["layout"]) for row in found.top]

    # ---- the cost model --------------------------------------------------------------------------
    def predict(self, layout: Layout) -> Prediction:
        if layout not in self._cache:
            self._cache[layout] = self._predict(layout)
        return self._cache[layout]

    def _predict(self, layout: Layout) -> Prediction:
        est = estimate(self.model, self.gpu, self.num_gpus, self.spec.seq_len, layout, cal=self.cal,
                       packing=self.packing)
        reason = None
        if est.violations:
            reason = "; ".join(f"{v.rule}: {v.reason}" for v in est.violations)
        elif not est.fits:
            reason = (f"predicted peak memory {est.peak_memory_gib:.1f} GiB exceeds the "
                      f"{self.memory_limit_gib:g} GiB of a {self.spec.gpu}")
        return Prediction(legal=bool(est.legal), fits=bool(est.fits), reason=reason,
                          tokens_per_sec_per_gpu=float(est.tokens_per_sec_per_gpu or 0.0),
                          peak_memory_gib=None if est.peak_memory_gib is None else float(est.peak_memory_gib),
                          data=est.to_dict())


class ReplayPrior(Prior):
    """The cost model's prior over exactly the layouts of a replay table (backend replay).

    Proposals the table lacks are predicted illegal (the sweep rejects them without a trial); the rules of
    thumb become the table layouts nearest to them.
    """

    def __init__(self, spec: SweepSpec, table: ReplayTable):
        super().__init__(spec)
        self.table = table

    @cached_property
    def rules_of_thumb(self) -> list[Layout]:
        fixed = self.fixed
        pool = [lay for lay in self.table.layouts if all(getattr(lay, k) == v for k, v in fixed.items())]
        if not pool:
            raise SpecError(f"no layout of replay table {self.table.path} has the fixed values {dict(self.spec.fixed)}")
        return distinct(nearest(seed, pool) for seed in super().rules_of_thumb) or pool[:1]

    @cached_property
    def candidates(self) -> list[Layout]:
        pinned = self.pinned
        return [lay for lay in self.table.layouts if all(getattr(lay, k) == v for k, v in pinned.items())]

    @cached_property
    def dimensions(self) -> dict[str, list[Any]]:
        values: dict[str, list[Any]] = {}
        for lay in self.candidates:
            for name in BY_NAME:
                seen = values.setdefault(name, [])
                if getattr(lay, name) not in seen:
                    seen.append(getattr(lay, name))
        return values

    @property
    def small_space(self) -> bool:
        return True  # the table is the space

    def _predict(self, layout: Layout) -> Prediction:
        if layout not in self._in_table:
            return Prediction(legal=False, fits=False, tokens_per_sec_per_gpu=0.0, peak_memory_gib=None,
                              reason=f"not in the replay table {self.table.path}", data={"legal": False})
        return super()._predict(layout)

    @cached_property
    def _in_table(self) -> set[Layout]:
        return set(self.candidates)


def nearest(layout: Layout, pool: list[Layout]) -> Layout:
    """The pool layout differing from `layout` in the fewest fields (the first on ties)."""
    target = layout.params()
    return min(pool, key=lambda cand: sum(1 for k, v in cand.params().items() if target[k] != v))


def make_prior(spec: SweepSpec, explore_ahead: bool = False) -> Prior:
    """The prior a sweep of `spec` uses: the cost model, cut down to the table for replay. `explore_ahead`: a large
    space's exploration begins now, in a forked child (Prior.explore_ahead, Prior.exploring)."""
    prior = ReplayPrior(spec, table_for(spec)) if spec.backend == "replay" else Prior(spec)
    if explore_ahead:
        prior.explore_ahead()
    return prior
