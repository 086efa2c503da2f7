"""The sweep's samplers: Optuna samplers over the layout parameters (the searches of orchestrator.search.table).

    CalibratedSampler  the untried legal layout the cost model ranks best, corrected online from every
                       measurement (orchestrator.search.calibrated.CalibratedSearch: expected improvement
                       over per-value effects); tries near misses of the memory model on purpose
    TPESearch          Optuna's multivariate TPE over the dimensions (proposals the cost model rejects are free)
    OrderedSampler     the first untried layout of a fixed order (random search, NeMo's grid order)

Every sampler the sweep uses is an Optuna sampler with the hooks of `SweepSampler` (the loop asks nothing else;
`SearchHooks` gives the defaults). The layout samplers are relative samplers: each trial gets a whole layout at once
(every search dimension is one categorical parameter, `SweepSpace`), and before each proposal they read the study, so
they learn from every finished trial, whoever ran it (this driver, a resumed one) and never propose a layout that is
finished, running or queued. The rules of thumb are enqueued trials (Optuna's warm start), for every sampler.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Protocol, runtime_checkable

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.records import TrialRecord
from orchestrator.search.calibrated import CalibratedSearch
from orchestrator.search.prior import Prior
from orchestrator.search.space import SweepSpace

# a layout is taken while its trial is queued or running, and once it was told a verdict (TrialRecord.finished:
# measured, failed or rejected; an interrupted trial runs again on resume)
_PENDING = (TrialState.RUNNING, TrialState.WAITING)


@runtime_checkable
class SweepSampler(Protocol):
    """What the sweep loop asks of its sampler besides Optuna's own hooks (sample_relative, ...)."""

    memory_margin: float
    """Proposals may exceed the cost model's memory prediction by this factor (the screen lets them through)."""
    exhausted: bool
    """Nothing untried is left to propose: the sweep stops asking."""


class SearchHooks:
    """The defaults of SweepSampler's hooks: no margin over the memory model, never exhausted."""

    memory_margin: float = 1.0
    exhausted: bool = False


class TPESearch(SearchHooks, optuna.samplers.TPESampler):
    """Optuna's TPE, multivariate: layout dimensions interact (TP*CP*PP must divide the world...)."""

    def __init__(self, seed: int | None):
        super().__init__(seed=seed, multivariate=True, n_startup_trials=8)


class LayoutSampler(SearchHooks, optuna.samplers.BaseSampler):
    """Proposes one untried layout per trial; subclasses choose it (`next_layout`) and learn (`observe`)."""

    def __init__(self, space: SweepSpace):
        self.space = space
        self.exhausted = False
        self._observed: set[int] = set()
        self._keys: dict[int, str] = {}
        self._verdicts: dict[int, TrialRecord | None] = {}

    # ---- what subclasses decide ------------------------------------------------------------------
    def next_layout(self, taken: set[str]) -> Layout | None:
        raise NotImplementedError

    def observe(self, layout: Layout, status: str, tokens_per_sec_per_gpu: float | None,
                peak_memory_gib: float | None) -> None:
        """A finished trial's outcome (status as the sweep recorded it)."""

    # ---- Optuna's hooks --------------------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.space.distributions()

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:  # an enqueued trial brings its own
            return {}
        trials = study.get_trials(deepcopy=False)
        self._learn(trials)
        layout = self.next_layout(self._taken(trials, trial.number))
        if layout is None:
            self.exhausted = True
            return {}
        return self.space.params(layout)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        # only when nothing was left to propose (`exhausted`): any value, the sweep does not run it
        if not isinstance(param_distribution, CategoricalDistribution):  # the space's are all categorical
            raise TypeError(f"parameter {param_name} is not categorical: {param_distribution!r}")
        return param_distribution.choices[0]

    # ---- reading the study -----------------------------------------------------------------------
    def _learn(self, trials: Iterable[FrozenTrial]) -> None:
        for t in trials:
            record = self._verdict(t)
            if t.number in self._observed or record is None:
                continue
            self._observed.add(t.number)
            layout = self._layout_of(t.params)
            if layout is not None and record.status:
                self.observe(layout, record.status, *_observed(t, record))

    def _taken(self, trials: Iterable[FrozenTrial], current: int) -> set[str]:
        keys = set()
        for t in trials:
            if (t.state in _PENDING or self._told(t)) and t.number != current:
                key = self._key_of(t)
                if key is not None:
                    keys.add(key)
        return keys

    def _told(self, t: FrozenTrial) -> bool:
        return self._verdict(t) is not None

    def _verdict(self, t: FrozenTrial) -> TrialRecord | None:
        """The record of a trial told a verdict (TrialRecord.finished), else None; read once: a finished trial's
        record never changes."""
        if not t.state.is_finished():
            return None
        if t.number not in self._verdicts:
            record = TrialRecord.of(t)
            self._verdicts[t.number] = record if record.finished else None
        return self._verdicts[t.number]

    def _key_of(self, t: FrozenTrial) -> str | None:
        """The layout key of a trial's params, remembered (a trial's params never change once set)."""
        if t.number not in self._keys:
            params = t.params or t.system_attrs.get("fixed_params") or {}
            layout = self._layout_of(params)
            if layout is None:
                return None
            if t.params:  # a queued trial's params are final only once it runs
                self._keys[t.number] = layout.key()
            return layout.key()
        return self._keys[t.number]

    def _layout_of(self, params: dict[str, Any]) -> Layout | None:
        if not params:
            return None
        try:
            return self.space.layout(params)
        except SpecError:  # a combination that is not a Layout (a TPE proposal): nothing to learn from it
            return None


