"""`moe-autotune dashboard [STUDY]`: optuna-dashboard on a sweep's Optuna storage, opened as the sweep opens it."""

from __future__ import annotations

from typing import Optional

import typer

from orchestrator.spec.schema import DEFAULT_STORAGE


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)


def dashboard(
    study_name: Optional[str] = typer.Argument(None, metavar="[STUDY]", help="the study to open; default: the newest"),
    storage: str = typer.Option(DEFAULT_STORAGE, help="Optuna storage URL of the sweep"),
    port: int = typer.Option(8080, "--port", min=1, max=65535, help="port on 127.0.0.1"),
) -> int:
    """Start optuna-dashboard on 127.0.0.1 for the sweep's Optuna storage (any URL a sweep takes, the default journal
    included), print the study's URL, and serve until Ctrl-C. Needs the `dashboard` extra."""
    from search_spaces.inputs import check_optional_name

    check_optional_name(study_name, "study name")
    from orchestrator.outputs.dashboard import serve  # Optuna, optuna-dashboard: for a name that passed
    return serve(storage, study_name, port)
