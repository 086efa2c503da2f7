"""What `estimate --explain` shows: each term of the predicted step against the kernel tables
(search_spaces/cost/explain.py), as a table or as the `explain` list of `estimate --json`."""

from __future__ import annotations

from typing import Any

EXPLAIN_HELP = ("per term of the step time, the kernel-table entry nearest to the layout's shape (GPU, precision, "
                "shape), its published figure beside the rate the term implies, and whether the shape is inside the "
                "measured range or extrapolated (--json: the `explain` list)")


def explain_rows(est, spec, gpu_spec, num_gpus: int, seq_len: int, layout, cal, hist) -> list[Any]:
    """The explanation of a legal estimate's step time (none for an illegal layout: it has no step time)."""
    from search_spaces.cost.explain import explain_step

    if not est.legal or est.time is None:
        return []
    return explain_step(spec, gpu_spec, num_gpus, seq_len, layout, est.time, cal, hist)


def _shape(shape: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:,.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in shape.items()
                     if v is not None)


def _table_cell(row) -> str:
    e = row.entry
    if e is None:
        return "-"
    ratio = f"; model there {row.model_at_entry:,.0f} ({row.model_at_entry / e.value:.2f}x)" \
        if row.model_at_entry else ""
    return (f"{e.gpu} {e.precision} {e.kernel}: {e.value:,.0f} {e.unit} ({e.share_of_ceiling():.0%} of its ceiling) "
            f"at {_shape(e.shape)}{ratio}; {e.source.cite()}")


def print_explain(rows: list[Any]) -> None:
    from rich.table import Table

    from orchestrator.userio import console

    title = "why: each term of the step against the kernel tables (predicted vs published)"
    table = Table(title=title, min_width=len(title) + 4)  # the title on one line (as estimate.py's _table)
    for col in ("term", "s/step", "the layout's shape", "the term implies", "nearest kernel-table entry", "range"):
        table.add_column(col, overflow="fold")
    for row in rows:
        implied = "-" if row.implied is None else f"{row.implied:,.0f} {row.unit} ({row.implied_share:.0%})"
        verdict = f"{row.range}: {row.why}" if row.why else row.range
        term = row.component if row.part == "whole" else f"{row.component} ({row.part})"
        table.add_row(term, f"{row.seconds:.4f}", _shape(row.shape) or "-", implied, _table_cell(row), verdict)
    console().print(table)
