"""The trial record and the study record: what a sweep stores of each trial and of the study in the Optuna
storage, and what status, the leaderboard, `status --csv`, the replay table, MLflow, report, promote,
calibrate and check read back. Nothing outside this module looks a user attribute up by its name.

Each stored attribute is one field of `TrialRecord` or `StudyRecord`, declared with `stored(doc, *feeds)`:
its type, its docstring and the outputs it feeds (`COLUMN`, `TABLE`, `TAG`). Each figure of a trial is one
`Metric` of `METRICS`. The replay-table and leaderboard columns, the MLflow metrics, tags and runs view, the
sweep summary's best figures and what `check` compares all derive from these declarations.

Storage contract:
  study.user_attrs  StudyRecord's stored fields
  trial.params      the layout's encoded values, one per searchable dimension (Layout.params)
  trial.user_attrs  TrialRecord's stored fields
  objectives        [tokens/s/GPU (maximize), peak memory GiB (minimize)]
  constraints       memory_over_limit_gib, not_measured_ok (feasible when both are <= 0)
Older studies stay readable: a key an earlier version did not write reads as its default, a value of the
wrong type reads as absent, the study's context falls back to its spec, and the backend `local` reads as `ray`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
from pydantic import ValidationError

from search_spaces.errors import SpecError
from search_spaces.layout import BY_NAME, PARALLEL_SIZES, SEARCH_DIMENSIONS, Layout
from search_spaces.result import TrialResult

from orchestrator.economics import Cost, to_train

# what a declaration feeds
COLUMN = "leaderboard column"  # a column of the leaderboard (`status --csv`), after the replay-table columns
TABLE = "replay-table column"  # a column of the replay table (and so of the leaderboard too)
TAG = "MLflow tag"  # a tag of the trial's child run
PREDICTED = "predicted"  # the cost model predicts it too: `predicted_<name>` beside the measurement in MLflow
COMPARE = "predicted beside measured"  # the leaderboard and the MLflow runs view show predicted_<name> beside it
HEADLINE = "headline"  # the sweep summary's best_<name>; `check` compares the study's with MLflow's
VIEW = "MLflow runs view"  # a column of the MLflow runs view (the trials by tokens/s/GPU)
COMPOSED = "composed"  # a proxy trial's composed full-size figure, logged as composed_<name>
EXTRA = "sweep's own"  # written by the sweep into result.extra (bookkeeping), not measured by the trainer
TRIAL_TAG = "optuna_trial_number"  # the MLflow tag that names a child run's trial


def stored(doc: str, *feeds: str, default: Any = None, factory: Callable[[], Any] | None = None,
           load: Callable[[Any], Any] | None = None, dump: Callable[[Any], Any] | None = None) -> Any:
    """A stored attribute: its docstring, what it feeds, and (for a typed value kept as JSON) how it is read
    from its stored form (`load`, None when it cannot be) and written (`dump`)."""
    meta = {"doc": doc, "feeds": frozenset(feeds), "load": load, "dump": dump}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# ---- typed values kept as JSON ------------------------------------------------------------------

def _load_layout(data: Any) -> Layout | None:
    try:
        return Layout.from_dict(data) if isinstance(data, dict) and data else None
    except (SpecError, TypeError, ValueError):  # a proposal that was not even a Layout: its params are kept
        return None


def _dump_layout(layout: Any) -> Any:
    return layout.to_dict() if isinstance(layout, Layout) else layout


def load_result(data: Any) -> TrialResult | None:
    """A stored TrialResult (its to_dict()), or None when it is not one."""
    if isinstance(data, TrialResult):
        return data
    try:
        return TrialResult.from_dict(data) if isinstance(data, dict) else None
    except (TypeError, ValueError):
        return None


def jsonable(data: Any) -> Any:
    """`data` as JSON can hold it: non-finite floats become None, anything else unknown its str."""
    if isinstance(data, dict):
        return {str(k): jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [jsonable(v) for v in data]
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if data is None or isinstance(data, (str, int, float, bool)):
        return data
    return str(data)


def _dump_result(result: Any) -> Any:
    return jsonable(result.to_dict()) if isinstance(result, TrialResult) else result


def number(value: Any) -> float | None:
    """A finite number, else None (a stored NaN, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


# ---- reading and writing stored fields -----------------------------------------------------------

def _runtime_types(hint: Any) -> tuple[type, ...]:
    """The classes a value of annotation `hint` may be (float takes an int too)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for part in typing.get_args(hint) for t in _runtime_types(part))
    if hint is type(None):
        return (type(None),)
    if hint is float:
        return (float, int)
    origin = typing.get_origin(hint)
    return (origin,) if isinstance(origin, type) else (hint,) if isinstance(hint, type) else (object,)


class _Stored:
    """Reading and writing the stored fields of a record class (a dataclass declared with `stored`)."""

    @classmethod
    def stored_fields(cls) -> tuple[dataclasses.Field, ...]:
        return tuple(f for f in dataclasses.fields(cls) if "doc" in f.metadata)  # type: ignore[arg-type]

    @classmethod
    def feeding(cls, feed: str) -> tuple[str, ...]:
        """The names of the stored fields that feed `feed` (COLUMN, TABLE, TAG), in declaration order."""
        return tuple(f.name for f in cls.stored_fields() if feed in f.metadata["feeds"])

    @classmethod
    def _read(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        hints = typing.get_type_hints(cls)
        out = {}
        for f in cls.stored_fields():
            raw = attrs.get(f.name)
            load = f.metadata["load"]
            value = load(raw) if load is not None and raw is not None else raw
            if value is not None and isinstance(value, _runtime_types(hints[f.name])) and \
                    not (isinstance(value, bool) and bool not in _runtime_types(hints[f.name])):
                out[f.name] = value
        return out

    @classmethod
    def attrs(cls, **values: Any) -> dict[str, Any]:
        """User attrs as stored: each name must be a stored field; typed values in their stored form."""
        by_name = {f.name: f for f in cls.stored_fields()}
        unknown = [k for k in values if k not in by_name]
        if unknown:
            raise TypeError(f"{cls.__name__} has no stored attribute {unknown[0]!r}")
        return {k: (by_name[k].metadata["dump"] or (lambda v: v))(v) for k, v in values.items()}

    @classmethod
    def write(cls, target: Any, **values: Any) -> None:
        """Store attributes on an Optuna trial or study (each name a stored field of this record)."""
        for key, value in cls.attrs(**values).items():
            target.set_user_attr(key, value)

    def stored_attrs(self) -> dict[str, Any]:
        """This record's stored fields as user attrs (the ones it has)."""
        return self.attrs(**{f.name: getattr(self, f.name) for f in self.stored_fields()
                             if getattr(self, f.name) is not None})


# ---- the figures of a trial -----------------------------------------------------------------------

@dataclass(frozen=True)
class Metric:
    """One figure of a trial: a TrialResult field (or, with EXTRA, an entry the sweep adds to its `extra`).

    Declared once, it is the MLflow metric of its name; with PREDICTED the cost model's `predicted_<name>`
    (an Estimate field of the same name) beside it; TABLE makes it a replay-table column, COMPARE puts the
    prediction beside it on the leaderboard and in the runs view, HEADLINE makes it a figure of the sweep
    summary's best trial that `check` compares with MLflow, COMPOSED logs a proxy trial's composed figure,
    VIEW shows it in the MLflow runs view, COLUMN (with EXTRA) puts it on the leaderboard."""
    name: str
    doc: str
    feeds: frozenset[str] = frozenset()
    history: str | None = None
    """The TrialResult list of its per-step points (logged as a history, the summary figure then omitted)."""

    def __post_init__(self) -> None:
        if EXTRA not in self.feeds and self.name not in {f.name for f in dataclasses.fields(TrialResult)}:
            raise ValueError(f"metric {self.name!r} is not a TrialResult field (declare it EXTRA if the sweep adds it)")

    @property
    def predicted_name(self) -> str:
        return f"predicted_{self.name}"


def _metric(name: str, doc: str, *feeds: str, history: str | None = None) -> Metric:
    return Metric(name, doc, frozenset(feeds), history)


METRICS: tuple[Metric, ...] = (
    _metric("tokens_per_sec_per_gpu", "Training tokens per second per GPU: the objective.",
            PREDICTED, TABLE, COMPARE, HEADLINE, COMPOSED, VIEW),
    _metric("tflops_per_gpu", "Model TF/s per GPU.", PREDICTED, TABLE, HEADLINE),
    _metric("peak_memory_gib", "Peak GPU memory, max over ranks (GiB): the second objective.",
            PREDICTED, TABLE, COMPARE, HEADLINE, COMPOSED, VIEW),
    _metric("mfu", "Model FLOPs utilisation (0..1).", PREDICTED, HEADLINE, VIEW),
    _metric("step_time_s", "Seconds per training step (a history: one point per profiled step).",
            PREDICTED, COMPOSED, history="step_times_s"),
    _metric("wall_time_s", "Seconds the trial's run took, start-up included."),
    _metric("gpu_seconds", "GPU-seconds the trial used (estimated for what-if backends).", EXTRA, COLUMN, VIEW),
    _metric("full_size_gpu_seconds", "GPU-seconds the same trial would have used at full size.", EXTRA),
)
BY_METRIC = {m.name: m for m in METRICS}


def metrics(feed: str) -> tuple[Metric, ...]:
    """The metrics that feed `feed`, in declaration order."""
    return tuple(m for m in METRICS if feed in m.feeds)


# ---- the trial --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrialRecord(_Stored):
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
                                   "Layout stores its params and reads as None.", load=_load_layout, dump=_dump_layout)
    layout_key: str | None = stored("Layout.key(): repeats (and a layout's two fidelities) are found by it.")
    proposed_by: str | None = stored("rule-of-thumb, previous length, resume, confirm, or the search's name.")
    prediction: dict[str, Any] = stored("The cost model's estimate (Estimate.to_dict()), kept beside the "
                                        "measurement.", PREDICTED, factory=dict)
    backend: str | None = stored("The backend that ran it (BACKENDS; `local` before it was `ray`).", TAG)
    fidelity: str = stored("full, or proxy: measured on a proxy and composed to full size.", COLUMN, TAG,
                           default="full")
    trial_size: dict[str, Any] = stored("TrialSize.record(): the fidelity, the GPUs it ran on, the proxy's plan.",
                                        factory=dict)
    mlflow_run_id: str | None = stored("The trial's MLflow child run.", COLUMN)
    status: str | None = stored("ok | oom | error | invalid | timeout | infeasible | interrupted "
                                "(search_spaces.result.STATUSES); None while it runs.", TABLE, TAG)
    result: TrialResult | None = stored("What it measured (TrialResult.to_dict() when stored), judged where it "
                                        "entered.", load=load_result, dump=_dump_result)
    reason: str | None = stored("Why it was rejected or failed (one line or a trainer's error).", COLUMN, TAG)
    command: list[Any] | None = stored("The trainer's argv (MLflow command.json).")
    retry_of: int | None = stored("On a trial queued by --resume: the trial it runs again.")
    retry_reason: str | None = stored("On a trial queued by --resume: why it runs again.")
    measured_result: dict[str, Any] | None = stored("A result an earlier driver measured but could not store "
                                                    "(the spool): recorded on resume, not run again.")
    confirms: int | None = stored("On a confirmation: the proxy trial it measures at full size.")

    # ---- reading ----------------------------------------------------------------------------------
    @classmethod
    def of(cls, trial: Any, **context: Any) -> "TrialRecord":
        """The record of an Optuna trial (frozen, or live: a live trial has no state, values or constraints);
        `context`: the fields a subclass adds (winner.TrialView's memory limit)."""
        if isinstance(trial, optuna.trial.FrozenTrial):
            return cls(number=trial.number, state=trial.state.name.lower(), params=dict(trial.params),
                       values=tuple(trial.values or ()), constraints=tuple(float(c) for c in trial.constraints.values()),
                       **cls._read(trial.user_attrs), **context)
        return cls(number=trial.number, state="running", params=dict(trial.params), **cls._read(trial.user_attrs),
                   **context)

    @classmethod
    def from_attrs(cls, number: int, attrs: dict[str, Any], **optuna_fields: Any) -> "TrialRecord":
        """A record from stored user attrs (a spooled record, MLflow's trial.json)."""
        return cls(number=number, **optuna_fields, **cls._read(attrs if isinstance(attrs, dict) else {}))

    def with_attrs(self, **values: Any) -> "TrialRecord":
        """This record with more stored attributes (as `write` would store them)."""
        return dataclasses.replace(self, **self._read({**self.stored_attrs(), **self.attrs(**values)}))

    # ---- questions ----------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.state == "complete"

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
    def run_key(self) -> tuple[str | None, str]:
        """(layout key, fidelity): a layout runs once at each fidelity."""
        return self.layout_key, self.fidelity

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
        return number(self.extra.get(name) if EXTRA in metric.feeds else getattr(self.result, name))

    def predicted(self, name: str) -> float | None:
        """A metric's predicted value (the cost model's estimate), or None."""
        return number(self.prediction.get(name))

    def history(self, metric: Metric) -> list[float]:
        points = getattr(self.result, metric.history, None) if self.result and metric.history else None
        return [float(v) for v in points or [] if number(v) is not None]

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
        """Measured on a proxy and composed to full size (the result says so too: a record with only a result)."""
        return self.fidelity == "proxy" or self.extra.get("fidelity") == "proxy"

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
        return number(self.extra.get("launch_wall_s")) or 0.0

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
            composed = number(self.composed.get(m.name)) if COMPOSED in m.feeds else None
            if composed is not None:
                out.append((f"composed_{m.name}", composed, 0))
        # step k of `loss` is the trainer's step k, warm-up included (extra.loss_includes_warmup)
        out += [("loss", float(v), i) for i, v in enumerate(self.result.loss if self.result else [])
                if number(v) is not None]
        out += [(f"proxy_measured_{k}", number(v), 0) for k, v in self.proxy_measured.items() if number(v) is not None]
        return out

    def mlflow_tags(self) -> dict[str, str]:
        """The child run's tags: the stored fields that feed TAG (a reason cut to MLflow's tag length)."""
        tags = {name: getattr(self, name) for name in self.feeding(TAG)}
        tags = {k: str(v) for k, v in tags.items() if v is not None and not (k == "fidelity" and self.result is None)}
        if "reason" in tags:
            tags["reason"] = tags["reason"][:4000]
        tags.setdefault("status", "")
        tags.setdefault("backend", "")
        return tags

    def evidence(self) -> dict[str, Any]:
        """MLflow's trial.json: what it measured, what was predicted, the layout (stored form)."""
        return {k: v for k, v in self.attrs(result=self.result, prediction=self.prediction,
                                            layout=self.layout).items()}


