"""The trial tables: the replay table (`status --csv` writes it, backend replay reads it) and the leaderboard;
every column derives from the records' declarations (the study's context, the layout's dimensions, the trial's
stored fields, METRICS)."""

from __future__ import annotations

from typing import Any

from search_spaces.layouts.layout import BY_NAME, PARALLEL_SIZES, SEARCH_DIMENSIONS

from orchestrator.records.metrics import metrics
from orchestrator.records.stored import COLUMN, COMPARE, OBJECTIVE, TABLE, VIEW
from orchestrator.records.study import StudyRecord
from orchestrator.records.trial import TrialRecord
from orchestrator.spec.economics import to_train

CONTEXT_COLUMNS: tuple[str, ...] = StudyRecord.feeding(TABLE)
LAYOUT_COLUMNS: tuple[str, ...] = tuple(name for name in BY_NAME if name in SEARCH_DIMENSIONS or name == "gbs")
NUMBER_COLUMNS: tuple[str, ...] = tuple(m.name for m in metrics(TABLE))
TABLE_COLUMNS: list[str] = [*CONTEXT_COLUMNS, *LAYOUT_COLUMNS, *TrialRecord.feeding(TABLE), *NUMBER_COLUMNS]
# a column an older table lacks reads as empty (a layout column: the dimension's default); these it must have
REQUIRED_COLUMNS: list[str] = [*CONTEXT_COLUMNS, *PARALLEL_SIZES, "mbs", "gbs", *TrialRecord.feeding(TABLE),
                               *(m.name for m in metrics(OBJECTIVE))]
# days and dollars to train the spec's cost.train_tokens at the trial's throughput (orchestrator.spec.economics)
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
    cells["status"] = record.status or record.state  # not judged yet: Optuna's state (running, fail)
    cells.update({k: record.measured(k) for k in NUMBER_COLUMNS})
    cells.update({m.predicted_name: record.predicted(m.name) for m in metrics(COMPARE)})
    cells.update({k: getattr(record, k) for k in TrialRecord.feeding(COLUMN)})
    cells.update({m.name: record.measured(m.name) for m in metrics(COLUMN)})
    found = to_train(record.measured("tokens_per_sec_per_gpu"), int(study.num_gpus or 0), study.cost)
    cells.update((found.metrics() if found else {}).items())
    return {c: cells.get(c) for c in LEADERBOARD_COLUMNS}