class CalibratedSampler(LayoutSampler):
    memory_margin = CalibratedSearch.MEMORY_MARGIN

    def __init__(self, space: SweepSpace, prior: Prior, seed: int | None, candidates: list[Layout] | None = None):
        super().__init__(space)
        self.search = CalibratedSearch.from_prior(prior, candidates=candidates, seed=seed or 0)

    def next_layout(self, taken: set[str]) -> Layout | None:
        return self.search.propose(taken)

    def observe(self, layout, status, tokens_per_sec_per_gpu, peak_memory_gib) -> None:
        self.search.observe(layout, status, tokens_per_sec_per_gpu, peak_memory_gib)

    def chance_of_better(self, study: optuna.Study, tried: set[str], best: float, margin: float) -> float:
        """CalibratedSearch.chance_of_better, after learning from every trial the study has told."""
        self._learn(study.get_trials(deepcopy=False))
        return self.search.chance_of_better(tried, best, margin)

    def answer(self, study: optuna.Study) -> Layout | None:
        """CalibratedSearch.answer (the measured layout it believes fastest), after learning from the study."""
        self._learn(study.get_trials(deepcopy=False))
        return self.search.answer()


class OrderedSampler(LayoutSampler):
    """The first untried layout of a fixed order (random search, grid search)."""

    def __init__(self, space: SweepSpace, order: list[Layout]):
        super().__init__(space)
        self.order = order

    def next_layout(self, taken: set[str]) -> Layout | None:
        return next((lay for lay in self.order if lay.key() not in taken), None)


def _observed(t: FrozenTrial, record: TrialRecord) -> tuple[float | None, float | None]:
    """What a trial says of its layout: (tokens/s/GPU, peak memory GiB) as measured; for one pruned (cannot win),
    its tokens/s/GPU is the median of the steps it reported before it was stopped (issue 59: a search that learns
    nothing from a pruned trial needs more trials than one that runs every trial whole)."""
    tokens, peak = (record.measured(name) for name in ("tokens_per_sec_per_gpu", "peak_memory_gib"))
    if record.status == "pruned" and t.intermediate_values:
        return float(statistics.median(t.intermediate_values.values())), peak
    return tokens, peak


def nemo_grid_order(layouts: Iterable[Layout]) -> list[Layout]:
    """NeMo Auto-Configurator's loop nesting: TP, PP, CP, EP, MBS outermost (smallest first), then the rest."""
    return sorted(layouts, key=lambda lay: ((lay.tp, lay.pp, lay.cp, lay.ep, lay.mbs),
                                            tuple(str(v) for v in lay.params().values())))
