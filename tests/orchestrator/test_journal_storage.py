"""Optuna's journal file as the study's storage (`journal:///path`, orchestrator/storage/journal.py): a sweep stores
on it
what it stores on SQLite, every command reads it, and it keeps the SQLite store's guarantees: a torn last line (a
crash or a full disk mid-append) is cut before a sweep appends, a full disk is one line and a resume finishes, and a
file that is not a journal is one line and left as it was."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.commands.cli import main
from orchestrator.outputs.check import check
from orchestrator.records import queries
from orchestrator.storage import journal, studies
from tests.sweep_helpers import TO_THE_END, spec_data, write_spec

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")


def _sweep(tmp_path: Path, storage: str, name: str = "journal", **extra) -> tuple[dict, Path]:
    data = spec_data(tmp_path, name, storage=storage, **extra)
    return data, write_spec(tmp_path / f"{name}-{abs(hash(storage)) % 10000}.json", data)


def _stored(storage: str, name: str) -> list[tuple]:
    """What a study holds of each trial, storage aside (the MLflow run ids differ between two sweeps)."""
    study = studies.load_study(storage, name)
    return [(t.number, t.state, t.values, t.params,
             {k: v for k, v in t.user_attrs.items() if k != "mlflow_run_id"}) for t in study.trials]


def _consistent(storage: str, name: str) -> optuna.Study:
    study, problems = check(storage, name)
    assert problems == [], problems
    return study


def test_a_sweep_on_a_journal_stores_what_it_stores_on_sqlite(tmp_path, capsys):
    (tmp_path / "j").mkdir()
    (tmp_path / "s").mkdir()
    journal_url = f"journal:///{tmp_path / 'j' / 'optuna.journal'}"
    _, on_journal = _sweep(tmp_path / "j", journal_url)
    _, on_sqlite = _sweep(tmp_path / "s", f"sqlite:///{tmp_path / 's' / 'optuna.db'}")
    assert main(["sweep", str(on_journal), "--quiet"]) == 0, capsys.readouterr().err
    assert main(["sweep", str(on_sqlite), "--quiet"]) == 0, capsys.readouterr().err
    stored = _stored(journal_url, "journal")
    assert len(stored) == 6
    assert stored == _stored(f"sqlite:///{tmp_path / 's' / 'optuna.db'}", "journal")
    _consistent(journal_url, "journal")
    capsys.readouterr()
    assert main(["status", "journal", "--storage", journal_url]) == 0
    assert "(6 count against n_trials)" in capsys.readouterr().out
    assert main(["export", "journal", "--storage", journal_url, "--allow-estimated"]) == 0, capsys.readouterr().err


def test_a_torn_last_line_is_cut_before_a_resume_appends_and_every_trial_stays_readable(tmp_path, capsys):
    path = tmp_path / "optuna.journal"
    url = f"journal:///{path}"
    data, spec = _sweep(tmp_path, url, budget={"n_trials": 4})
    assert main(["sweep", str(spec), "--quiet"]) == 0, capsys.readouterr().err
    whole = path.read_bytes()
    last = whole[:-1].rsplit(b"\n", 1)[1]
    torn = last[:len(last) // 2]  # a crash in the middle of an append
    path.write_bytes(whole + torn)
    assert len(_stored(url, "journal")) == 4  # a reader reads what is whole
    assert path.read_bytes() == whole + torn  # and changes nothing
    data["budget"] = {"n_trials": 7}
    write_spec(spec, data)
    assert main(["sweep", str(spec), "--quiet", "--resume"]) == 0, capsys.readouterr().err
    after = path.read_bytes()
    assert after.startswith(whole) and after.endswith(b"\n")
    assert all(json.loads(line)["op_code"] >= 0 for line in after.splitlines())  # no line glued onto the torn one
    study = _consistent(url, "journal")
    assert [t.number for t in study.trials] == list(range(7))  # the trials after the cut are not lost behind it


@pytest.mark.parametrize(("content", "cut"), [
    (b"", 0), (b'{"op_code":0}\n', 0), (b'{"op_code":0}\n{"op_co', 7), (b'{"op_co', 7),
    (b'{"op_code":0}\n' + b"x" * 70000, 70000), (b"y" * 70000 + b"\n" + b"z" * 5, 5)])
def test_cut_torn_tail_keeps_every_whole_line(tmp_path, content, cut):
    path = tmp_path / "optuna.journal"
    path.write_bytes(content)
    assert journal.cut_torn_tail(path) == cut
    assert path.read_bytes() == content[:len(content) - cut]
    assert not Path(f"{path}.lock").exists()  # the lock is let go


# four CLI runs an example: an eighth of the profile's examples (10 in the fast lane, 37 in the full suite)
@settings(max_examples=max(10, settings.default.max_examples // 8), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(min_size=1, max_size=300).filter(
    lambda b: not (journal.JOURNAL_START.startswith(b[:11]) or b.startswith(journal.JOURNAL_START))))
def test_a_file_that_is_not_a_journal_is_one_line_for_every_command_and_left_as_it_was(tmp_path, junk):
    path = tmp_path / "not-a.journal"
    path.write_bytes(junk)
    url = f"journal:///{path}"
    data, spec = _sweep(tmp_path, url)
    for argv in (["status", "journal", "--storage", url], ["check", "journal", "--storage", url],
                 ["sweep", str(spec), "--quiet", "--resume"], ["sweep", str(spec), "--quiet"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, code, err.getvalue())
        assert "journal" in lines[0], lines[0]
        assert path.read_bytes() == junk, argv
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["not-a.journal", spec.name]), argv


def test_a_journal_url_of_another_form_and_a_missing_journal_are_one_line(tmp_path, capsys):
    for url, words in ((f"journal:{tmp_path}/x.journal", "no journal URL"),
                       (f"journal:///{tmp_path / 'missing.journal'}", "does not exist")):
        assert main(["status", "--storage", url]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and words in err and "\n" not in err, err
    assert sorted(tmp_path.iterdir()) == []


# ---- a full disk mid-sweep --------------------------------------------------------------------------------------
@ROOT_ONLY
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_full_disk_mid_sweep_is_exit_4_and_the_resume_cuts_the_torn_line_and_finishes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    try:
        url = f"journal:///{disk / 'optuna.journal'}"
        data, spec = _sweep(tmp_path, url, gpus_per_node=8, seq_len=512, budget={"n_trials": 60, **TO_THE_END},
                            free=["tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "recompute"])
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (1024 * 1024 - 96 * 1024))  # room for some dozens of trials
        cli = [sys.executable, "-m", "orchestrator.commands.cli", "sweep", str(spec), "--quiet"]
        full = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert full.returncode == 4, full.stderr[-3000:]
        lines = full.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: the Optuna storage's disk is full: tmpfs"), lines
        stored = len(studies.load_study(url, "journal").trials)
        assert 0 < stored < 60
        filler.unlink()
        again = subprocess.run([*cli, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        study = _consistent(url, "journal")
        assert len(queries.measured_trials(study)) == 60
        assert (disk / "optuna.journal").read_bytes().endswith(b"\n")
    finally:
        subprocess.run(["umount", "--lazy", str(disk)])


def test_the_default_journal_missing_beside_an_older_sqlite_storage_names_it(tmp_path, capsys, monkeypatch):
    """Sweeps of an earlier version stored into optuna.db, the default then: a read-only command on the default
    journal says where they are."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "optuna.db").write_bytes(b"")
    assert main(["status"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no Optuna storage at journal:///optuna.journal") and "\n" not in err, err
    assert "pass --storage sqlite:///optuna.db" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["optuna.db"]


# ---- a driver killed mid-sweep, again and again -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_on_a_journal_sigkilled_again_and_again_resumes_to_a_whole_consistent_study(tmp_path):
    """SIGKILL lands anywhere, an append included: every resume cuts what was torn, and the study ends whole."""
    url = f"journal:///{tmp_path / 'optuna.journal'}"
    data, spec = _sweep(tmp_path, url, gpus_per_node=8, seq_len=512, budget={"n_trials": 120, **TO_THE_END},
                        free=["tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "recompute"])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cli = [sys.executable, "-m", "orchestrator.commands.cli", "sweep", str(spec), "--quiet"]
    stored = []
    for round_ in range(3):
        proc = subprocess.Popen([*cli, *(["--resume"] if round_ else [])], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        journal_file = tmp_path / "optuna.journal"
        deadline = time.monotonic() + 120
        start = journal_file.stat().st_size if journal_file.exists() else 0
        # killed once it has stored a few trials more than the last round left
        while time.monotonic() < deadline and proc.poll() is None and (
                not journal_file.exists() or journal_file.stat().st_size < start + 20_000 * (round_ + 1)):
            time.sleep(0.02)
        proc.kill()
        proc.wait(timeout=30)
        stored.append(len(studies.load_study(url, "journal").trials))
    assert stored == sorted(stored) and stored[-1] < 120, stored  # killed mid-sweep each time, nothing lost
    done = subprocess.run([*cli, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    study = _consistent(url, "journal")
    assert len(queries.measured_trials(study)) == 120
    assert (tmp_path / "optuna.journal").read_bytes().endswith(b"\n")


# a path from pieces that make the file system's refusals: folders' names, NUL bytes, overlong names, non-ASCII
_PIECES = st.sampled_from(["a", "/", ".", "..", "\x00", "é", ":", "?", "x" * 100, "y" * 300])


@settings(max_examples=max(10, settings.default.max_examples // 8), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scheme=st.sampled_from(["journal:///", "sqlite:///"]), raw=st.lists(_PIECES, max_size=40).map("".join))
def test_any_store_path_is_read_or_one_line_and_creates_nothing(tmp_path, monkeypatch, scheme, raw):
    """Every path a storage URL can name, for a reader and for a sweep that resumes (so must find it): exit 2 and one
    line (nothing there, or no file can have that path), never a traceback; nothing is created."""
    work = tmp_path / "w"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    url = scheme + raw
    data, spec = _sweep(tmp_path, url, tracking_uri="none", workdir=str(work / "runs"))
    for argv in (["status", "--storage", url], ["sweep", str(spec), "--quiet", "--resume"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, code, err.getvalue())
        assert list(work.iterdir()) == [], (argv, list(work.iterdir()))
