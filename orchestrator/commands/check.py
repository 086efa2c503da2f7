"""`moe-autotune check [STUDY]`: the Optuna study and its MLflow experiment, compared trial by trial."""

from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("check")(check)


def check(
    study_name: Optional[str] = typer.Argument(None, metavar="[STUDY]", help="default: the last study"),
    storage: str = typer.Option("sqlite:///optuna.db", help="Optuna storage URL"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                               help="MLflow tracking URI (default: the one the study recorded)"),
) -> int:
    """Verify that nothing was lost, doubled or mixed: exit 0 when the study and MLflow agree, 1 otherwise."""
    from orchestrator.check import check as run_check
    from orchestrator.redact import redact_uri

    study, problems = run_check(storage, study_name, tracking_uri)
    finished = sum(1 for t in study.trials if t.state.is_finished())
    for problem in problems:
        typer.echo(f"differs: {redact_uri(problem)}")
    verdict = "consistent" if not problems else f"{len(problems)} difference(s)"
    typer.echo(f"study {study.study_name}: {finished} finished trials; {verdict}")
    return 1 if problems else 0
