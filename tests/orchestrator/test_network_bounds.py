"""Every network call bounded (issue 34): an MLflow or PostgreSQL endpoint that refuses (a closed port) or accepts
and never answers (tests/network_faults.py's SilentServer) is one line within a bound, naming the endpoint without
its password, with the exit code the README gives a store that cannot be used (2), for every command that talks
to it. The bound is each test's timeout (pytest-timeout), never a timed assertion.

Most cases run in-process with the bounds a user may set lowered (MLflow: 2 s per request, no retry; libpq: 2 s
to connect), so that a silent server costs seconds; the two marked slow run the CLI with none of them set: the
defaults of orchestrator/storage/connections.py, retries included.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.commands.cli import main
from orchestrator.storage import connections
from tests.network_faults import SilentServer, closed_port
from tests.sweep_helpers import finished_sweep, spec_data, write_spec

PASSWORD = "PW-s3cr3t-34"
ROOT = Path(__file__).resolve().parents[2]
STUDY = "bounded"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A finished analytic sweep the commands are pointed away from."""
    return finished_sweep(tmp_path_factory.mktemp("network"), STUDY)


@pytest.fixture
def silent():
    with SilentServer() as server:
        yield server


def _one_line(capsys, code: int, port: int) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{err[-3000:]}"
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in err, err[-3000:]
    assert PASSWORD not in err, line
    assert f"127.0.0.1:{port}" in line, f"the line does not name the endpoint: {line}"
    assert code == 2, (code, line)
    return line


# ---- MLflow over HTTP -----------------------------------------------------------------------------------------
def _mlflow_uri(port: int) -> str:
    return f"http://alice:{PASSWORD}@127.0.0.1:{port}"


MLFLOW_CASES = {
    "check": lambda w, uri: ["check", STUDY, "--storage", w["storage"], "--tracking-uri", uri],
    "promote": lambda w, uri: ["promote", STUDY, "--storage", w["storage"], "--tracking-uri", uri,
                               "--allow-estimated"],
    "promote --rollback": lambda w, uri: ["promote", "--rollback", "--name", "m", "--tracking-uri", uri],
    "export a registered version": lambda w, uri: ["export", "m@production", "--tracking-uri", uri],
    "report": lambda w, uri: ["report", STUDY, "--storage", w["storage"], "--tracking-uri", uri,
                              "--out", str(w["root"] / "report-out")],
    "calibrate --experiment": lambda w, uri: ["calibrate", "--experiment", STUDY, "--tracking-uri", uri,
                                              "--out", str(w["root"] / "cal.json")],
    "ui": lambda w, uri: ["ui", STUDY, "--tracking-uri", uri],
    "sweep": lambda w, uri: ["sweep", str(w["spec"]), "--study-name", "fresh", "--tracking-uri", uri, "--quiet"],
}


def _nothing_written(world) -> None:
    import optuna

    assert not (world["root"] / "report-out").exists() and not (world["root"] / "cal.json").exists()
    names = {s.study_name for s in optuna.get_all_study_summaries(world["storage"], include_best_trial=False)}
    assert names == {STUDY}, names


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(MLFLOW_CASES), ids=list(MLFLOW_CASES))
def test_a_closed_mlflow_port_is_one_line_naming_it(case, world, capsys):
    port = closed_port()
    capsys.readouterr()
    code = main(MLFLOW_CASES[case](world, _mlflow_uri(port)))
    line = _one_line(capsys, code, port)
    assert "refused" in line.lower(), line
    _nothing_written(world)


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(MLFLOW_CASES), ids=list(MLFLOW_CASES))
def test_an_mlflow_server_that_never_answers_is_one_line_naming_it(case, world, capsys, silent, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    capsys.readouterr()
    code = main(MLFLOW_CASES[case](world, _mlflow_uri(silent.port)))
    line = _one_line(capsys, code, silent.port)
    assert "no answer" in line, line
    assert silent.accepted >= 1, "the command never reached the server: this test would prove nothing"
    _nothing_written(world)


# ---- PostgreSQL -----------------------------------------------------------------------------------------------
def _pg_url(port: int, database: str = "optuna") -> str:
    return f"postgresql://optuna:{PASSWORD}@127.0.0.1:{port}/{database}"


STORAGE_CASES = {
    "status": lambda w, url: ["status", "--storage", url],
    "sweep": lambda w, url: ["sweep", str(w["spec"]), "--storage", url, "--tracking-uri", "none", "--quiet"],
    "check": lambda w, url: ["check", STUDY, "--storage", url],
    "promote": lambda w, url: ["promote", STUDY, "--storage", url, "--allow-estimated"],
    "export": lambda w, url: ["export", STUDY, "--storage", url],
    "report": lambda w, url: ["report", STUDY, "--storage", url, "--no-mlflow", "--out",
                              str(w["root"] / "report-out")],
    "calibrate --study": lambda w, url: ["calibrate", "--study", STUDY, "--storage", url, "--out",
                                         str(w["root"] / "cal.json")],
    "sweep with its MLflow store there": lambda w, url: ["sweep", str(w["spec"]), "--study-name", "fresh",
                                                         "--tracking-uri", url.replace("/optuna", "/mlflow"),
                                                         "--quiet"],
    "check with its MLflow store there": lambda w, url: ["check", STUDY, "--storage", w["storage"],
                                                         "--tracking-uri", url.replace("/optuna", "/mlflow")],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(STORAGE_CASES), ids=list(STORAGE_CASES))
def test_a_closed_postgresql_port_is_one_line_naming_it(case, world, capsys):
    port = closed_port()
    capsys.readouterr()
    code = main(STORAGE_CASES[case](world, _pg_url(port)))
    line = _one_line(capsys, code, port)
    assert "refused" in line.lower(), line
    _nothing_written(world)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(STORAGE_CASES), ids=list(STORAGE_CASES))
