"""The sweep: a session (stores, study, lease, MLflow), the loop (propose -> screen -> dispatch -> record), what it
tells the study and MLflow of each trial, and how it stops (interrupts) and shows itself (progress). What it proposes
is orchestrator/search/'s; where trials run, orchestrator/dispatch/'s.

The names below are imported on first use (as search_spaces' name table): a command that needs one part (the
lease, for `status`) does not load the loop and, through it, MLflow.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_NAMES = {"Sweep": "loop", "SweepOutcome": "loop", "run_sweep": "loop"}

__all__ = ["Sweep", "SweepOutcome", "run_sweep"]


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'orchestrator.sweep' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"orchestrator.sweep.{_NAMES[name]}"), name)
    globals()[name] = value  # once looked up, an ordinary module attribute
    return value
