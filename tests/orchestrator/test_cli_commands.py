"""The CLI imports only the module of the command that runs (orchestrator/commands/cli.py COMMANDS): the table
must name what each module registers, and a command's run must not pay for the other commands' imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.commands import cli


def test_the_command_table_names_what_each_module_registers():
    for module, names in cli.COMMANDS.items():
        assert cli._registered(cli.make_app((module,))) == set(names), module


def test_the_full_app_has_every_command_once():
    names = [name for names in cli.COMMANDS.values() for name in names]
    assert len(names) == len(set(names))
    assert cli._registered(cli.app) == set(names)


def test_a_command_runs_without_importing_the_other_commands():
    probe = ("import contextlib, io, json, sys\n"
             "from orchestrator.commands.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    rc = main(['lengths', '--help'])\n"
             "print(json.dumps([rc, sorted(m for m in sys.modules if m.startswith('orchestrator.commands.'))]))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    rc, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert rc == 0
    command_modules = {f"orchestrator.commands.{module}" for module in cli.COMMANDS}
    assert command_modules & set(loaded) == {"orchestrator.commands.lengths"}, loaded


def test_the_cli_starts_no_library_threads_so_a_sweeps_exploration_may_fork(tmp_path):
    """numpy's OpenBLAS pool, pyarrow's jemalloc purger (loaded with MLflow) and MLflow's telemetry are threads:
    beside them the cost model's exploration would run in one process (search_spaces/layouts/forked.py), and no
    MLflow writer would be forked (orchestrator/tracking/writer_process.py). The CLI turns them off before a command
    imports
    those libraries. Run as a user runs it: MLflow keeps its telemetry off by itself under pytest or on CI."""
    script = ("from orchestrator.commands import cli\n"
              "cli.main(['--help'])\n"
              "import numpy, optuna, mlflow, orchestrator.tracking.tracker, orchestrator.sweep.session\n"
              "from search_spaces.layouts.forked import _threads\n"
              f"mlflow.MlflowClient('sqlite:///{tmp_path}/mlflow.db').create_experiment('threads')\n"
              "print(_threads())\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", *cli.LIBRARY_THREADS_OFF, *CI_MARKERS)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.split()[-1] == "1"


# what MLflow takes for a test or CI run (mlflow/telemetry/utils.py), where its telemetry is off whatever we set
CI_MARKERS = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "BUILDKITE")


def test_a_users_own_setting_of_the_library_threads_wins(monkeypatch):
    monkeypatch.setenv("JE_ARROW_MALLOC_CONF", "narenas:2")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert cli.main(["--help"]) == 0
    assert os.environ["JE_ARROW_MALLOC_CONF"] == "narenas:2"
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"


def test_status_reads_the_study_without_loading_mlflow(tmp_path):
    """`status` reads the Optuna storage alone: the sweep package's names load on first use, so the lease it
    reads does not bring the loop and MLflow (a second of every `status`)."""
    from tests.orchestrator.test_promote import make_study

    storage, _ = make_study(tmp_path)
    probe = ("import contextlib, io, json, sys\n"
             "from orchestrator.commands.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
             f"    rc = main(['status', 'fake', '--storage', {storage!r}])\n"
             "print(json.dumps([rc, 'mlflow' in sys.modules, out.getvalue()]))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    rc, mlflow_loaded, shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert rc == 0 and "fake" in shown and not mlflow_loaded


def test_a_sweep_refused_before_it_needs_the_ranking_leaves_no_child_exploring(tmp_path, monkeypatch):
    """`sweep` begins a large space's exploration in a forked child while it loads its libraries
    (Prior.explore_ahead); a sweep refused before it takes that ranking (a --resume with nothing to resume) ends
    the child and reaps it: no process is left computing for a command that has exited."""
    import warnings

    from search_spaces.layouts import forked

    from orchestrator.search.prior import Prior
    from tests.sweep_helpers import spec_data, write_spec

    begun = []
    explore_ahead = Prior.explore_ahead

    def spy(prior):
        ahead = explore_ahead(prior)
        begun.append(ahead._child[0] if ahead is not None and ahead._child else None)
        return ahead

    monkeypatch.setattr(Prior, "explore_ahead", spy)
    monkeypatch.setattr(forked, "available_workers", lambda: 2)  # fork even beside the suite's threads
    data = spec_data(tmp_path, model="qwen3-30b-a3b", gpu="h200", gpus_per_node=8, nodes=8, seq_len=32768, gbs=None,
                     fixed={})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python's warning about fork() beside threads
        assert cli.main(["sweep", str(write_spec(tmp_path / "spec.yaml", data)), "--resume"]) == 2
    (pid,) = begun
    assert pid is not None  # the exploration was begun in a child
    with pytest.raises(ChildProcessError):  # killed and reaped by the command
        os.waitpid(pid, os.WNOHANG)
    assert not (tmp_path / "optuna.db").exists()
