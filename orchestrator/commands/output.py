"""The terminal the commands print to: rich's Console, wide enough for a layout key when not a terminal."""

from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 200  # a pipe or a log file has no width: rich would wrap tables at 80 columns


def console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=PIPE_WIDTH)