# ---- the study --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StudyRecord(_Stored):
    """What the sweep stores of the study (its user attrs); the context falls back to the spec for older studies."""
    name: str = ""
    """The study's name (Optuna's)."""
    model: str | None = stored("The model swept (catalog name or config.json path).", TABLE)
    gpu: str | None = stored("The GPU (hardware catalog name).", TABLE)
    num_gpus: int | None = stored("GPUs of the target cluster (nodes x gpus_per_node).", TABLE)
    seq_len: int | None = stored("Tokens per sequence.", TABLE)
    spec: dict[str, Any] = stored("The sweep spec as run (SweepSpec.dump()).", factory=dict)
    situation: dict[str, Any] | None = stored("The fields that define what the study measures (SITUATION_FIELDS); "
                                              "--resume refuses a spec that changes one.")
    backend: str | None = stored("The backend of the study's trials (BACKENDS; `local` before it was `ray`).")
    memory_limit_gib: float | None = stored("The GPU memory a layout must fit in (GiB).")
    tracking_uri: str | None = stored("The MLflow tracking URI, or none.")
    family: str | None = stored("The MLflow experiment (a length family's name, shared by its lengths).")
    budget: dict[str, Any] = stored("The spec's budget (Budget.model_dump()), as last run.", factory=dict)
    mlflow_experiment_id: str | None = stored("The sweep's MLflow experiment.")
    mlflow_parent_run_id: str | None = stored("The sweep's MLflow parent run.")
    driver_lease: dict[str, Any] | None = stored("The driver holding the study (orchestrator.sweep.lease): token, "
                                                 "epoch, host, pid, heartbeat; None when released.")
    driver_lease_epoch: int | None = stored("The last lease epoch taken (a later driver's is higher).")

    @classmethod
    def of(cls, study: Any) -> "StudyRecord":
        """The record of an Optuna study (or a study summary), the context filled from the spec where an older
        study did not record it."""
        attrs = study.user_attrs
        read = cls._read(attrs)
        spec = read.get("spec") or {}
        fallbacks = {"model": spec.get("model"), "seq_len": spec.get("seq_len"), "gpu": spec.get("gpu"),
                     "backend": spec.get("backend"), "tracking_uri": spec.get("tracking_uri"),
                     "num_gpus": (spec.get("nodes") or 1) * (spec.get("gpus_per_node") or 1) if spec else None}
        for key, value in cls._read(fallbacks).items():
            read.setdefault(key, value)
        return cls(name=study.study_name, **read)

    @property
    def gpus_per_node(self) -> int:
        return int(self.spec.get("gpus_per_node") or min(8, int(self.num_gpus or 1)))

    @property
    def model_overrides(self) -> dict[str, Any]:
        return self.spec.get("model_overrides") or {}

    @property
    def cost(self) -> Cost:
        """The spec's `cost:` (dollars per GPU-hour, tokens to train); empty when it has none (or a bad one)."""
        try:
            return Cost.model_validate(self.spec.get("cost") or {})
        except ValidationError:
            return Cost()

    @property
    def n_trials(self) -> int | None:
        """The budget's trials, as last run."""
        n = self.budget.get("n_trials")
        return n if isinstance(n, int) else None

    @property
    def track_rejected(self) -> bool | None:
        return self.spec.get("track_rejected")

    @property
    def stored_situation(self) -> dict[str, Any]:
        """The situation recorded; a study from before situations were recorded: what its spec said."""
        return self.situation if self.situation is not None else dict(self.spec)


