"""`moe-autotune ui [STUDY]`: the MLflow UI for a sweep's store, opened on the sweep's trials."""

from __future__ import annotations

from typing import Optional

import typer

from orchestrator.commands import store_options


def register(app: typer.Typer) -> None:
    app.command("ui")(ui)


def ui(
    study_name: Optional[str] = typer.Argument(None, metavar="[STUDY]", help="the sweep to open; default: the newest"),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", "--tracking-uri", help="the sweep's MLflow store",
                                     callback=store_options.tracking_uri),
    port: int = typer.Option(5000, "--port", min=1, max=65535, help="port on 127.0.0.1"),
) -> int:
    """Start the MLflow UI on 127.0.0.1 for the sweep's store (no job workers), print the URL of the sweep's
    trials ranked by tokens/s/GPU, and serve until Ctrl-C."""
    from search_spaces.inputs import check_optional_name

    check_optional_name(study_name, "study name")
    from orchestrator.tracking.ui import serve  # MLflow: for a name that passed
    return serve(tracking_uri, study_name, port)
