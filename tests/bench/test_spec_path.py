"""Issue 54's measure of the house, held: following one analytic sweep from its spec to its results crosses from one
room of orchestrator/ to another at most 44 times (half of the 89 before the rooms; bench/spec_path.py,
docs/architecture.md). A change that adds a hand-off across rooms must take one away, or say here why not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("spec_path_bench", ROOT / "bench" / "spec_path.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)

MOST_ACROSS_ROOMS = 44


@pytest.mark.slow  # one traced sweep, ~10 s
def test_one_sweep_crosses_rooms_at_most_half_as_often_as_before_the_rooms():
    edges = bench.trace_sweep(5)
    across = sorted(f"{a}.{f} -> {c}.{g}" for a, f, c, g in edges if bench.room(a) != bench.room(c))
    assert across, "the tracer saw no hand-off at all: it no longer traces the sweep"
    assert len(across) <= MOST_ACROSS_ROOMS, "\n".join(across)