# ---- the tables: replay table, leaderboard -----------------------------------------------------

CONTEXT_COLUMNS: tuple[str, ...] = StudyRecord.feeding(TABLE)
LAYOUT_COLUMNS: tuple[str, ...] = tuple(name for name in BY_NAME if name in SEARCH_DIMENSIONS or name == "gbs")
NUMBER_COLUMNS: tuple[str, ...] = tuple(m.name for m in metrics(TABLE))
TABLE_COLUMNS: list[str] = [*CONTEXT_COLUMNS, *LAYOUT_COLUMNS, *TrialRecord.feeding(TABLE), *NUMBER_COLUMNS]
REQUIRED_COLUMNS: list[str] = [*CONTEXT_COLUMNS, *PARALLEL_SIZES, "mbs", "gbs", *TrialRecord.feeding(TABLE),
                               *NUMBER_COLUMNS]
# days and dollars to train the spec's cost.train_tokens at the trial's throughput (orchestrator.economics)
TRAIN_COLUMNS = ("train_days", "train_usd")
# what the leaderboard (`status --csv`) writes besides the table columns: a replay table read back skips them
LEADERBOARD_EXTRA: tuple[str, ...] = (*(m.predicted_name for m in metrics(COMPARE)), *TrialRecord.feeding(COLUMN),
                                      *(m.name for m in metrics(COLUMN)), *TRAIN_COLUMNS)
