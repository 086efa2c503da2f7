"""`moe-autotune`: one Typer app; each command lives in orchestrator/commands/<name>.py.

Any of the project's errors (search_spaces.errors.MoeAutotuneError: bad input, a store that cannot be used or
fails) and Click usage errors become one line `error: ...` on stderr and the error's exit code (2: bad input;
4: the storage failed mid-sweep, what was measured is kept). Anything else is a bug of ours: one line
`error: internal error: <kind>; details in <log file>` and exit 70 (orchestrator/crashlog.py); `--debug` shows
the traceback instead.

Commands import what they need when they run (Ray, MLflow, Optuna, pandas only behind the checks of their input):
refusing bad input costs the start-up of this module and the spec's parser, not the sweep's libraries
(bench/refusal_speed.py measures it).
"""

from __future__ import annotations

import sys
from typing import cast

import click
import typer

from search_spaces.errors import MoeAutotuneError

from orchestrator import crashlog
from orchestrator.redact import redact_text, redact_uri

app = typer.Typer(
    name="moe-autotune",
    help="Find the fastest layout for long-context MoE training on Megatron-Core.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_debug = {"on": False}


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show the traceback of an internal error "
                                                                "(instead of one line and a log file).")) -> None:
    """Find the fastest layout for long-context MoE training on Megatron-Core."""
    _debug["on"] = debug


# Each module defines register(app). Kept as a list so a new command is one line here.
from orchestrator.commands import calibrate as _calibrate  # noqa: E402
from orchestrator.commands import check as _check  # noqa: E402
from orchestrator.commands import estimate as _estimate  # noqa: E402
from orchestrator.commands import lengths as _lengths  # noqa: E402
from orchestrator.commands import promote as _promote  # noqa: E402
from orchestrator.commands import slurm as _slurm  # noqa: E402
from orchestrator.commands import sweep as _sweep  # noqa: E402
from orchestrator.commands import ui as _ui  # noqa: E402

for _module in (_estimate, _sweep, _slurm, _promote, _check, _ui, _calibrate, _lengths):
    _module.register(app)


def _vendored(name: str) -> tuple[type, ...]:
    """typer >= 0.29 ships its own copy of click: its exception classes are not click's."""
    return tuple(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


# typer's copy of ClickException is no subclass of click's, but has its API (format_message)
_USAGE_ERRORS: tuple[type[click.ClickException], ...] = (
    click.ClickException, *cast("tuple[type[click.ClickException], ...]", _vendored("ClickException")))
_EXITS = (click.exceptions.Exit, typer.Exit)
_ABORTS = (click.exceptions.Abort, typer.Abort)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry (setuptools wraps it in sys.exit); tests call main([...]) directly."""
    _debug["on"] = False
    crashlog.here(None)
    try:
        return _run(argv)
    except Exception as exc:  # the last line of defence: a bug is one line and a log file, not a traceback
        if _debug["on"] or crashlog.should_raise():
            raise
        line = redact_text(crashlog.report(exc, argv))  # a log path can carry a name; every line is redacted
        try:
            typer.echo(line, err=True)
        except OSError:  # not even stderr takes it: the exit code still says what happened
            pass
        return crashlog.INTERNAL_ERROR_EXIT


def _run(argv: list[str] | None) -> int:
    try:
        rv = app(args=argv, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except MoeAutotuneError as exc:  # a storage/tracking URI in the message never shows its password
        typer.echo(f"error: {redact_uri(str(exc))}", err=True)
        return exc.exit_code
    except _EXITS as exc:
        return getattr(exc, "exit_code", 0)
    except _ABORTS:
        typer.echo("aborted", err=True)
        return 130
    except _USAGE_ERRORS as exc:
        # usage errors: one line, not Click's three-line box (no-args help has already been printed)
        if exc.format_message():
            typer.echo(f"error: {redact_uri(exc.format_message())}", err=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
