"""Stores that refuse writes or fill up while being created (issue 34): one line and the README's exit code, never
a chain of StorageInternalError tracebacks; a store is made whole or not at all; a refused sweep leaves nothing.

Real faults: an immutable file (chattr +i), a read-only mount, a file another process holds locked, a tmpfs that
fills up (tests/orchestrator/test_integrity.py mounts them the same way; root only, as in CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from hypothesis import settings

from orchestrator.commands.cli import main
from orchestrator.outputs.check import check
from orchestrator.storage import connections
from tests.sweep_helpers import spec_data, write_spec

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs or chattr needs root (CI runs as root)")
# KiB left on the disk before the study's setup (the fill lands before, during or after it): the full suite tries
# four points, the fast lane (Hypothesis profile "fast") the two ends
DISK_LEFT_KIB = [8, 40, 80, 200] if settings.default.max_examples >= 300 else [8, 200]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert "Traceback" not in err and "StorageInternalError" not in err, err[-3000:]
    return lines[0]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _names(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _consistent(data: dict) -> optuna.Study:
    study, problems = check(data["storage"], data["name"])
    assert problems == [], problems
    return study


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts a tmpfs of the given size under tmp_path (root only); unmounted after the test."""
    mounted = []

    def mount(name: str, size: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "--lazy", str(path)])


def _fill(disk: Path, leave_kib: int) -> Path:
    """A file that leaves `leave_kib` KiB free on `disk`."""
    free = shutil.disk_usage(disk).free // 1024
    filler = disk / "filler"
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(0, free - leave_kib) * 1024)
    return filler


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI in a process of its own: a driver that failed exits (its study's lease is then taken over at once),
    as it does for a user; in-process, the next run would find its own pid still holding the lease."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "orchestrator.commands.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def _sweep(tmp_path: Path, name: str = "faults", **extra) -> tuple[dict, Path]:
    data = spec_data(tmp_path, name, **extra)
    return data, write_spec(tmp_path / f"{name}.json", data)


# ---- 1. a resumed sweep on a store the file system will not let it change ------------------------------------
def _immutable(path: Path) -> None:
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")


def _mutable(path: Path) -> None:
    subprocess.run(["chattr", "-i", str(path)], capture_output=True)


@ROOT_ONLY
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["immutable file", "immutable folder", "read-only mount"])
def test_a_resume_on_a_store_that_refuses_writes_is_one_line_and_changes_nothing(tmp_path, capsys, how):
    folder = tmp_path / "store"
    folder.mkdir()
    data, spec = _sweep(tmp_path, storage=f"sqlite:///{folder / 'optuna.db'}", tracking_uri="none")
    assert main(["sweep", str(spec), "--quiet"]) == 0
    seen = folder
    if how == "read-only mount":  # the same files seen through a read-only bind mount
        seen = tmp_path / "read-only"
        seen.mkdir()
        if subprocess.run(["mount", "--bind", str(folder), str(seen)]).returncode != 0:
            pytest.skip("cannot bind-mount here")
        subprocess.run(["mount", "-o", "remount,bind,ro", str(seen)], check=True)
        data, spec = _sweep(tmp_path, storage=f"sqlite:///{seen / 'optuna.db'}", tracking_uri="none")
    else:
        _immutable(folder / "optuna.db" if how == "immutable file" else folder)
    before = _tree(folder)
    try:
        capsys.readouterr()
        code = main(["sweep", str(spec), "--quiet", "--resume", "--n-trials", "9"])
        line = _one_line(capsys)
        assert code == 2, line
        assert "refuses writes" in line and "optuna.db" in line, line
        assert _tree(folder) == before, "the refused resume changed or left files in the store's folder"
    finally:
        if how == "read-only mount":
            subprocess.run(["umount", "--lazy", str(seen)])
        else:
            _mutable(folder / "optuna.db" if how == "immutable file" else folder)
    data, spec = _sweep(tmp_path, storage=f"sqlite:///{folder / 'optuna.db'}", tracking_uri="none")
    assert main(["sweep", str(spec), "--quiet", "--resume", "--n-trials", "9"]) == 0  # writable again: it goes on
    assert len(_consistent(data).trials) >= 9


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
def test_a_resume_on_a_store_another_process_holds_locked_is_one_line_after_the_wait(tmp_path, capsys,
                                                                                     monkeypatch):
    data, spec = _sweep(tmp_path, tracking_uri="none")
    assert main(["sweep", str(spec), "--quiet"]) == 0
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"), str(tmp_path / "optuna.db")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(connections, "SQLITE_BUSY_S", 2)  # the wait, shortened; the lock is real
        capsys.readouterr()
        code = main(["sweep", str(spec), "--quiet", "--resume", "--n-trials", "9"])
        line = _one_line(capsys)
        assert code == 2 and "locked by another process" in line, line
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert main(["sweep", str(spec), "--quiet", "--resume", "--n-trials", "9"]) == 0
    assert len(_consistent(data).trials) >= 9


