"""The trial record and the study record: what a sweep stores of each trial and of the study in the Optuna
storage, and what status, the leaderboard, `status --csv`, the replay table, MLflow, report, promote,
calibrate and check read back. Nothing outside this package looks a user attribute up by its name.

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
wrong type reads as absent, and the study's context falls back to its spec (tests/orchestrator/test_records.py keeps a
study of the layout written before this package).

    stored.py   how a field is declared (`stored`) and read / written as user attrs
    metrics.py  the figures of a trial (METRICS)
    trial.py    TrialRecord      study.py  StudyRecord      tables.py  replay-table and leaderboard columns
"""

from __future__ import annotations

from orchestrator.records.metrics import BY_METRIC, METRICS, Metric, metrics
from orchestrator.records.stored import (
    COLUMN,
    COMPARE,
    COMPOSED,
    EXTRA,
    HEADLINE,
    OBJECTIVE,
    PREDICTED,
    TABLE,
    TAG,
    VIEW,
    Stored,
    finite,
    jsonable,
    load_result,
    stored,
)
from orchestrator.records.study import StudyRecord
from orchestrator.records.tables import (
    CONTEXT_COLUMNS,
    LAYOUT_COLUMNS,
    LEADERBOARD_COLUMNS,
    LEADERBOARD_EXTRA,
    NUMBER_COLUMNS,
    REQUIRED_COLUMNS,
    TABLE_COLUMNS,
    TRAIN_COLUMNS,
    VIEW_METRICS,
    layout_cells,
    row,
)
from orchestrator.records.trial import (
    PREVIOUS_LENGTH,
    PROMOTION_TAG,
    RULE_OF_THUMB,
    SEED_SOURCES,
    TRIAL_TAG,
    TrialRecord,
    enqueue,
    trials,
)

__all__ = ["BY_METRIC", "COLUMN", "COMPARE", "COMPOSED", "CONTEXT_COLUMNS", "EXTRA", "HEADLINE", "LAYOUT_COLUMNS",
           "PROMOTION_TAG",
           "LEADERBOARD_COLUMNS", "LEADERBOARD_EXTRA", "METRICS", "Metric", "NUMBER_COLUMNS", "OBJECTIVE", "PREDICTED",
           "PREVIOUS_LENGTH", "REQUIRED_COLUMNS", "RULE_OF_THUMB", "SEED_SOURCES",
           "Stored", "StudyRecord", "TABLE", "TABLE_COLUMNS", "TAG", "TRAIN_COLUMNS", "TRIAL_TAG",
           "TrialRecord", "VIEW", "VIEW_METRICS", "enqueue", "finite", "jsonable", "layout_cells", "load_result",
           "metrics", "row", "stored", "trials"]