def test_a_postgresql_server_that_never_answers_is_one_line_naming_it(case, world, capsys, silent, monkeypatch):
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")  # libpq's own setting, as a user would lower it
    capsys.readouterr()
    code = main(STORAGE_CASES[case](world, _pg_url(silent.port)))
    line = _one_line(capsys, code, silent.port)
    assert "no answer" in line, line
    assert silent.accepted >= 1, "the command never reached the server: this test would prove nothing"
    _nothing_written(world)


def test_a_bound_the_url_sets_itself_is_the_users(monkeypatch):
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    given = connections.engine_kwargs("postgresql://u@h/db?connect_timeout=30&options=-c%20work_mem%3D64MB")
    assert "connect_timeout" not in given["connect_args"] and "options" not in given["connect_args"]
    ours = connections.engine_kwargs("postgresql://u@h/db")["connect_args"]
    assert ours["connect_timeout"] == connections.DB_CONNECT_TIMEOUT_S
    assert f"statement_timeout={connections.DB_STATEMENT_TIMEOUT_S * 1000}" in ours["options"]


@pytest.mark.timeout(300)
# the session's PostgreSQL cluster (tests/conftest.py), shared with test_team_stack
@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.xdist_group("postgres")
def test_a_real_postgresql_takes_the_bounds_and_a_sweep_runs_on_it(tmp_path, capsys, postgres):
    """The positive path: the bounds (libpq keywords, a statement_timeout) are accepted by a real server."""
    url = postgres.create_database("bounds")
    spec = write_spec(tmp_path / "spec.json", spec_data(tmp_path, "pg", storage=url, tracking_uri="none"))
    assert main(["sweep", str(spec), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["status", "pg", "--storage", url]) == 0
    # the spec's budget, read back from the server
    assert re.search(r"study pg: .*\(6 count against n_trials\)", capsys.readouterr().out)
    import sqlalchemy

    engine = connections.sql_engine(url)
    try:
        with engine.connect() as conn:
            shown = conn.execute(sqlalchemy.text(
                "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'")).scalar()  # in ms
    finally:
        engine.dispose()
    assert int(shown) == connections.DB_STATEMENT_TIMEOUT_S * 1000, shown


# ---- the defaults, through the installed entry point -----------------------------------------------------------
def _clean_env() -> dict[str, str]:
    """The environment of a user who set none of the bounds."""
    bounds = (*connections.MLFLOW_HTTP_ENV, "PGCONNECT_TIMEOUT")
    env = {k: v for k, v in os.environ.items() if k not in bounds}
    return {**env, "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
@pytest.mark.timeout(connections.MLFLOW_BOUND_S + 240)  # the bound, plus a loaded machine's start-up
def test_with_no_setting_a_silent_mlflow_server_is_one_line_within_the_stated_bound(world, silent):
    argv = MLFLOW_CASES["check"](world, _mlflow_uri(silent.port))
    done = subprocess.run([sys.executable, "-m", "orchestrator.commands.cli", *argv], env=_clean_env(),
                          capture_output=True, text=True, timeout=connections.MLFLOW_BOUND_S + 200)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "no answer" in lines[0] and PASSWORD not in done.stderr and f"127.0.0.1:{silent.port}" in lines[0]


@pytest.mark.slow
@pytest.mark.timeout(connections.DB_BOUND_S + 240)
def test_with_no_setting_a_silent_postgresql_is_one_line_within_the_stated_bound(world, silent):
    done = subprocess.run([sys.executable, "-m", "orchestrator.commands.cli", "status", "--storage",
                           _pg_url(silent.port)],
                          env=_clean_env(), capture_output=True, text=True, timeout=connections.DB_BOUND_S + 200)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "no answer" in lines[0] and PASSWORD not in done.stderr and f"127.0.0.1:{silent.port}" in lines[0]