# ---- 2. the disk fills while a store or the study is set up --------------------------------------------------
@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@ROOT_ONLY
@pytest.mark.timeout(300)
@pytest.mark.parametrize("leave_kib", DISK_LEFT_KIB)
def test_a_disk_that_fills_while_the_study_is_set_up_is_exit_4_and_the_rerun_finishes(tmp_path, tmpfs, capsys,
                                                                                      leave_kib):
    """The storage exists (an earlier sweep made it); the disk fills before, during or after the new study's setup:
    one line naming the device and what to do, exit 4; once space is freed, the rerun it names finishes."""
    disk = tmpfs("disk", "8m")
    data, spec = _sweep(tmp_path, storage=f"sqlite:///{disk / 'optuna.db'}", tracking_uri="none")
    first, first_spec = _sweep(tmp_path, "earlier", storage=data["storage"], tracking_uri="none",
                               budget={"n_trials": 1})
    assert main(["sweep", str(first_spec), "--quiet"]) == 0
    filler = _fill(disk, leave_kib)
    full = _cli("sweep", str(spec), "--quiet", cwd=tmp_path)
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 4 and len(lines) == 1, full.stderr[-3000:]
    assert lines[0].startswith("error: the Optuna storage's disk is full: tmpfs mounted at"), lines
    filler.unlink()
    again = _cli("sweep", str(spec), "--quiet", *(["--resume"] if "--resume" in lines[0] else []), cwd=tmp_path)
    assert again.returncode == 0, f"the rerun {lines[0]!r} asked for failed: {again.stderr[-3000:]}"
    assert len(_consistent(data).trials) >= 6


@ROOT_ONLY
@pytest.mark.timeout(300)
def test_a_new_storage_on_a_full_disk_leaves_nothing(tmp_path, tmpfs, capsys):
    disk = tmpfs("disk", "100k")
    data, spec = _sweep(tmp_path, storage=f"sqlite:///{disk / 'optuna.db'}", tracking_uri="none")
    capsys.readouterr()
    code = main(["sweep", str(spec), "--quiet"])
    line = _one_line(capsys)
    assert code == 4 and "nothing was stored" in line, line
    assert _names(disk) == set(), f"left behind: {_names(disk)}"


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@ROOT_ONLY
@pytest.mark.timeout(400)
@pytest.mark.parametrize("size", ["300k", "600k", "900k"])
def test_an_mlflow_store_whose_disk_fills_while_it_is_made_is_made_again_once_there_is_room(tmp_path, tmpfs,
                                                                                           capsys, monkeypatch, size):
    """Before: MLflow's migration stopped half way and every later run said `table ... already exists`."""
    monkeypatch.chdir(tmp_path)  # MLflow's artifact root (./mlruns) lands in tmp_path
    disk = tmpfs("disk", size)
    data, spec = _sweep(tmp_path, tracking_uri=f"sqlite:///{disk / 'mlflow.db'}")
    capsys.readouterr()
    code = main(["sweep", str(spec), "--quiet"])
    line = _one_line(capsys)
    assert code == 4 and line.startswith("error: the MLflow store's disk is full"), line
    assert _names(disk) == set(), f"a half-made store was left: {_names(disk)}"
    subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)  # the disk is grown
    assert main(["sweep", str(spec), "--quiet"]) == 0
    _consistent(data)
    made = (disk / "mlflow.db").stat().st_size  # the premise: the store could not have fitted while it was made
    assert made > int(size[:-1]) * 1024, (made, size)


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@ROOT_ONLY
@pytest.mark.timeout(400)
def test_an_mlflow_store_whose_disk_fills_once_it_is_made_is_one_line_and_a_resume_finishes(tmp_path, tmpfs, capsys,
                                                                                         monkeypatch):
    """The store is made, then the disk fills before the sweep's experiment is: one line naming the device (not
    MLflow's logged traceback, nor `cannot use the MLflow tracking URI`), exit 4, and `--resume` finishes."""
    from orchestrator.storage import open_mlflow

    monkeypatch.chdir(tmp_path)
    disk = tmpfs("disk", "4m")
    uri = f"sqlite:///{disk / 'mlflow.db'}"
    open_mlflow(uri, create=True)
    data, spec = _sweep(tmp_path, tracking_uri=uri)
    filler = _fill(disk, 0)
    capsys.readouterr()
    assert main(["sweep", str(spec), "--quiet"]) == 4
    line = _one_line(capsys)
    assert line.startswith("error: the MLflow store's disk is full: tmpfs mounted at") and "--resume" in line, line
    filler.unlink()
    again = _cli("sweep", str(spec), "--quiet", "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    _consistent(data)


def _half_migrated(tmp_path: Path) -> Path:
    """A store an older version left half made: MLflow's own migration (not the suite's template) on a tmpfs that
    filled, the tmpfs then grown; every later migration says `table ... already exists`. Where the migration stops
    depends on the size: the first size that leaves a store that stays broken is used."""
    import mlflow.store.db.utils as db_utils
    import sqlalchemy

    from orchestrator.storage import sqlite_tuning
    from tests import store_templates

    sqlite_tuning.install()  # WAL, as every process of ours opens SQLite
    migrate = store_templates._real_initialize or db_utils._initialize_tables

    def attempt(url: str) -> str:
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        try:
            migrate(engine)
            return "made"
        except Exception as exc:  # noqa: BLE001 -- what MLflow says is the point
            return str(exc)
        finally:
            engine.dispose()

    disk = tmp_path / "disk"
    disk.mkdir()
    for size in ("900k", "1000k", "1200k", "700k", "300k"):
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)]).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        url = f"sqlite:///{disk / 'mlflow.db'}"
        if "disk is full" in attempt(url):
            subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
            if "already exists" in attempt(url):
                return disk
        subprocess.run(["umount", "--lazy", str(disk)])
    pytest.fail("no tmpfs size left MLflow's migration half made: the premise of this test no longer holds")


