"""The terminal view of a running sweep: a rich progress bar and a live top-10 leaderboard."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from orchestrator.records.lifecycle import FAILED, REJECTED, Tally


class SweepProgress:
    def __init__(self, title: str, total: int, console: Console | None = None, enabled: bool = True):
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.rows: list[dict[str, Any]] = []
        # elapsed, then the ETA rich estimates from the trials done so far
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[note]}"), TimeElapsedColumn(), TextColumn("eta"),
                            TimeRemainingColumn(), console=self.console)
        self.task = self.bar.add_task(title, total=total, note="")
        # Live only redraws on a terminal; elsewhere (a pipe, a log file, CI) it writes its last frame without
        # a final newline, so the next line printed ran into the bottom border. There: print the view once.
        self.live = Live(self._view(), console=self.console, refresh_per_second=4,
                         transient=False) if enabled and self.console.is_terminal else None

    def __enter__(self) -> "SweepProgress":
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.update(self._view())
            self.live.stop()  # on a terminal rich ends the view with a newline
        elif self.enabled:
            self.console.print(self._view())

    def advance(self, row: dict[str, Any] | None, running: int, completed: int, tally: Tally | None = None) -> None:
        """A proposal settled (`row`: a trial that ran; None: one that did not), `tally` the study's trials by
        lifecycle state, counted as every other view counts them (orchestrator/records/lifecycle.py)."""
        if row is not None:
            self.rows.append(row)
        best = max((r["tokens"] for r in self.rows if r["status"] == "ok" and r["tokens"]), default=None)
        best_text = f" · best {best:,.1f} tok/s/GPU" if best is not None else ""
        states = (f" · {tally.counts[FAILED]} failed · {tally.counts[REJECTED]} rejected" if tally is not None else "")
        self.bar.update(self.task, completed=completed, note=f"running {running}{states}{best_text}")
        if self.live:
            self.live.update(self._view())

    def _view(self) -> Group:
        return Group(self.bar, self._table())

    def _table(self, top: int = 10) -> Table:
        table = Table(title="leaderboard (measured)", expand=False)
        for col in ("#", "layout", "fidelity", "status", "tok/s/GPU", "pred tok/s", "peak GiB"):
            table.add_column(col, justify="right" if col not in ("layout", "fidelity", "status") else "left")
        ranked = sorted(self.rows, key=lambda r: (r["status"] != "ok", -(r["tokens"] or 0)))
        for r in ranked[:top]:
            table.add_row(str(r["trial"]), r["layout"], r.get("fidelity", "full"), r["status"], _fmt(r["tokens"]),
                          _fmt(r["predicted"]), _fmt(r["memory"]))
        return table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if isinstance(value, float) else str(value)
