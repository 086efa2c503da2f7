"""bench/kernel_tables.py: one row per kernel-table entry with the term's figure beside the published one, and a
summary per table, GPU, precision and split whose counts add up to the entries."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from search_spaces.catalog.kernels import kernel_tables

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("kernel_tables_bench", ROOT / "bench" / "kernel_tables.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_the_json_has_a_row_per_entry_and_a_summary_that_adds_up(capsys):
    assert bench.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == len(kernel_tables())
    assert sum(s["entries"] for s in out["summary"]) == len(kernel_tables())
    for row in out["rows"]:
        assert row["model_figure"] > 0 and row["kernel_figure"] > 0 and row["source"]
        assert abs(row["ratio"] - row["model_figure"] / row["kernel_figure"]) < 0.01 * row["ratio"] + 1e-3


def test_the_text_ends_with_the_summary(capsys):
    assert bench.main(["--summary"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("term") and "(model / kernel)" in lines[0]
    assert any(line.startswith("gemm") and "grouped" in line for line in lines)