@ROOT_ONLY
@pytest.mark.timeout(600)
def test_an_mlflow_store_left_half_migrated_by_an_older_version_is_made_again(tmp_path, capsys, monkeypatch):
    """A read-only command refuses it in one line; a sweep makes it again (it holds nothing) and runs."""
    monkeypatch.chdir(tmp_path)
    disk = _half_migrated(tmp_path)
    try:
        data, spec = _sweep(tmp_path, tracking_uri=f"sqlite:///{disk / 'mlflow.db'}")
        capsys.readouterr()
        assert main(["ui", "--tracking-uri", data["tracking_uri"]]) == 2
        assert "was never finished" in _one_line(capsys)
        assert main(["sweep", str(spec), "--quiet"]) == 0
        _consistent(data)
    finally:
        subprocess.run(["umount", "--lazy", str(disk)])


# ---- 3. a refused sweep leaves nothing -----------------------------------------------------------------------
REFUSALS = {
    "nothing fits": {"gpus_per_node": 1, "seq_len": 16_777_216},
    "an unknown model": {"model": "no-such-model"},
    "an MLflow URI that cannot be used": {"tracking_uri": "bogus://x"},
    "an Optuna storage server that is not there": {"storage": "postgresql://u:pw@127.0.0.1:1/optuna"},
    "a resume of nothing": {"resume": True},
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(REFUSALS), ids=list(REFUSALS))
def test_a_refused_sweep_leaves_no_store_or_folder_behind(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    extra = dict(REFUSALS[case])
    resume = extra.pop("resume", False)
    data, spec = _sweep(tmp_path, **extra)
    before = _names(tmp_path)
    capsys.readouterr()
    code = main(["sweep", str(spec), "--quiet"] + (["--resume"] if resume else []))
    line = _one_line(capsys)
    assert code == 2, line
    assert _names(tmp_path) == before, f"{case}: left {_names(tmp_path) - before}"


@ROOT_ONLY
@pytest.mark.timeout(300)
def test_a_sweep_refused_for_a_store_folder_that_refuses_writes_leaves_the_other_store_unmade(tmp_path, capsys,
                                                                                              monkeypatch):
    """Before: the MLflow store was made first, and stayed when the Optuna storage's folder was refused."""
    monkeypatch.chdir(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    data, spec = _sweep(tmp_path, storage=f"sqlite:///{locked / 'optuna.db'}")
    _immutable(locked)
    try:
        before = _names(tmp_path)
        capsys.readouterr()
        assert main(["sweep", str(spec), "--quiet"]) == 2
        assert "refuses writes" in _one_line(capsys)
        assert _names(tmp_path) == before, f"left {_names(tmp_path) - before}"
    finally:
        _mutable(locked)
