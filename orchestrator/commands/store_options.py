"""What the commands' store options accept, checked as the command line is read: a `--tracking-uri` without a URL
scheme (a plain path, `mlflow.db`) is one line naming the schemes accepted (orchestrator/storage:
check_tracking_uri), before any store is looked at or anything is created."""

from __future__ import annotations

from typing import Optional


def tracking_uri(value: Optional[str]) -> Optional[str]:
    """A typer callback for a read-only command's --tracking-uri (None: the command's own default)."""
    if value is None:
        return None
    from orchestrator.storage import check_tracking_uri  # the store table: what a URL's scheme means

    return check_tracking_uri(value)
