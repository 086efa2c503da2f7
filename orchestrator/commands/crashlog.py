"""The CLI's last line of defence: an exception nobody expected becomes one line, and its traceback a log file.

A bug of ours must not look like the user's fault (exit 2) or like the environment's (3-6), and must not print
a traceback at the user either: `orchestrator/commands/cli.py` prints `error: internal error: <kind>; details in <file>`
and exits with INTERNAL_ERROR_EXIT. The file holds the command line and the traceback (credentials in URIs
redacted, readable by the user only). It goes to the run's folder when a command named one (`here`: a sweep's
`<workdir>/<study>`), else to $XDG_STATE_HOME/moe-autotune/logs (~/.local/state/...), else to the system's temp
folder; writing it never raises: when no folder takes it the line says so.

The test suite sets MOE_AUTOTUNE_INTERNAL_ERRORS=raise: the exception is raised as it is, so a bug fails its test
instead of hiding behind a tidy line (tests/conftest.py).
"""

from __future__ import annotations

import datetime
import os
import sys
import traceback
from pathlib import Path

INTERNAL_ERROR_EXIT = 70  # EX_SOFTWARE of sysexits.h: a bug, neither bad input (2) nor the environment (3-6)
RAISE_ENV = "MOE_AUTOTUNE_INTERNAL_ERRORS"  # "raise": the exception propagates (the test suite)
LINE_PREFIX = "error: internal error:"

_run_folder: Path | None = None


def here(folder: Path | str | None) -> None:
    """The folder of the run now under way (a sweep's work directory): its internal errors are logged there;
    None: no run (each command starts so)."""
    global _run_folder
    _run_folder = Path(folder) if folder is not None else None


def should_raise() -> bool:
    return os.environ.get(RAISE_ENV, "").strip().lower() == "raise"


def report(exc: BaseException, argv: list[str] | None) -> str:
    """Log `exc` and return the one line that names it (never raises)."""
    kind = type(exc).__name__
    try:
        where, failures = _write(exc, argv)
    except Exception as why:  # noqa: BLE001 -- the last line of defence must not fail itself
        where, failures = None, [f"{type(why).__name__}"]
    if where is not None:
        return f"{LINE_PREFIX} {kind}; details in {where}"
    return (f"{LINE_PREFIX} {kind}; the details could not be written ({'; '.join(failures)[:200]}): rerun with "
            "--debug to see them")


def _write(exc: BaseException, argv: list[str] | None) -> tuple[Path | None, list[str]]:
    text = _details(exc, argv)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"moe-autotune-internal-error-{stamp}-{os.getpid()}.log"
    failures: list[str] = []
    for folder in _folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
                fh.write(text)
            return path, failures
        except OSError as why:
            failures.append(f"{folder}: {why.strerror or why}")
    return None, failures


def _folders() -> list[Path]:
    import tempfile  # the log's folders: only when there is an error to log, not at every start-up

    folders = [_run_folder] if _run_folder is not None else []
    try:
        state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        folders.append(state / "moe-autotune" / "logs")
    except RuntimeError:  # no home folder to be found
        pass
    return [*folders, Path(tempfile.gettempdir()) / "moe-autotune-logs"]


def _details(exc: BaseException, argv: list[str] | None) -> str:
    """The command line and the traceback, credentials in URIs redacted."""
    from orchestrator.redact import redact_uri  # the redaction rules: only when there is an error to log

    command = " ".join(argv if argv is not None else sys.argv[1:])
    trace = "".join(traceback.format_exception(exc))
    return redact_uri(f"moe-autotune {command}\npython {sys.version.split()[0]}\n\n{trace}")