LEADERBOARD_COLUMNS: list[str] = ["trial", *TABLE_COLUMNS, *LEADERBOARD_EXTRA]
# runs-view metric columns: each VIEW metric, with its prediction beside it where COMPARE
VIEW_METRICS: tuple[str, ...] = tuple(name for m in metrics(VIEW)
                                      for name in (m.name, *((m.predicted_name,) if COMPARE in m.feeds else ())))


def layout_cells(record: TrialRecord) -> dict[str, Any]:
    """The trial's layout as replay-table cells (encoded values); a proposal that was not even a Layout
    shows its params."""
    if record.layout is not None:
        return record.layout.params(LAYOUT_COLUMNS)
    return {c: record.params.get(c) for c in LAYOUT_COLUMNS}


def row(record: TrialRecord, study: StudyRecord) -> dict[str, Any]:
    """The trial's leaderboard row (LEADERBOARD_COLUMNS), every cell derived from the declarations."""
    cells: dict[str, Any] = {"trial": record.number, **{k: getattr(study, k) for k in CONTEXT_COLUMNS},
                             **layout_cells(record)}
    cells.update({k: getattr(record, k) for k in TrialRecord.feeding(TABLE)})
    cells["status"] = record.status or record.state
    cells.update({k: record.measured(k) for k in NUMBER_COLUMNS})
    cells.update({m.predicted_name: record.predicted(m.name) for m in metrics(COMPARE)})
    cells.update({k: getattr(record, k) for k in TrialRecord.feeding(COLUMN)})
    cells.update({m.name: record.measured(m.name) for m in metrics(COLUMN)})
    found = to_train(record.measured("tokens_per_sec_per_gpu"), int(study.num_gpus or 0), study.cost)
    cells.update((found.metrics() if found else {}).items())
    return {c: cells.get(c) for c in LEADERBOARD_COLUMNS}


def trials(study: Any) -> list[TrialRecord]:
    """Every trial of the study as a record, in trial order."""
    return [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]


def enqueue(study: Any, params: dict[str, Any], skip_if_exists: bool = False, **values: Any) -> None:
    """Queue a trial of `params` (Optuna's warm start) with stored attributes (TrialRecord's fields)."""
    study.enqueue_trial(params, user_attrs=TrialRecord.attrs(**values), skip_if_exists=skip_if_exists)


def describe() -> list[tuple[str, str, str, str]]:
    """(record, attribute, type, what it feeds and its docstring) of every stored attribute: the contract."""
    hints = {cls: typing.get_type_hints(cls) for cls in (StudyRecord, TrialRecord)}
    return [(cls.__name__, f.name, str(hints[cls][f.name]).replace("typing.", ""),
             f.metadata["doc"] + (f" [{', '.join(sorted(f.metadata['feeds']))}]" if f.metadata["feeds"] else ""))
            for cls in (StudyRecord, TrialRecord) for f in cls.stored_fields()]
