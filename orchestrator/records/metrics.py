"""The figures of a trial, each declared once (`METRICS`): MLflow metrics, predicted beside measured, replay-table
and leaderboard columns, the sweep summary's best figures and what `check` compares derive from them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from search_spaces.result import TrialResult

from orchestrator.records.stored import COLUMN, COMPARE, COMPOSED, EXTRA, HEADLINE, OBJECTIVE, PREDICTED, TABLE, VIEW


@dataclass(frozen=True)
class Metric:
    """One figure of a trial: a TrialResult field (or, with EXTRA, an entry the sweep adds to its `extra`).

    Declared once, it is the MLflow metric of its name; with PREDICTED the cost model's `predicted_<name>`
    (an Estimate field of the same name) beside it; TABLE makes it a replay-table column, COMPARE puts the
    prediction beside it on the leaderboard and in the runs view, HEADLINE makes it a figure of the sweep
    summary's best trial that `check` compares with MLflow, COMPOSED logs a proxy trial's composed figure,
    VIEW shows it in the MLflow runs view, COLUMN (with EXTRA) puts it on the leaderboard, OBJECTIVE marks the
    study's objectives (a replay table must have their columns; any other reads as empty when missing)."""
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
            PREDICTED, TABLE, OBJECTIVE, COMPARE, HEADLINE, COMPOSED, VIEW),
    _metric("tflops_per_gpu", "Model TF/s per GPU.", PREDICTED, TABLE, HEADLINE),
    _metric("peak_memory_gib", "Peak GPU memory, max over ranks (GiB): the second objective.",
            PREDICTED, TABLE, OBJECTIVE, COMPARE, HEADLINE, COMPOSED, VIEW),
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
