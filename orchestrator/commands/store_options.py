"""What the commands' store options accept, checked as the command line is read: a `--tracking-uri` without a URL
scheme (a plain path, `mlflow.db`) is one line naming the schemes accepted (orchestrator/storage:
check_tracking_uri), before any store is looked at or anything is created.

The commands a Slurm job runs (`sweep`, `slurm link-run`) and `slurm render|submit` read --storage and --tracking-uri
from the environment when they are not given (STORAGE_ENV, TRACKING_URI_ENV): that is how a URL with a password
reaches the job without being written into its batch script (orchestrator/commands/slurm_credentials.py)."""

from __future__ import annotations

from typing import Optional

STORAGE_ENV = "MOE_AUTOTUNE_STORAGE"  # --storage when the flag is not given (sweep, slurm)
TRACKING_URI_ENV = "MOE_AUTOTUNE_TRACKING_URI"  # --tracking-uri when the flag is not given (sweep, slurm)


def tracking_uri(value: Optional[str]) -> Optional[str]:
    """A typer callback for a read-only command's --tracking-uri (None: the command's own default)."""
    if value is None:
        return None
    from orchestrator.storage import check_tracking_uri  # the store table: what a URL's scheme means

    return check_tracking_uri(value)
