"""A tracking URI without a URL scheme (a plain path: `--tracking-uri mlfow.db`) is refused in one line naming the
schemes accepted, by every command that takes one, before anything is created (issue 56, part 4); `file:///path`
still names MLflow's file store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search_spaces.errors import SpecError

from orchestrator.commands.cli import main
from orchestrator.storage import check_tracking_uri, tracking_store
from orchestrator.storage.mlflow_file import MlflowFileStore
from tests.sweep_helpers import write_spec

SCHEMES = ("sqlite:///", "file:///", "http(s)://", "postgresql://")
PLAIN = "mlfow.db"


def _refusal(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    line = err.strip()
    assert all(scheme in line for scheme in SCHEMES), line
    return line


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


COMMANDS = {
    "ui": ["ui", "--tracking-uri", PLAIN],
    "check": ["check", "--tracking-uri", PLAIN],
    "confirm": ["confirm", "--tracking-uri", PLAIN, "--quiet"],
    "promote": ["promote", "--tracking-uri", PLAIN],
    "promote --rollback": ["promote", "--rollback", "--name", "m", "--tracking-uri", PLAIN],
    "export": ["export", "m@production", "--tracking-uri", PLAIN],
    "report": ["report", "--tracking-uri", PLAIN],
    "calibrate": ["calibrate", "--experiment", "e", "--tracking-uri", PLAIN, "--out", "cal.json"],
    "sweep": ["sweep", "SPEC", "--tracking-uri", PLAIN, "--quiet"],
    "slurm render": ["slurm", "render", "SPEC", "--tracking-uri", PLAIN],
}


@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_every_command_refuses_a_plain_path_in_one_line_and_creates_nothing(command, tmp_path, sweep_spec, capsys,
                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(tmp_path / "spec.yaml", sweep_spec("plain"))
    before = _files(tmp_path)
    assert main([str(spec) if a == "SPEC" else a for a in COMMANDS[command]]) == 2
    line = _refusal(capsys)
    assert f"tracking URI {PLAIN!r} has no URL scheme" in line
    assert ("or none" in line) == command.startswith(("sweep", "slurm"))  # `none` is a sweep's to give
    assert _files(tmp_path) == before  # no store, no folder, no study


def test_a_spec_whose_tracking_uri_is_a_plain_path_is_refused_before_the_space_is_explored(tmp_path, sweep_spec,
                                                                                          capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(tmp_path / "spec.yaml", sweep_spec("plain", tracking_uri="./mlruns"))
    import search_spaces.layouts.space as space

    monkeypatch.setattr(space, "explore", lambda *a, **k: pytest.fail("explored a space for a refused spec"))
    assert main(["sweep", str(spec), "--quiet"]) == 2
    assert "tracking URI './mlruns' has no URL scheme" in _refusal(capsys)
    assert _files(tmp_path) == ["spec.yaml"]


_PATH_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters=":\x00")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.one_of(st.text(_PATH_CHARS, max_size=40),
                      st.builds(lambda d, rest: f"{d}:\\{rest}", st.sampled_from("CDz"), st.text(_PATH_CHARS,
                                                                                                  max_size=20))))
def test_any_path_without_a_scheme_is_refused_by_the_store_table(path, capsys):
    """Whatever the path (relative, absolute, `~`, spaces, any script, a Windows drive): the table refuses it, and
    `ui` says so in one line at exit 2."""
    with pytest.raises(SpecError, match="has no URL scheme: give sqlite:///PATH, file:///PATH"):
        tracking_store(path)
    if path.lower() != "none":
        with pytest.raises(SpecError, match=r"or none \(no MLflow records\)$"):
            check_tracking_uri(path, none_ok=True)
    capsys.readouterr()
    if path.startswith("-") or "\n" in path or "\r" in path:  # an option to Click, or no one line to show
        return
    assert main(["ui", "--tracking-uri", path]) == 2
    _refusal(capsys)


def test_none_is_a_sweeps_and_a_scheme_is_kept(tmp_path):
    assert check_tracking_uri("none", none_ok=True) == "none"
    assert check_tracking_uri("NONE", none_ok=True) == "NONE"
    uri = f"file://{tmp_path / 'mlruns'}"
    store = tracking_store(uri)
    assert isinstance(store, MlflowFileStore) and store.path == tmp_path / "mlruns"
    assert check_tracking_uri("databricks://profile") == "databricks://profile"  # MLflow's client answers for it


@pytest.mark.slow  # an analytic sweep end to end, a few seconds
@pytest.mark.timeout(300)
def test_a_file_uri_still_records_a_sweep(tmp_path, sweep_spec, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset at teardown")  # the sweep sets it: undone after the test
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # MLflow 3 refuses a file store without it
    folder = tmp_path / "mlruns"
    data = sweep_spec("filestore", tracking_uri=f"file://{folder}", budget={"n_trials": 3})
    assert main(["sweep", str(write_spec(tmp_path / "spec.yaml", data)), "--quiet"]) == 0
    client = MlflowClient(f"file://{folder}")
    experiment = client.get_experiment_by_name("filestore")
    assert experiment is not None and (folder / ".trash").is_dir()
    runs = client.search_runs([experiment.experiment_id])
    assert any(r.data.tags.get("mlflow.runName") for r in runs) and len(runs) >= 2, len(runs)
    assert not os.path.exists(tmp_path / "mlfow.db")
