"""The team stack: one study in a real PostgreSQL shared by the drivers of two hosts, every trial in a real
`mlflow server` whose own backend store is PostgreSQL too (what a team runs instead of the embedded SQLite
files). Each driver is the installed CLI in its own process; nothing here imports the sweep."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from mlflow import MlflowClient

from orchestrator.records import queries
from orchestrator.sweep.lease import HOST_ENV
from tests.mlflow_server import MlflowServer
from tests.sweep_helpers import spec_data, write_spec

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator.commands.cli"]

# one PostgreSQL cluster (the session's `postgres` fixture, tests/conftest.py): its tests share one xdist worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]


def _driver(args: list[str], host: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", HOST_ENV: host}
    return subprocess.run(CLI + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(900)
def test_two_hosts_share_one_study_in_postgres_and_one_mlflow_server(postgres, tmp_path):
    optuna_url = postgres.create_database("optuna")
    with MlflowServer(tmp_path / "mlflow", backend_store_uri=postgres.create_database("mlflow")) as mlflow:
        data = spec_data(tmp_path, "team", storage=optuna_url, tracking_uri=mlflow.uri)
        spec = write_spec(tmp_path / "team.yaml", data)
        host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"
        host_a.mkdir()
        host_b.mkdir()

        first = _driver(["sweep", str(spec), "--n-trials", "6", "--quiet"], "host-a", host_a)
        assert first.returncode == 0, first.stdout + first.stderr
        # a teammate on another host continues the same study to 10 trials
        second = _driver(["sweep", str(spec), "--resume", "--n-trials", "10", "--quiet"], "host-b", host_b)
        assert second.returncode == 0, second.stdout + second.stderr

        study = optuna.load_study(study_name="team", storage=optuna_url)
        measured = queries.measured_trials(study)
        assert len(measured) == 10
        assert len({t.user_attrs["layout_key"] for t in measured}) == 10  # no layout measured twice
        # both hosts' trials went to the one MLflow server, under the study's one parent run
        client = MlflowClient(mlflow.uri)
        experiment = client.get_experiment_by_name("team")
        runs = client.search_runs([experiment.experiment_id], max_results=100)
        children = [r for r in runs if "optuna_trial_number" in r.data.tags]
        assert sorted(int(r.data.tags["optuna_trial_number"]) for r in children) == sorted(t.number for t in measured)
        assert {r.info.status for r in children} == {"FINISHED"}
        assert len({r.data.tags["mlflow.parentRunId"] for r in children}) == 1

        # a third process reads the leaderboard from PostgreSQL
        board = _driver(["status", "team", "--storage", optuna_url, "--csv", str(tmp_path / "board.csv")],
                        "host-c", tmp_path)
        assert board.returncode == 0, board.stdout + board.stderr
        with open(tmp_path / "board.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == 10
    # the study and the MLflow runs live in PostgreSQL, not in files the drivers left behind
    tables = sqlalchemy.inspect(sqlalchemy.create_engine(optuna_url)).get_table_names()
    assert {"studies", "trials", "trial_user_attributes"} <= set(tables)
    mlflow_tables = sqlalchemy.inspect(sqlalchemy.create_engine(postgres.url("mlflow"))).get_table_names()
    assert {"experiments", "runs", "metrics"} <= set(mlflow_tables)
    assert not list(host_a.glob("*.db")) and not list(host_b.glob("*.db"))
