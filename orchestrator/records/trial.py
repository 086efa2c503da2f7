"""TrialRecord: one trial as the sweep stores it (Optuna's fields and the user attrs), with the questions the
read side asks and what it feeds MLflow."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Self

import optuna

from search_spaces.layouts.layout import Layout
from search_spaces.result import TrialResult

from orchestrator.records.metrics import BY_METRIC, METRICS, Metric
from orchestrator.records.stored import (
    COLUMN,
    COMPOSED,
    EXTRA,
    PREDICTED,
    TABLE,
    TAG,
    Stored,
    dump_layout,
    dump_result,
    finite,
    load_layout,
    load_result,
    stored,
)

TRIAL_TAG = "optuna_trial_number"  # the MLflow tag that names a child run's trial
PROMOTION_TAG = "moe_autotune.trial"  # the tag of a promotion's run (a child of the sweep's run, not a trial's)
# the reason a failed trial that had stored a result reads as interrupted (TrialRecord.of)
INTERRUPTED_BEFORE_TELL = "the sweep stopped after the trial was measured, before it was recorded"
MAX_TAG_CHARS = 4000  # what an MLflow tag value keeps of a long reason (a trainer's traceback)


RULE_OF_THUMB, PREVIOUS_LENGTH = "rule-of-thumb", "previous length"
SEED_SOURCES = (RULE_OF_THUMB, PREVIOUS_LENGTH)
"""Who proposed a study's first trials (Proposer.seeds): layouts nothing measured here and the search did not pick."""


