"""The CLI imports only the module of the command that runs (orchestrator/cli.py COMMANDS): the table must name what
each module registers, and a command's run must not pay for the other commands' imports."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator import cli


def test_the_command_table_names_what_each_module_registers():
    for module, names in cli.COMMANDS.items():
        assert cli._registered(cli.make_app((module,))) == set(names), module


def test_the_full_app_has_every_command_once():
    names = [name for names in cli.COMMANDS.values() for name in names]
    assert len(names) == len(set(names))
    assert cli._registered(cli.app) == set(names)


def test_a_command_runs_without_importing_the_other_commands():
    probe = ("import contextlib, io, json, sys\n"
             "from orchestrator.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    rc = main(['lengths', '--help'])\n"
             "print(json.dumps([rc, sorted(m for m in sys.modules if m.startswith('orchestrator.commands.'))]))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    rc, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert rc == 0
    command_modules = {f"orchestrator.commands.{module}" for module in cli.COMMANDS}
    assert command_modules & set(loaded) == {"orchestrator.commands.lengths"}, loaded
