"""`moe-autotune`: one Typer app; each command lives in orchestrator/commands/<name>.py (imported when it runs).

Any of the project's errors (search_spaces.errors.MoeAutotuneError: bad input, a store that cannot be used or
fails) and Click usage errors become one line `error: ...` on stderr and the error's exit code (2: bad input;
4: the storage failed mid-sweep, what was measured is kept). Anything else is a bug of ours: one line
`error: internal error: <kind>; details in <log file>` and exit 70 (orchestrator/commands/crashlog.py); `--debug` shows
the traceback instead.

Commands import what they need when they run (Ray, MLflow, Optuna, pandas only behind the checks of their input):
refusing bad input costs the start-up of this module and the spec's parser, not the sweep's libraries
(bench/refusal_speed.py measures it).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import typer

from search_spaces.errors import MoeAutotuneError

from orchestrator.commands import crashlog

_debug = {"on": False}


def _options(debug: bool = typer.Option(False, "--debug", help="Show the traceback of an internal error "
                                                                "(instead of one line and a log file).")) -> None:
    """Find the fastest layout for long-context MoE training on Megatron-Core."""
    _debug["on"] = debug


# Each module of orchestrator/commands/ defines register(app), and registers the commands named here (in this order:
# the order of --help). A new command is one line here. Only the module of the command that runs is imported:
# its module-level imports (tables, backends) are that command's start-up, not every command's.
COMMANDS: dict[str, tuple[str, ...]] = {
    "estimate": ("estimate", "space"),
    "sweep": ("sweep", "status"),
    "slurm": ("slurm",),
    "promote": ("promote", "export", "report"),
    "check": ("check", "confirm"),
    "ui": ("ui",),
    "dashboard": ("dashboard",),
    "calibrate": ("calibrate",),
    "lengths": ("lengths",),
    "model": ("model",),
}
_MODULE_OF = {command: module for module, commands in COMMANDS.items() for command in commands}


def make_app(modules: tuple[str, ...] | None = None) -> typer.Typer:
    """The Typer app with the commands of `modules` (names of COMMANDS; None: every command)."""
    made = typer.Typer(
        name="moe-autotune",
        help="Find the fastest layout for long-context MoE training on Megatron-Core.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    made.callback()(_options)
    for module in COMMANDS if modules is None else modules:
        importlib.import_module(f"orchestrator.commands.{module}").register(made)
    return made


def _registered(made: typer.Typer) -> set[str | None]:
    return {c.name for c in made.registered_commands} | {g.name for g in made.registered_groups}


def _app_for(argv: list[str]) -> typer.Typer:
    """The app that runs `argv`: for a command's name, the app of that command's module alone (what Click does
    with the command line is the same: only --debug and --help come before the name); else (--help, no command,
    a name that is none) every command."""
    name = next((arg for arg in argv if not arg.startswith("-")), None)
    module = _MODULE_OF.get(name or "")
    if module is not None:
        made = make_app((module,))
        if name in _registered(made):
            return made
    return _full_app()


_full: list[typer.Typer] = []


def _full_app() -> typer.Typer:
    if not _full:
        _full.append(make_app())
    return _full[0]


def __getattr__(name: str) -> typer.Typer:
    """`app`: the Typer app with every command (docs/refgen.py, tests), made when first asked for."""
    if name == "app":
        return _full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _vendored(name: str) -> tuple[type, ...]:
    """typer >= 0.29 ships its own copy of click: its exception classes are not click's."""
    return tuple(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


def _click(name: str) -> tuple[Any, ...]:
    """Click's own exception class `name` when click is loaded (typer < 0.29 runs on it; a library may use it). Not
    imported for this: typer >= 0.29 runs its own copy, and nothing raises click's classes without loading click."""
    click = sys.modules.get("click")
    return (getattr(click.exceptions, name),) if click is not None else ()


# typer's copy of ClickException is no subclass of click's, but has its API (format_message)
_USAGE_ERRORS: tuple[Any, ...] = _vendored("ClickException")
_EXITS = (typer.Exit,)
_ABORTS = (typer.Abort,)


# Threads of libraries this process never needs, which leave a forked child a copy of their locks in an unknown
# state: numpy's OpenBLAS pool (the orchestrator's numpy work is small) and the background purger of pyarrow's
# jemalloc (loaded with MLflow). Without them the cost model's exploration forks its workers in a sweep as it does
# in `space` (search_spaces/layouts/forked.py does not fork a process with another thread alive). Set before the
# commands import those libraries; a user's own setting wins; trainer processes do not inherit them (the local
# backend passes a short list of variables). MLflow 3's telemetry is one more such thread, and it sends usage events
# to MLflow's servers, which nobody asked this tool to do: off unless MLFLOW_DISABLE_TELEMETRY=false is set (the
# sweep's MLflow writer, orchestrator/tracking/writer_process.py, is forked only in a process without another thread).
LIBRARY_THREADS_OFF = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false",
                       "MLFLOW_DISABLE_TELEMETRY": "true"}


def main(argv: list[str] | None = None) -> int:
    """The command line's exit code; `console_main` (the installed command) runs it, tests call main([...]) directly."""
    for name, value in LIBRARY_THREADS_OFF.items():
        os.environ.setdefault(name, value)
    _debug["on"] = False
    crashlog.here(None)
    try:
        return _run(argv)
    except Exception as exc:  # the last line of defence: a bug is one line and a log file, not a traceback
        if _debug["on"] or crashlog.should_raise():
            raise
        from orchestrator.redact import redact_text  # the redaction rules: only for a line that needs them

        line = redact_text(crashlog.report(exc, argv))  # a log path can carry a name; every line is redacted
        try:
            typer.echo(line, err=True)
        except OSError:  # not even stderr takes it: the exit code still says what happened
            pass
        return crashlog.INTERNAL_ERROR_EXIT


def _run(argv: list[str] | None) -> int:
    try:
        args = sys.argv[1:] if argv is None else argv
        rv = _app_for(args)(args=args, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except MoeAutotuneError as exc:  # a storage/tracking URI in the message never shows its password
        from orchestrator.redact import redact_uri  # the redaction rules: only when an error line is printed

        _say(f"error: {redact_uri(str(exc))}")
        return exc.exit_code
    except (*_EXITS, *_click("Exit")) as exc:
        return getattr(exc, "exit_code", 0)
    except (*_ABORTS, *_click("Abort")):
        _say("aborted")
        return 130
    except (*_USAGE_ERRORS, *_click("ClickException")) as exc:
        # usage errors: one line, not Click's three-line box (no-args help has already been printed)
        if exc.format_message():
            from orchestrator.redact import redact_uri

            _say(f"error: {redact_uri(exc.format_message())}")
        return 2


def _say(line: str) -> None:
    """One line on standard error. A standard error that takes nothing (`2>&1 | head -0`: the pipe that refused the
    output refuses the line too) leaves it to the exit code, which still says what happened."""
    try:
        typer.echo(line, err=True)
    except OSError:
        return


def console_main() -> None:
    """The installed `moe-autotune` (pyproject's [project.scripts]): main(), then an end that a late Ctrl-C or
    SIGTERM cannot change, with a quick teardown (orchestrator/commands/exiting.py)."""
    from orchestrator.commands import exiting

    exiting.arm()  # before main loads a library: its exit hook runs after theirs
    try:
        code = main()
    except KeyboardInterrupt:  # a stop in the instant between a command's own handling and here
        code = 130
    exiting.finished(code)
    sys.exit(code)


if __name__ == "__main__":
    console_main()
