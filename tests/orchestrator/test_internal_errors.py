"""The CLI's last line of defence (issue 34): an exception nobody expected is one line
`error: internal error: <kind>; details in <log file>`, exit 70, and the traceback in a log file (in the run's
folder when there is one); `--debug` shows the traceback instead; a log that cannot be written is said so.

The faults are injected (a function of the command made to raise): a real bug would be fixed, and the suite
re-raises internal errors everywhere else (MOE_AUTOTUNE_INTERNAL_ERRORS=raise, tests/conftest.py), so these tests
unset that first.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.commands import crashlog
from orchestrator.commands.cli import main
from tests.sweep_helpers import spec_data, write_spec

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "PW-crash-34"
pytestmark = pytest.mark.internal_error_expected


@pytest.fixture(autouse=True)
def _report_internal_errors(monkeypatch, tmp_path):
    """As a user runs the CLI: internal errors reported, not raised; logs in this test's own state folder."""
    monkeypatch.delenv(crashlog.RAISE_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(crashlog, "_run_folder", None)


def _bug(*_args, **_kwargs):
    # a KeyError, as a bug would raise it, whose message carries a credential
    return {}[f"postgresql://optuna:{PASSWORD}@db.example.com/optuna"]


def _line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def _log_of(line: str) -> Path:
    assert line.startswith("error: internal error: KeyError; details in "), line
    return Path(line.split("details in ", 1)[1])


@pytest.mark.timeout(120)
def test_an_unexpected_exception_is_one_line_exit_70_and_a_private_log_without_secrets(tmp_path, capsys,
                                                                                       monkeypatch):
    from orchestrator.records import queries

    monkeypatch.setattr(queries, "leaderboard", _bug)
    data = spec_data(tmp_path, "crash", tracking_uri="none")
    assert main(["sweep", str(write_spec(tmp_path / "s.json", data)), "--quiet"]) == 0
    capsys.readouterr()
    code = main(["status", "crash", "--storage", f"sqlite:///{tmp_path / 'optuna.db'}"])
    line = _line(capsys)
    assert code == crashlog.INTERNAL_ERROR_EXIT == 70
    log = _log_of(line)
    assert log.parent == tmp_path / "state" / "moe-autotune" / "logs"
    text = log.read_text()
    assert "Traceback" in text and "KeyError" in text and "leaderboard" in text and "status crash" in text
    assert "postgresql://***@db.example.com/optuna" in text
    assert PASSWORD not in text and PASSWORD not in line
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


@pytest.mark.timeout(120)
def test_a_sweeps_internal_error_is_logged_in_its_own_folder(tmp_path, capsys, monkeypatch):
    import orchestrator.sweep

    monkeypatch.setattr(orchestrator.sweep, "run_sweep", _bug)
    data = spec_data(tmp_path, "crash", tracking_uri="none")
    capsys.readouterr()
    assert main(["sweep", str(write_spec(tmp_path / "s.json", data)), "--quiet"]) == 70
    log = _log_of(_line(capsys))
    assert log.parent == tmp_path / "runs" / "crash"


@pytest.mark.timeout(120)
def test_debug_shows_the_traceback_instead(tmp_path, monkeypatch):
    from orchestrator.storage import studies

    monkeypatch.setattr(studies, "load_study", _bug)
    with pytest.raises(KeyError):
        main(["--debug", "status", "--storage", f"sqlite:///{tmp_path / 'optuna.db'}"])


@pytest.mark.timeout(120)
def test_a_log_that_cannot_be_written_is_said_in_the_line(tmp_path, capsys, monkeypatch):
    from orchestrator.storage import studies

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the log folders would go")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocked))
    monkeypatch.setattr(tempfile, "tempdir", str(blocked))
    monkeypatch.setattr(studies, "load_study", _bug)
    capsys.readouterr()
    assert main(["status", "--storage", f"sqlite:///{tmp_path / 'optuna.db'}"]) == 70
    line = _line(capsys)
    assert line.startswith("error: internal error: KeyError; the details could not be written ("), line
    assert line.endswith("rerun with --debug to see them"), line


@pytest.mark.timeout(300)
def test_the_installed_entry_point_reports_and_the_suite_setting_raises(tmp_path):
    """Through a real process: one line and exit 70 as a user sees it; with the suite's setting, the exception."""
    program = ("import sys\n"
               "import orchestrator.commands.sweep as sweep\n"
               "sweep._check_names = lambda spec: {}['a key nobody set']\n"
               "from orchestrator.commands.cli import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    spec = write_spec(tmp_path / "s.json", spec_data(tmp_path, "crash", tracking_uri="none"))
    env = {k: v for k, v in os.environ.items() if k != crashlog.RAISE_ENV}
    env.update(PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(tmp_path / "state"))
    user = subprocess.run([sys.executable, "-c", program, "sweep", str(spec)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert user.returncode == 70 and user.stdout == "", user.stderr[-2000:]
    assert _log_of(user.stderr.strip()).is_file()
    suite = subprocess.run([sys.executable, "-c", program, "sweep", str(spec)],
                           env={**env, crashlog.RAISE_ENV: "raise"}, capture_output=True, text=True, timeout=240)
    assert suite.returncode == 1 and "Traceback" in suite.stderr and "KeyError" in suite.stderr
    assert crashlog.LINE_PREFIX not in suite.stderr
