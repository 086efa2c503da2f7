"""Replay: measurements come from a table of recorded trials (issue 8), like tabular HPO benchmarks.

The table is a CSV, one row per layout, columns `TABLE_COLUMNS` (declared by orchestrator/records/tables.py): the
situation, one column per searchable layout dimension and the batch (values as `Layout.params` encodes them; lists may
use `;`), the status and the measurements; `moe-autotune status STUDY --csv` writes it. A layout column an older table
lacks takes the dimension's default (the parallel sizes and the batch are required). The search space of a replay sweep
is exactly the table's layouts (orchestrator.search.prior.ReplayPrior); `ReplayBackend` answers each proposal
from its row at the cost of one trial.

Every row measured ok is judged as it is read (search_spaces.validation): a number that is not a finite number,
tokens/s or TF/s above the GPU's peak, a peak memory above its capacity... make the row invalid, with the
reason, so it is never the best and never feeds a calibration. For tests only, MOE_AUTOTUNE_REPLAY_DELAY_S
makes each answer take that long (a sweep with slow trials, without a trainer).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces.bounded import parse_count, read_csv
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.errors import MoeAutotuneError, SpecError
from search_spaces.inputs import MAX_GPUS, MAX_SEQ_LEN, bounded_message, check_size, excerpt
from search_spaces.layouts.layout import Layout
from search_spaces.result import MEASURED_STATUSES, TrialResult
from search_spaces.validation import problems

from orchestrator.dispatch.base import TrialRequest, completed, stamp
from orchestrator.records import LAYOUT_COLUMNS, LEADERBOARD_EXTRA, NUMBER_COLUMNS, REQUIRED_COLUMNS, TABLE_COLUMNS

# the table's columns are the trial record's (orchestrator/records/tables.py); a leaderboard's extra columns and a
# `note` are allowed and skipped
EXTRA_COLUMNS = ("trial", *LEADERBOARD_EXTRA, "note")
# rows of trials that never ran (a leaderboard export has them): skipped
NOT_RUN = ("infeasible", "fail", "running", "waiting", "pruned")
DELAY_ENV = "MOE_AUTOTUNE_REPLAY_DELAY_S"  # tests only: seconds each answer takes


@dataclass(frozen=True)
class ReplayRow:
    layout: Layout
    status: str
    measured: TrialResult  # the row's number columns (NUMBER_COLUMNS), finite or None
    line: int
    reason: str | None = None  # why a row recorded as ok is invalid (its numbers cannot be true)

    @property
    def tokens_per_sec_per_gpu(self) -> float | None:
        return self.measured.tokens_per_sec_per_gpu

    @property
    def peak_memory_gib(self) -> float | None:
        return self.measured.peak_memory_gib

    def result(self) -> TrialResult:
        error = None if self.status == "ok" else f"recorded as {self.status} (replay row {self.line})"
        if self.reason:
            error = f"replay row {self.line}: {self.reason}"
        return dataclasses.replace(self.measured, status=self.status, error=error, wall_time_s=0.0,
                                   extra={"source": "replay", "replay_line": self.line})


@dataclass
class ReplayTable:
    path: str
    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    rows: dict[str, ReplayRow] = field(default_factory=dict)  # Layout.key() -> row, in file order
    skipped: int = 0

    @property
    def layouts(self) -> list[Layout]:
        return [row.layout for row in self.rows.values()]

    def get(self, layout: Layout) -> ReplayRow | None:
        return self.rows.get(layout.key())

    def best(self) -> ReplayRow | None:
        """The fastest row measured ok."""
        ok = [r for r in self.rows.values() if r.status == "ok" and r.tokens_per_sec_per_gpu is not None]
        return max(ok, key=lambda r: r.tokens_per_sec_per_gpu or 0.0, default=None)  # `or`: never None here

    def check_matches(self, model: str, gpu: str, num_gpus: int, seq_len: int) -> None:
        """The sweep must ask about the situation the table recorded."""
        for name, want, got in (("model", self.model, model), ("gpu", self.gpu, gpu),
                                ("num_gpus", self.num_gpus, num_gpus), ("seq_len", self.seq_len, seq_len)):
            if str(want).lower() != str(got).lower():
                raise SpecError(f"replay table {self.path} records {name} {_plain(want)}, but the sweep has {name} "
                                f"{got}")


def load_table(path: str | Path) -> ReplayTable:
    """Read and validate a replay CSV (search_spaces.bounded.read_csv: at most 64 MiB, every row as many cells as
    the header, cells bounded). Every problem is one SpecError line naming the file (and row); it quotes the file
    only as a short excerpt (a file of secrets named by mistake never reaches the log whole)."""
    path = Path(path)
    csv_table = read_csv(path, "replay table")
    columns = list(csv_table.header)
    if not columns:
        raise SpecError(f"replay table {path} is empty; expected a header with {', '.join(TABLE_COLUMNS)}")
    if not set(columns) & set(REQUIRED_COLUMNS):  # not a header at all (another kind of file): quote none of it
        raise SpecError(f"replay table {path}: line 1 is not a replay-table header (none of its {len(columns)} "
                        f"cells names a column; needed: {', '.join(REQUIRED_COLUMNS)})")
    unknown = [c for c in columns if c not in TABLE_COLUMNS and c not in EXTRA_COLUMNS]
    if unknown:
        raise SpecError(f"replay table {path}: unknown column {excerpt(unknown[0])}; allowed: "
                        f"{', '.join(TABLE_COLUMNS)}")
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise SpecError(f"replay table {path}: missing column {missing[0]!r}; needed: {', '.join(REQUIRED_COLUMNS)}")

    table: ReplayTable | None = None
    skipped = 0
    rows: dict[str, ReplayRow] = {}
    for line, raw in csv_table.rows:
        status = raw["status"].lower()
        if status in NOT_RUN:
            skipped += 1
            continue
        if status not in MEASURED_STATUSES:
            raise SpecError(f"replay table {path} line {line}: status {excerpt(raw['status'])}; "
                            f"allowed: {', '.join(MEASURED_STATUSES)}")
        context = _context(raw, path, line)
        if table is None:
            table = ReplayTable(str(path), *context)
        elif (table.model, table.gpu, table.num_gpus, table.seq_len) != context:
            first = (table.model, table.gpu, table.num_gpus, table.seq_len)
            raise SpecError(f"replay table {path} line {line}: {_situation(context)} differs from the first row's "
                            f"{_situation(first)}; one situation per table")
        row = _judged(table, _layout(raw, path, line), status, raw, line)
        key = row.layout.key()
        # a layout recorded twice (a retried trial): the ok measurement wins, else the first row
        if key not in rows or (rows[key].status != "ok" and status == "ok"):
            rows[key] = row
    if table is None:
        raise SpecError(f"replay table {path} has no measured rows")
    table.rows = rows
    table.skipped = skipped
    return table


def _situation(context: tuple[str, str, int, int]) -> str:
    model, gpu, num_gpus, seq_len = context
    return f"(model {excerpt(model)}, gpu {excerpt(gpu)}, num_gpus {num_gpus}, seq_len {seq_len})"


def _context(raw: dict[str, str], path: Path, line: int) -> tuple[str, str, int, int]:
    ints = []
    for col, limit in (("num_gpus", MAX_GPUS), ("seq_len", MAX_SEQ_LEN)):
        value = parse_count(raw[col])
        if value is None:
            raise SpecError(f"replay table {path} line {line}: {col} must be an integer, got {excerpt(raw[col])}")
        try:
            ints.append(check_size(value, col, limit))  # the ranges every entry point holds sizes to
        except SpecError as exc:
            raise SpecError(f"replay table {path} line {line}: {exc}") from None
    if not raw["model"] or not raw["gpu"]:
        raise SpecError(f"replay table {path} line {line}: model and gpu must not be empty")
    return raw["model"], raw["gpu"], ints[0], ints[1]


def _layout(raw: dict[str, str], path: Path, line: int) -> Layout:
    cells = {col: raw[col] for col in LAYOUT_COLUMNS if raw.get(col, "") != ""}
    try:
        return Layout.from_params(cells)
    except SpecError as exc:  # its message quotes the cell: as an excerpt
        raise SpecError(f"replay table {path} line {line}: {bounded_message(str(exc), cells.values())}") from None


def _judged(table: ReplayTable, layout: Layout, status: str, raw: dict[str, str], line: int) -> ReplayRow:
    """The row as recorded, or (status ok) as invalid with the reason when its numbers cannot be true. The numbers
    of a row not measured ok are kept only when they are finite (a failed run's figures are never a candidate)."""
    cells = {col: _cell(raw.get(col, "")) for col in NUMBER_COLUMNS}
    # TrialResult's keyword arguments by column name (Any: the columns are its float fields, named at run time)
    finite: dict[str, Any] = {col: v if isinstance(v, float) and math.isfinite(v) else None
                              for col, v in cells.items()}
    numbers = TrialResult(status=status, **finite)
    if status != "ok":
        return ReplayRow(layout, status, numbers, line)
    # as recorded: a cell that is not a number stays its text, for problems() to name
    recorded: dict[str, Any] = {col: v for col, v in cells.items() if v is not None}
    claimed = TrialResult(status="ok", **recorded)
    reasons = [] if claimed.tokens_per_sec_per_gpu is not None else ["status ok but no tokens_per_sec_per_gpu"]
    reasons += problems(claimed, layout, _gpu(table.gpu), model=_model(table.model), seq_len=table.seq_len,
                        num_gpus=table.num_gpus)
    if reasons:
        return ReplayRow(layout, "invalid", numbers, line, reason="; ".join(reasons))
    return ReplayRow(layout, status, numbers, line)


def _plain(value: object) -> str:
    """A value of the table in a sentence: a number as it is, text from the file as an excerpt."""
    return str(value) if isinstance(value, int) else excerpt(value)


def _cell(text: str) -> float | str | None:
    """A number cell: None when empty, the float it spells (nan and inf included), else the text itself
    (a measurement that is not a number: the row is judged invalid)."""
    if text.lower() in ("", "none", "-"):
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _gpu(name: str):
    try:
        return load_gpu(name)
    except SpecError:  # the sweep refuses an unknown GPU itself; no bound to check here
        return None


def _model(name: str):
    try:
        return load_model(name)
    except (MoeAutotuneError, OSError, ValueError):  # an unknown model: no FLOPs, no tokens/s bound
        return None


_TABLES: dict[str, ReplayTable] = {}  # prior and backend of one sweep share one parse


def table_for(spec) -> ReplayTable:
    """The spec's replay table, loaded once per process and checked against the spec's situation."""
    if not spec.replay_table:
        raise SpecError("backend replay needs replay_table (--replay-table PATH)")
    path = Path(spec.replay_table)
    key = f"{path.resolve()}@{path.stat().st_mtime_ns if path.is_file() else 0}"  # reread an edited file
    if key not in _TABLES:
        _TABLES[key] = load_table(spec.replay_table)
    table = _TABLES[key]
    table.check_matches(spec.model, spec.gpu, spec.num_gpus, spec.seq_len)
    return table


class ReplayBackend:
    name = "replay"

    def __init__(self, table: ReplayTable):
        self.table = table
        self.delay_s = _delay()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8) if self.delay_s else None

    @classmethod
    def from_spec(cls, spec) -> "ReplayBackend":
        return cls(table_for(spec))

    def submit(self, request: TrialRequest) -> "concurrent.futures.Future[TrialResult]":
        row = self.table.get(request.layout)
        if row is None:  # the replay prior screens these out; a direct caller may not
            result = TrialResult(status="invalid", error=f"layout {request.layout.key()} is not in the replay "
                                                         f"table {self.table.path}")
        else:
            result = row.result()
        if self._pool is not None:
            return self._pool.submit(_after, self.delay_s, stamp(result, request))
        return completed(stamp(result, request))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _delay() -> float:
    try:
        value = float(os.environ.get(DELAY_ENV, "0") or 0)
    except ValueError:
        return 0.0
    return value if 0 < value < 3600 else 0.0


def _after(seconds: float, result: TrialResult) -> TrialResult:
    time.sleep(seconds)
    return result
