"""The installed command's end (orchestrator/commands/exiting.py): a stop once the command has returned keeps its exit
code
and prints nothing; the teardown is quick, and the stores' files are whole when the process is gone."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.sweep_helpers import spec_data, write_spec

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("moe-autotune"))


# a command that ends (exit code 3) while a stop arrives: during an exit hook (registered by a library the command
# loaded), or after the last one, where only the interpreter's teardown is left (a hook registered before the
# command runs, as the exit hook of a library the interpreter loaded at start would be). CI met the second: a sweep
# SIGTERMed just as it ended exited -15 though its work was done and recorded.
EXIT_SCRIPT = textwrap.dedent("""
    import atexit, os, signal, sys, time
    from orchestrator.commands import cli
    from orchestrator.commands.interrupts import unwind_on_signals

    def stop(where):
        print(where, signal.getsignal(signal.SIG{name}) is signal.SIG_IGN, flush=True)
        os.kill(os.getpid(), signal.SIG{name})
        time.sleep(0.2)  # the signal is handled here, or ignored
        print("after " + where, flush=True)

    def command(argv=None):
        unwind_on_signals()  # as `moe-autotune sweep` does
        if "{when}" == "hook":
            atexit.register(stop, "hook")
        return 3

    if "{when}" == "teardown":
        atexit.register(stop, "teardown")
    cli.main = command
    {entry}
""")


def _exit_run(when: str, name: str, entry: str) -> subprocess.CompletedProcess:
    script = EXIT_SCRIPT.replace("{when}", when).replace("{name}", name).replace("{entry}", entry)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", ["TERM", "INT"])
@pytest.mark.parametrize("when", ["hook", "teardown"])
def test_a_stop_while_a_finished_command_exits_keeps_its_exit_code_and_prints_nothing(when, name):
    """During an exit hook the stop exits at once; after the last one the stop is ignored (SIG_IGN, which CPython
    keeps through its teardown, where it gives a Python handler's signal its default action)."""
    done = _exit_run(when, name, "cli.console_main()")
    expected = {"hook": "hook False\n", "teardown": "teardown True\nafter teardown\n"}[when]
    assert done.stdout == expected, (done.stdout, done.stderr)  # the stop was sent as the process exited
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    assert done.stderr == "", done.stderr


@pytest.mark.slow  # four interpreters: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.parametrize("name", ["TERM", "INT"])
@pytest.mark.parametrize("when", ["hook", "teardown"])
def test_without_console_main_a_stop_at_exit_kills_or_prints(when, name):
    """What `console_main` exists for, reproduced with `sys.exit(main())` (the installed command before)."""
    done = _exit_run(when, name, "sys.exit(cli.main())")
    assert done.stdout.startswith(when), (done.stdout, done.stderr)
    assert done.returncode != 3 or "Traceback" in done.stderr, (done.returncode, done.stdout, done.stderr)


@pytest.mark.slow  # a sweep through the installed command, about 6 s: the full suite runs it (issue 33)
def test_after_the_installed_command_the_sqlite_stores_are_whole_in_their_files(tmp_path):
    """The teardown no longer collects the heap, which is what closed the stores' connections: the last exit hook
    closes them, so no write-ahead log is left beside a store and each file alone (copied as a user would copy
    it) holds every trial and run."""
    data = spec_data(tmp_path, "whole", budget={"n_trials": 4})
    spec = write_spec(tmp_path / "spec.json", data)
    done = subprocess.run([CLI, "sweep", str(spec), "--quiet"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(("-wal", "-shm", "-journal")))
    assert leftovers == []
    copies = tmp_path / "copies"
    copies.mkdir()
    for name in ("optuna.db", "mlflow.db"):
        shutil.copy(tmp_path / name, copies / name)  # the file alone, as a user copies it
    with sqlite3.connect(copies / "optuna.db") as db:
        assert db.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0] == 4
    with sqlite3.connect(copies / "mlflow.db") as db:  # the parent run and one child run a trial
        assert db.execute("SELECT COUNT(*) FROM runs WHERE status = 'FINISHED'").fetchone()[0] == 5
