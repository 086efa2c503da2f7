"""Issue 54's measure of the house, held: following one analytic sweep from its spec to its results crosses from one
room of orchestrator/ to another at most 45 times (half of the 89 before the rooms, 44, plus one: bench/spec_path.py,
docs/architecture.md). A change that adds a hand-off across rooms must take one away, or say here why not.

Why 45: since issue 59 convergence is on by default, so every sweep asks its search, after each trial, how likely a
better layout is (orchestrator.sweep.convergence -> orchestrator.search.proposer.chance_of_better). The hand-off
existed before and was traced only when a spec asked for convergence."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("spec_path_bench", ROOT / "bench" / "spec_path.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)

MOST_ACROSS_ROOMS = 45


@pytest.mark.slow  # one traced sweep, ~10 s
def test_one_sweep_crosses_rooms_at_most_half_as_often_as_before_the_rooms():
    edges = bench.trace_sweep(5)
    across = sorted(f"{a}.{f} -> {c}.{g}" for a, f, c, g in edges if bench.room(a) != bench.room(c))
    assert across, "the tracer saw no hand-off at all: it no longer traces the sweep"
    assert len(across) <= MOST_ACROSS_ROOMS, "\n".join(across)