@dataclass(frozen=True)
class TrialRecord(Stored):
    """One trial as the sweep stored it: Optuna's own fields, then the user attrs (the `stored` fields)."""
    number: int
    """Optuna's trial number."""
    state: str = "complete"
    """Optuna's trial state, lower case (complete, fail, running, waiting, pruned)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Optuna's params: the layout's encoded values."""
    values: tuple[float, ...] = ()
    """The objectives told: (tokens/s/GPU, peak memory GiB); () until told."""
    constraints: tuple[float, ...] = ()
    """memory_over_limit_gib, not_measured_ok: the sweep's verdict (feasible when all are <= 0)."""

    layout: Layout | None = stored("The layout proposed (Layout.to_dict() when stored); a proposal that is not a "
                                   "Layout stores its params and reads as None.", load=load_layout, dump=dump_layout)
    layout_key: str | None = stored("Layout.key(): repeats (and a layout's two fidelities) are found by it.")
    proposed_by: str | None = stored("rule-of-thumb, previous length, resume, confirm, or the search's name.")
    prediction: dict[str, Any] = stored("The cost model's estimate (Estimate.to_dict()), kept beside the "
                                        "measurement.", PREDICTED, factory=dict)
    backend: str | None = stored("The backend that ran it (BACKENDS; `local` before it was `ray`).", TAG)
    fidelity: str | None = stored("full, or proxy: measured on a proxy and composed to full size; None for a "
                                  "proposal that never started (older studies: full).", COLUMN, TAG)
    trial_size: dict[str, Any] = stored("TrialSize.record(): the fidelity, the GPUs it ran on, the proxy's plan.",
                                        factory=dict)
    mlflow_run_id: str | None = stored("The trial's MLflow child run.", COLUMN)
    status: str | None = stored("ok | oom | error | invalid | timeout | infeasible | interrupted | unschedulable | "
                                "pruned (search_spaces.result.STATUSES); None while it runs. A failed trial that "
                                "stored ok reads as interrupted: only the tell counts a measurement.", TABLE, TAG)
    result: TrialResult | None = stored("What it measured (TrialResult.to_dict() when stored), judged where it "
                                        "entered.", load=load_result, dump=dump_result)
    reason: str | None = stored("Why it was rejected, failed or stopped early (one line or a trainer's error).",
                                COLUMN, TAG)
    failure_class: str | None = stored("A failed trial's root cause, one of search_spaces.failures.FAILURE_CLASSES "
                                       "(oom, collective_mismatch, timeout, killed, config_refused, communication, "
                                       "error); None when it did not fail.", COLUMN, TAG)
    failure_rank: int | None = stored("The rank that failed first (the root cause's); None when no log or record "
                                      "says.", COLUMN, TAG)
    failure_reason: str | None = stored("The root cause in one line (`RuntimeError: ...`, `ended by SIGKILL (exit "
                                        "code -9)`).", COLUMN, TAG)
    stop_rule: str | None = stored("The rule that stopped it early (search_spaces/stopping.py: measured_enough, "
                                   "cannot_win, will_not_fit; its reason in `reason`); None when it ran every step.",
                                   COLUMN, TAG)
    command: list[Any] | None = stored("The trainer's argv (MLflow command.json).")
    retry_of: int | None = stored("On a trial queued by --resume: the trial it runs again.")
    retry_reason: str | None = stored("On a trial queued by --resume: why it runs again.")
    measured_result: dict[str, Any] | None = stored("A result an earlier driver measured but could not store "
                                                    "(the spool): recorded on resume, not run again.")
    confirms: int | None = stored("On a confirmation: the proxy trial it measures at full size.")

    def __post_init__(self) -> None:
        if self.fidelity is None and isinstance(self.extra.get("fidelity"), str):  # a result that says it
            object.__setattr__(self, "fidelity", self.extra["fidelity"])  # (trial.json, an older spool line)

    # ---- reading ----------------------------------------------------------------------------------
    @classmethod
    def of(cls, trial: Any, **context: Any) -> Self:
        """The record of an Optuna trial (frozen, or live: a live trial has no state, values or constraints);
        `context`: the fields a subclass adds (winner.TrialView's memory limit)."""
        if isinstance(trial, optuna.trial.FrozenTrial):
            state = trial.state.name.lower()
            return cls(number=trial.number, state=state, params=dict(trial.params),
                       values=tuple(trial.values or ()),
                       constraints=tuple(float(c) for c in trial.constraints.values()),
                       **_told(state, cls._read(trial.user_attrs)), **context)
        return cls(number=trial.number, state="running", params=dict(trial.params), **cls._read(trial.user_attrs),
                   **context)

    @classmethod
    def from_attrs(cls, number: int, attrs: dict[str, Any], **optuna_fields: Any) -> Self:
        """A record from stored user attrs (a spooled record, MLflow's trial.json)."""
        return cls(number=number, **optuna_fields, **cls._read(attrs if isinstance(attrs, dict) else {}))

    def with_attrs(self, **values: Any) -> Self:
        """This record with more stored attributes (as `write` would store them)."""
        return dataclasses.replace(self, **self._read({**self.stored_attrs(), **self.attrs(**values)}))

    # ---- questions ----------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Told a verdict: measured (complete), failed (fail, with the status it failed with) or rejected (pruned).
        A failed trial without a status is a discarded repeat, one whose status is interrupted runs again."""
        if self.state == "fail":
            return self.status not in (None, "interrupted")
        return self.state in ("complete", "pruned")

    @property
    def within_constraints(self) -> bool:
        """The sweep's verdict: fits the memory and measured ok (all constraints <= 0)."""
        return all(c <= 0 for c in self.constraints)

    @property
    def fits_ok(self) -> bool:
        """Measured ok and fits: a candidate for the best."""
        return self.status == "ok" and self.within_constraints

    @property
    def objective(self) -> float | None:
        return self.values[0] if self.values else None

    @property
    def runs_at(self) -> str:
        """The fidelity it ran (or runs) at: full unless recorded otherwise."""
        return self.fidelity or "full"

    @property
    def fidelity_label(self) -> str:
        """full, or proxy with the GPUs its proxy ran on."""
        return f"proxy ({self.proxy_world} GPUs)" if self.proxy else self.runs_at

    @property
    def run_key(self) -> tuple[str | None, str]:
        """(layout key, fidelity): a layout runs once at each fidelity."""
        return self.layout_key, self.runs_at

    @property
    def tokens_per_sec_per_gpu(self) -> float | None:
        """Measured (or composed, or the what-if backend's) tokens/s/GPU: the objective."""
        return self.measured("tokens_per_sec_per_gpu")

    @property
    def peak_memory_gib(self) -> float | None:
        """Measured peak memory (GiB, max over ranks)."""
        return self.measured("peak_memory_gib")

    def measured(self, name: str) -> float | None:
        """A metric's measured value (a finite number or None)."""
        metric = BY_METRIC[name]
        if self.result is None:
            return None
        return finite(self.extra.get(name) if EXTRA in metric.feeds else getattr(self.result, name))

    def predicted(self, name: str) -> float | None:
        """A metric's predicted value (the cost model's estimate), or None."""
        return finite(self.prediction.get(name))

    def history(self, metric: Metric) -> list[float]:
        points = getattr(self.result, metric.history, None) if self.result and metric.history else None
        return [float(v) for v in points or [] if finite(v) is not None]

    @property
    def extra(self) -> dict[str, Any]:
        return self.result.extra if self.result is not None and isinstance(self.result.extra, dict) else {}

    @property
    def source(self) -> str | None:
        """Where the numbers come from: costmodel (analytic), replay, or None (a run)."""
        return self.extra.get("source")

    @property
    def estimated(self) -> bool:
        """The numbers are the cost model's, not a measurement."""
        return self.backend == "analytic" or self.source == "costmodel"

    @property
    def proxy(self) -> bool:
        """Measured on a proxy and composed to full size."""
        return self.fidelity == "proxy"

    @property
    def proxy_world(self) -> int | None:
        """The GPUs a proxy trial ran on."""
        return self.trial_size.get("world")

    @property
    def gpu_seconds(self) -> tuple[float | None, float | None]:
        """(GPU-seconds the trial used, what it would have used at full size)."""
        return self.measured("gpu_seconds"), self.measured("full_size_gpu_seconds")

    @property
    def model_overrides(self) -> dict[str, Any]:
        overrides = self.extra.get("model_overrides")
        return overrides if isinstance(overrides, dict) else {}

    @property
    def predicted_fits(self) -> bool | None:
        """The cost model's verdict on memory, None when it gave none."""
        fits = self.prediction.get("fits")
        return fits if isinstance(fits, bool) else None

    def predicted_breakdown(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(memory components in GiB, time components in s) of the cost model's estimate."""
        breakdown = self.prediction.get("breakdown")
        breakdown = breakdown if isinstance(breakdown, dict) else {}
        memory, time = breakdown.get("memory_gib"), breakdown.get("time_s")
        return memory if isinstance(memory, dict) else {}, time if isinstance(time, dict) else {}

    def measured_memory(self) -> dict[str, Any]:
        """The measured memory components in GiB (TrialResult.memory_gib)."""
        return self.result.memory_gib if self.result is not None and isinstance(self.result.memory_gib, dict) else {}

    @property
    def composed(self) -> dict[str, Any]:
        """A proxy trial's composition: the full-scale figures, measured and modelled parts side by side."""
        composed = self.extra.get("composed")
        return composed if isinstance(composed, dict) else {}

    @property
    def proxy_plan(self) -> dict[str, Any]:
        """The proxy a proxy trial ran (ProxyPlan.to_dict()), {} for a full-size trial."""
        plan = self.extra.get("proxy")
        return plan if isinstance(plan, dict) else {}

    @property
    def proxy_measured(self) -> dict[str, Any]:
        """What the proxy itself measured (before composition)."""
        measured = self.extra.get("proxy_measured")
        return measured if isinstance(measured, dict) else {}

    @property
    def launch_wall_s(self) -> float:
        """Seconds the backend spent launching the trainer (bench/sweep_overhead.py)."""
        return finite(self.extra.get("launch_wall_s")) or 0.0

    def proxy_params(self) -> dict[str, str]:
        """MLflow params of what a proxy trial ran: its world, layers and each changed field ({} at full size)."""
        plan = self.proxy_plan
        if not plan:
            return {}
        out = {"world": str(plan.get("world")), "num_layers": str(plan.get("num_layers"))}
        for change in plan.get("changes") or []:
            if isinstance(change, dict) and change.get("field") not in out:
                out[str(change.get("field"))] = str(change.get("proxy"))
        return out

    # ---- what it feeds ----------------------------------------------------------------------------
    def mlflow_metrics(self) -> list[tuple[str, float, int]]:
        """(key, value, step) of every MLflow metric this trial has: each Metric measured (its history when it
        has one), predicted_<name>, composed_<name>, proxy_measured_<name>, and the loss curve."""
        out: list[tuple[str, float, int]] = []
        for m in METRICS:
            points = self.history(m)
            out += [(m.name, v, i) for i, v in enumerate(points)]
            value = self.measured(m.name)
            if not points and value is not None:
                out.append((m.name, value, 0))
            predicted = self.predicted(m.name) if PREDICTED in m.feeds else None
            if predicted is not None:
                out.append((m.predicted_name, predicted, 0))
            composed = finite(self.composed.get(m.name)) if COMPOSED in m.feeds else None
            if composed is not None:
                out.append((f"composed_{m.name}", composed, 0))
        # step k of `loss` is the trainer's step k, warm-up included (extra.loss_includes_warmup)
        out += [("loss", float(v), i) for i, v in enumerate(self.result.loss if self.result else [])
                if finite(v) is not None]
        out += [(f"proxy_measured_{k}", x, 0) for k, v in self.proxy_measured.items() if (x := finite(v)) is not None]
        return out

    def mlflow_tags(self) -> dict[str, str]:
        """The child run's tags: the stored fields that feed TAG and have a value (cut to what MLflow keeps)."""
        values = ((name, getattr(self, name)) for name in self.feeding(TAG))
        return {name: str(value)[:MAX_TAG_CHARS] for name, value in values if value not in (None, "")}

    def evidence(self) -> dict[str, Any]:
        """MLflow's trial.json: what it measured, what was predicted, the layout (stored form)."""
        return self.attrs(result=self.result, prediction=self.prediction, layout=self.layout)


def _told(state: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """A trial's stored fields as they count: the tell commits a result, so a trial that failed after storing an ok
    result (the sweep stopped between the two) was interrupted. A failed status is the trial's verdict: failed trials
    are told FAIL (orchestrator/records/lifecycle.py)."""
    if state == "fail" and attrs.get("status") == "ok":  # a measurement is told complete: this one was cut off
        return {**attrs, "status": "interrupted", "reason": attrs.get("reason") or INTERRUPTED_BEFORE_TELL}
    return attrs


def trials(study: Any) -> list[TrialRecord]:
    """Every trial of the study as a record, in trial order."""
    return [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]


def enqueue(study: Any, params: dict[str, Any], skip_if_exists: bool = False, **values: Any) -> None:
    """Queue a trial of `params` (Optuna's warm start) with stored attributes (TrialRecord's fields)."""
    study.enqueue_trial(params, user_attrs=TrialRecord.attrs(**values), skip_if_exists=skip_if_exists)
