"""Promotes and rollbacks that run at once (issue 58): each move of `@production` records the version it really
replaced, so that N promotes at once make a chain and each rollback steps back exactly one version.

Real processes: three `promote` commands on one SQLite MLflow store, each started (its libraries loaded) and then
released at the same moment by a gate file, so that their registry calls overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow import MlflowClient

from orchestrator.commands.cli import main
from orchestrator.outputs import promotion_lock, registry
from tests.mlflow_server import MlflowServer
from tests.orchestrator.test_promote import make_study

ROOT = Path(__file__).resolve().parents[2]
NAME = "tiny-moe-4096-layout"
# a promote command whose libraries are loaded before the gate opens: the commands then race in their registry calls
GATED = textwrap.dedent("""
    import os, sys, time
    from orchestrator.commands.cli import main
    from orchestrator.outputs import registry, winner  # noqa: F401 -- loaded before the gate
    import mlflow, optuna  # noqa: F401
    slow = mlflow.MlflowClient.set_registered_model_alias  # a registry far away: the move lands a second later
    mlflow.MlflowClient.set_registered_model_alias = lambda *a, **k: (time.sleep(1.0), slow(*a, **k))[1]
    gate = sys.argv[1]
    open(f"{gate}.ready.{os.getpid()}", "w").close()
    while not os.path.exists(gate):
        time.sleep(0.01)
    sys.exit(main(sys.argv[2:]))
""")


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


def _chain(client: MlflowClient) -> list[str]:
    """The versions from production back along previous_production, each once (a loop fails the test)."""
    version = client.get_model_version_by_alias(NAME, registry.PRODUCTION)
    chain = [str(version.version)]
    while previous := version.tags.get(registry.PREVIOUS_TAG):
        assert previous not in chain, chain
        chain.append(previous)
        version = client.get_model_version(NAME, previous)
    return chain


@pytest.fixture(params=["sqlite", "server"])
def registry_store(request, tmp_path, tracking, monkeypatch):
    """The registry the promotes race on: a SQLite store, or a real `mlflow server` of the test's own."""
    if request.param == "sqlite":
        yield tracking
        return
    with MlflowServer(tmp_path / "server") as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        yield server.uri


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_three_promotes_at_once_chain_and_each_rollback_steps_back_one_version(tmp_path, registry_store, capsys):
    tracking = registry_store
    storage, _ = make_study(tmp_path)
    gate = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": tracking}
    procs = [subprocess.Popen([sys.executable, "-c", GATED, str(gate), "promote", "fake", "--storage", storage,
                               "--trial", str(trial)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for trial in (0, 1, 4)]
    _wait_loaded(procs, gate)  # each command's libraries loaded: then all go at once
    gate.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    client = MlflowClient(tracking)
    versions = sorted(str(v.version) for v in client.search_model_versions(f"name='{NAME}'"))
    assert versions == ["1", "2", "3"]
    chain = _chain(client)
    assert sorted(chain) == versions, chain  # every promotion is in the chain once
    # what each command printed it replaced is what the chain records: no two replaced the same version
    replaced = sorted(out.split("(was version ")[1].split(")")[0] for out, _ in outs if "(was version" in out)
    assert replaced == sorted(chain[1:]), (replaced, chain, outs)
    assert not client.search_registered_models(f"name LIKE '%{promotion_lock.LOCK_SUFFIX}%'")  # no lock left

    capsys.readouterr()
    for step in range(2):  # each rollback steps back one version, visiting each once
        assert main(["promote", "--rollback", "--name", NAME]) == 0
        assert f"version {chain[step]} -> {chain[step + 1]}" in capsys.readouterr().out
        assert str(client.get_model_version_by_alias(NAME, registry.PRODUCTION).version) == chain[step + 1]
    assert main(["promote", "--rollback", "--name", NAME]) == 2
    assert "first production version" in capsys.readouterr().err


def _wait_loaded(procs: list[subprocess.Popen], gate: Path) -> None:
    """Until each process waits at the gate (its libraries loaded), or one of them ended."""
    import time

    while len(list(gate.parent.glob(f"{gate.name}.ready.*"))) < len(procs):
        if any(p.poll() is not None for p in procs):
            return  # communicate() shows why
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_a_lock_left_by_a_dead_promote_is_taken_over_and_a_live_one_elsewhere_is_named(tmp_path, tracking,
                                                                                        capsys, monkeypatch):
    storage, _ = make_study(tmp_path)
    assert main(["promote", "fake", "--storage", storage, "--trial", "1"]) == 0
    client = MlflowClient(tracking)
    lock = NAME + promotion_lock.LOCK_SUFFIX
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {"token": "d" * 32, "pid": int(dead.stdout), "host": promotion_lock.socket.gethostname()}
    client.create_registered_model(lock, description=json.dumps(holder))  # a promote killed mid-move
    capsys.readouterr()
    assert main(["promote", "fake", "--storage", storage, "--trial", "4"]) == 0
    assert "version 2 (was version 1)" in capsys.readouterr().out
    assert not client.search_registered_models(f"name LIKE '{NAME}.%'")  # the dead one's lock and its rename gone

    # a holder on another host may be alive: waited for, then named in one line with what to do
    client.create_registered_model(lock, description=json.dumps({**holder, "host": "elsewhere", "pid": 4242}))
    monkeypatch.setattr(promotion_lock, "WAIT_S", 0.3)
    assert main(["promote", "--rollback", "--name", NAME]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pid 4242 on elsewhere" in err and f"delete the registered model '{lock}'" in err
    assert str(client.get_model_version_by_alias(NAME, registry.PRODUCTION).version) == "2"  # nothing moved
