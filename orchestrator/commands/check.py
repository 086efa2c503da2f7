"""`moe-autotune check [STUDY]`: the Optuna study and its MLflow experiment, compared trial by trial;
`moe-autotune confirm [STUDY] --top K`: the best proxy-measured layouts run again at full size."""

from __future__ import annotations

from typing import Optional

import typer

from orchestrator.commands import store_options
from orchestrator.spec.schema import DEFAULT_STORAGE


def register(app: typer.Typer) -> None:
    app.command("check")(check)
    app.command("confirm")(confirm)


def check(
    study_name: Optional[str] = typer.Argument(None, metavar="[STUDY]", help="default: the last study"),
    storage: str = typer.Option(DEFAULT_STORAGE, help="Optuna storage URL"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", callback=store_options.tracking_uri,
                                               help="MLflow tracking URI (default: the one the study recorded)"),
) -> int:
    """Verify that nothing was lost, doubled or mixed: exit 0 when the study and MLflow agree, 1 otherwise."""
    from search_spaces.inputs import check_optional_name

    from orchestrator.redact import redact_uri
    from orchestrator.userio import echo

    check_optional_name(study_name, "study name")
    from orchestrator.outputs.check import check as run_check  # Optuna and MLflow: for a name that passed
    study, problems = run_check(storage, study_name, tracking_uri)
    finished = sum(1 for t in study.trials if t.state.is_finished())
    for problem in problems:
        echo(f"differs: {redact_uri(problem)}")
    verdict = "consistent" if not problems else f"{len(problems)} difference(s)"
    echo(f"study {study.study_name}: {finished} finished trials; {verdict}")
    return 1 if problems else 0


def confirm(
    study_name: Optional[str] = typer.Argument(None, metavar="[STUDY]", help="default: the last study"),
    top: int = typer.Option(3, "--top", min=1, help="how many of the best proxy-measured layouts to confirm"),
    storage: str = typer.Option(DEFAULT_STORAGE, help="Optuna storage URL"),
    trial_gpus: Optional[int] = typer.Option(None, "--trial-gpus", help="GPUs one trial may use now "
                                                                        "(at least the layout's full size)"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", callback=store_options.tracking_uri),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="join a running Ray cluster"),
    quiet: bool = typer.Option(False, "--quiet", help="no live progress"),
) -> int:
    """Run the best proxy-measured layouts at full size, as trials of the same study (before promote)."""
    from rich.table import Table

    from search_spaces.inputs import check_optional_name

    from orchestrator.userio import console

    check_optional_name(study_name, "study name")
    from orchestrator.records import TrialRecord  # Optuna, Ray, MLflow: for a name that passed
    from orchestrator.sweep.confirm import confirm as run_confirm
    done, outcome = run_confirm(storage, study_name, top, {"trial_gpus": trial_gpus, "tracking_uri": tracking_uri,
                                                            "ray_address": ray_address, "show_progress": not quiet})
    table = Table(title="composed from the proxy vs measured at full size (tokens/s/GPU)")
    for col in ("layout", "proxy trial", "composed", "full trial", "measured", "error"):
        table.add_column(col)
    for c in done:
        full = c.full
        table.add_row(TrialRecord.of(c.proxy).layout_key or "", str(c.proxy.number), f"{c.proxy.values[0]:,.1f}",
                      str(full.number) if full else "-", f"{full.values[0]:,.1f}" if full and c.error is not None
                      else ((TrialRecord.of(full).status or "-") if full else "-"),
                      f"{c.error:+.1%}" if c.error is not None else "-")
    console().print(table)
    return outcome.exit_code
