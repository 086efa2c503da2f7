"""`moe-autotune calibrate`: fit the cost model's per-GPU-family constants to measured trials; write a file
that `estimate`, `space` and `sweep` (`--calibration FILE`, spec field `calibration:`) use."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from orchestrator.commands import store_options
from orchestrator.spec.schema import DEFAULT_STORAGE


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)


def calibrate(
    out: Path = typer.Option(..., "--out", help="the calibration file to write (JSON)"),
    study: list[str] = typer.Option([], "--study", help="an Optuna study whose measured trials are data (repeatable)"),
    storage: str = typer.Option(DEFAULT_STORAGE, help="Optuna storage URL of the studies"),
    experiment: list[str] = typer.Option([], "--experiment",
                                         help="an MLflow experiment whose measured runs are data (repeatable)"),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", "--tracking-uri", help="MLflow tracking URI",
                                     callback=store_options.tracking_uri),
    table: list[Path] = typer.Option([], "--table", help="a replay-table CSV of measurements (repeatable)"),
    start: Optional[Path] = typer.Option(None, "--calibration",
                                         help="start from this calibration file (default: the packaged one)"),
    holdout: float = typer.Option(0.5, "--holdout", min=0.0, max=0.5,
                                  help="share of the measurements held out to report the error on (0: none)"),
    published: bool = typer.Option(True, "--published/--no-published",
                                   help="fit the published rows of the same GPU families too"),
) -> int:
    """Fit the constants of the GPU families the measurements cover (GEMM, grouped-GEMM and attention efficiency;
    on cpu the eager and gloo costs and the resident baseline) to the measurements plus the published rows, print
    the error on the held-out measurements before and after, and write the calibration file."""
    from search_spaces.errors import SpecError
    from search_spaces.inputs import check_name, check_output_file

    from orchestrator.storage import require_mlflow_store
    from orchestrator.userio import console, write_text

    check_output_file(out, "--out")
    if not (study or experiment or table):
        raise SpecError("give at least one --study, --experiment or --table to calibrate on")
    for name in study:
        check_name(name, "--study")
    for name in experiment:
        check_name(name, "--experiment")
    if experiment:  # reading a store that is not there would create it
        require_mlflow_store(tracking_uri)
    for path in table:
        if not path.is_file():
            raise SpecError(f"--table {str(path)!r} does not exist")
    from search_spaces.calibration.fit import calibration_text, load_calibration

    from orchestrator.outputs.calibrate import calibrate as run_calibrate  # the fit's libraries: for input that passed
    from orchestrator.outputs.calibrate import gather
    base = load_calibration(start)
    measurements = gather(study, storage, experiment, tracking_uri, [str(p) for p in table])
    run = run_calibrate(measurements, base, holdout=holdout, with_published=published)
    write_text(out, "--out", calibration_text(run.document))  # whole or not at all (exit 6 when it cannot be)
    from rich.table import Table  # the result's table: only this command's output pays for it

    out_console = console()
    out_console.print(f"{len(measurements)} measurements ({', '.join(run.families)}): fitted on {run.fitted_on}"
                  f" + {run.published} published rows, {run.held_out} held out")
    result = Table(title="held-out error (MAPE %)")
    for col in ("quantity", "before", "after"):
        result.add_column(col)
    for key in ("tokens_per_sec_per_gpu", "peak_memory_gib"):
        result.add_row(key, _pct(run.before.get(key)), _pct(run.after.get(key)))
    out_console.print(result)
    out_console.print(f"fitted: {', '.join(run.document.fitted)}")
    out_console.print(f"wrote {out}: use it with --calibration {out} (estimate, space, sweep) or `calibration: {out}`")
    return 0


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
