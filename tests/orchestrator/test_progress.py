"""The live sweep view: after it stops, the next line printed starts on a line of its own."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from orchestrator.sweep.progress import SweepProgress

ROW = {"trial": 0, "layout": "tp1/ep4", "status": "ok", "tokens": 1234.5, "predicted": 1100.0, "memory": 0.87}


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_leaderboard_ends_with_a_newline_after_its_last_border(terminal):
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=100)
    with SweepProgress("sweep quickstart", 2, console=console) as view:
        view.advance(ROW, running=1, completed=1)
        view.advance(None, running=0, completed=2)
    # the sweep command prints its summary with another Console (stdout) onto the same screen or log
    Console(file=out, force_terminal=terminal, width=100).print("sweep quickstart: 1 trials run")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # drop cursor and colour codes
    assert "┘\nsweep quickstart: 1 trials run\n" in text
    assert "tp1/ep4" in text and "1,234.5" in text
    if not terminal:  # nothing redraws in a log: the final view is there once
        assert text.count("leaderboard (measured)") == 1


def test_disabled_view_prints_nothing():
    out = io.StringIO()
    with SweepProgress("sweep quickstart", 1, console=Console(file=out, force_terminal=True),
                       enabled=False) as view:
        view.advance(ROW, running=0, completed=1)
    assert out.getvalue() == ""
