"""Faults as properties over every command (issue 34): a table generated from the CLI runs each subcommand against
each fault it can meet, and asserts one answer of the documented kinds.

The commands are read from the Typer app (every command and subcommand, hidden ones too), so a new command is in
the table at once: `test_every_command_is_in_the_table` fails until it has a row in COMMANDS (its argv against a
finished sweep) or in NOT_RUN (a reason). Which faults a command meets follows from its options:

- every command: standard output onto a full device (ENOSPC) or a pipe whose reader has gone (EPIPE);
- a `--storage` option: the Optuna store missing, corrupted, truncated, read-only (immutable, as root), locked by
  another process, or a PostgreSQL endpoint that accepts and never answers; and the same study in a journal file
  (`journal:///`, orchestrator/storage/journal.py) missing, corrupted, truncated or read-only (a truncated journal
  ends in
  a torn line, as a crash leaves it: readers read its whole lines, a sweep cuts the torn one and resumes; its lock
  is held only for one append, and Optuna breaks a stale one after 30 s);
- a `--tracking-uri` option: the same for the MLflow store, and an MLflow server that never answers;
- an `--out` or `--csv` option: that output onto a full device (/dev/full).

For every (command, fault): no traceback and no internal error (exit 70); exit 0, or exactly one `error:` line and
an exit code the README documents for it (2: input or a store that cannot be used; 4: the storage failed mid-sweep;
6: an output could not be written); nothing half-written (no temporary file anywhere); a store that was unusable
is as it was (a missing one is not created, a corrupted one not rewritten); and once the fault is lifted the
stores open and `check` is clean. Exit 0 is an answer only where the command cannot have met the fault: nothing
was written to the failing standard output, or the store is one the command passes along without opening
(`slurm render`), creates (`sweep` on a missing store), or only reads (read-only, locked).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

import optuna
import pytest
import typer

from orchestrator.commands.cli import app, main
from orchestrator.storage import connections, studies
from tests.network_faults import SilentServer
from tests.sweep_helpers import spec_data, write_spec

STUDY = "faults-9b2e"
TABLE = str(Path(__file__).resolve().parents[1] / "data" / "replay_small.csv")  # measurements calibrate can fit
PASSWORD = "PW-table-34"
DOCUMENTED_EXITS = {2, 3, 4, 5, 6}
IS_ROOT = os.geteuid() == 0


def cli_commands() -> list[str]:
    """Every command of the CLI, by the words that run it (`status`, `slurm render`), hidden ones too."""
    found: list[str] = []

    def walk(command, words: tuple[str, ...]) -> None:
        children = getattr(command, "commands", None)
        if children is None:
            found.append(" ".join(words))
            return
        for name, child in children.items():
            walk(child, (*words, name))

    walk(typer.main.get_command(app), ())
    return found


def options_of(command: str) -> set[str]:
    node = typer.main.get_command(app)
    for word in command.split():
        node = node.commands[word]
    return {opt for param in node.params for opt in param.opts}


# ---- the table: each command's argv against a finished sweep ---------------------------------------------------
ESTIMATE = ["--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "1024"]
COMMANDS: dict[str, Callable[[dict], list[str]]] = {
    "estimate": lambda w: ["estimate", *ESTIMATE],
    "space": lambda w: ["space", *ESTIMATE, "--top", "2"],
    "sweep": lambda w: ["sweep", w["spec"], "--resume", "--n-trials", "4", "--quiet", "--storage", w["storage"],
                        "--tracking-uri", w["tracking"]],
    "status": lambda w: ["status", STUDY, "--storage", w["storage"]],
    "promote": lambda w: ["promote", STUDY, "--storage", w["storage"], "--tracking-uri", w["tracking"],
                          "--allow-estimated"],
    "export": lambda w: ["export", STUDY, "--storage", w["storage"], "--allow-estimated"],
    "report": lambda w: ["report", STUDY, "--storage", w["storage"], "--tracking-uri", w["tracking"],
                         "--out", w["out"]],
    "check": lambda w: ["check", STUDY, "--storage", w["storage"], "--tracking-uri", w["tracking"]],
    "confirm": lambda w: ["confirm", STUDY, "--storage", w["storage"], "--tracking-uri", w["tracking"], "--quiet"],
    "ui": lambda w: ["ui", STUDY, "--tracking-uri", w["tracking"], "--port", str(w["port"])],
    "dashboard": lambda w: ["dashboard", STUDY, "--storage", w["storage"], "--port", str(w["port"])],
    "calibrate": lambda w: ["calibrate", "--study", STUDY, "--storage", w["storage"], "--experiment", STUDY,
                            "--tracking-uri", w["tracking"], "--table", TABLE, "--out", w["cal"], "--no-published",
                            "--holdout", "0"],
    "slurm render": lambda w: ["slurm", "render", w["spec"], "--storage", w["storage"],
                               "--tracking-uri", w["tracking"]],
    "slurm submit": lambda w: ["slurm", "submit", w["spec"], "--storage", w["storage"],
                               "--tracking-uri", w["tracking"], "--workdir", w["root"]],
    "slurm link-run": lambda w: ["slurm", "link-run", w["spec"], "--storage", w["storage"]],
    "lengths": lambda w: ["lengths", w["documents"], "--column", "tokens", "--out", w["histogram"]],
    "model": lambda w: ["model", "tiny-moe"],
}
NOT_RUN = {
    "slurm wait-ray": "a step inside a Slurm job, against its Ray cluster (tests/slurm/test_slurm_cluster.py)",
    "slurm ray-check": "a step inside a Slurm job, against its Ray cluster (tests/slurm/test_slurm_cluster.py)",
}
# commands that take a store only to pass it along (into a batch script): they never open it
PASSES_STORES_ALONG = {"slurm render", "slurm submit"}
# commands that serve until Ctrl-C (the user's Ctrl-C comes once they say so: CtrlCOnceServing)
SERVES = {"ui", "dashboard"}
# a finished analytic sweep has no proxy-measured trial to confirm: `confirm` answers so (one line, exit 2)
REFUSES_ON_THE_WORLD = {"confirm"}

STORE_FAULTS = ("missing", "corrupted", "truncated", "read-only", "locked", "never answers")
JOURNAL_FAULTS = ("missing", "corrupted", "truncated", "read-only")
UNUSABLE = {"missing", "corrupted", "truncated", "never answers"}
UNUSABLE_JOURNAL = {"missing", "corrupted"}  # a torn last line is what a crash leaves: the journal is still whole
STORE_FILES = {"optuna": "optuna.db", "mlflow": "mlflow.db", "journal": "optuna.journal"}
STORE_KEYS = {"optuna": "storage", "mlflow": "tracking", "journal": "journal"}
STDOUT_FAULTS = ("full device", "closed pipe")


def faults_of(command: str) -> list[str]:
    options = options_of(command)
    faults = [f"stdout: {f}" for f in STDOUT_FAULTS]
    if "--storage" in options:
        faults += [f"optuna store: {f}" for f in STORE_FAULTS]
        faults += [f"journal store: {f}" for f in JOURNAL_FAULTS]
    if "--tracking-uri" in options and (command, "mlflow") not in UNUSED_STORES:
        faults += [f"mlflow store: {f}" for f in STORE_FAULTS]
    if "--out" in options or "--csv" in options:
        faults.append("output file: full device")
    return faults


# the fast lane meets every command with these two; the full suite (slow) with every fault
FAST_FAULTS = {"stdout: closed pipe", "optuna store: corrupted"}
# stores a command makes when they are missing (the documented behaviour, not a fault)
CREATES = {("sweep", "optuna"), ("sweep", "mlflow"), ("promote", "mlflow")}
# Found by this table and not fixed yet (reported on issue 34), not run: remove a row once fixed. None is open:
# the last ones (an MLflow store locked under sweep and promote, or in an immutable folder under ui) met MLflow's
# engine retry, ~100 s of WARNING paragraphs and a logged traceback before the line; mlflow_sqlite.py now refuses such
# a store first.
KNOWN_GAPS: dict[tuple[str, str], str] = {}
# Found by this table, failing now and cheap to run: strict, so the fix turns it into a failure to remove
FAILING_NOW: dict[tuple[str, str], str] = {}  # (command, fault) -> why, while a known gap is open
# a store option the row's command does not open in the form the table runs (a reason each)
UNUSED_STORES = {("export", "mlflow"): "a study's export reads the Optuna storage only; a registered version's "
                                       "export against a failing server is tests/orchestrator/test_network_bounds.py's"}


def cases() -> list:
    found = []
    for command in COMMANDS:
        for fault in faults_of(command):
            marks = [] if fault in FAST_FAULTS else [pytest.mark.slow]
            # ui on a SQLite store starts an MLflow server before it prints: minutes on a loaded machine
            if command == "ui" and fault.startswith("stdout"):
                marks = [pytest.mark.slow]
            if (command, fault) in KNOWN_GAPS:
                marks.append(pytest.mark.xfail(run=False, reason=KNOWN_GAPS[command, fault]))
            if (command, fault) in FAILING_NOW:
                marks.append(pytest.mark.xfail(strict=True, reason=FAILING_NOW[command, fault]))
            found.append(pytest.param(command, fault, id=f"{command}|{fault}", marks=marks))
    return found


# ---- the world ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished analytic sweep with both stores (SQLite); each case copies them."""
    root = tmp_path_factory.mktemp("fault-table")
    data = spec_data(root, STUDY, budget={"n_trials": 3}, seed=5)
    spec = write_spec(root / "spec.json", data)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["sweep", str(spec), "--quiet"]) == 0, err.getvalue()
    # the same study in a journal file (its MLflow runs are the same)
    optuna.copy_study(from_study_name=STUDY, from_storage=studies.open_storage(data["storage"], create=False),
                      to_storage=studies.open_storage(f"journal:///{root / 'optuna.journal'}"))
    return root


@pytest.fixture
def world(finished, tmp_path, monkeypatch) -> dict:
    root = tmp_path / "w"
    root.mkdir()
    for name in ("optuna.db", "mlflow.db"):
        with contextlib.closing(sqlite3.connect(finished / name)) as src, \
                contextlib.closing(sqlite3.connect(root / name)) as dst:
            src.backup(dst)  # whole, WAL included
    shutil.copyfile(finished / "optuna.journal", root / "optuna.journal")
    for folder in ("mlartifacts", "runs"):
        if (finished / folder).exists():
            shutil.copytree(finished / folder, root / folder)
    data = spec_data(root, STUDY, budget={"n_trials": 3}, seed=5)
    spec = write_spec(root / "spec.json", data)
    (root / "docs.jsonl").write_text("".join(f'{{"tokens": {n}}}\n' for n in (100, 900, 4000, 20000)))
    bin_dir = tmp_path / "bin"  # a stand-in sbatch: `slurm submit` writes its script and hands it over
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chrome")  # report: no PNGs (no browser start per case)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")  # a silent server costs seconds (the bounds lowered
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # as a user may; test_network_bounds: defaults)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    monkeypatch.setattr(connections, "SQLITE_BUSY_S", 2)  # the wait for a lock, shortened; the lock is real
    monkeypatch.chdir(root)
    return {"root": str(root), "spec": str(spec), "storage": data["storage"], "tracking": data["tracking_uri"],
            "journal": f"journal:///{root / 'optuna.journal'}",
            "out": str(root / "report-out"), "cal": str(root / "cal.json"), "path": root,
            "documents": str(root / "docs.jsonl"), "histogram": str(root / "lengths.json"), "port": _free_port()}


def _free_port() -> int:
    """A port of its own for `ui` and `dashboard` (two workers' cases serving on one port at once: "in use")."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- running one case -------------------------------------------------------------------------------------------
class FailingStdout(io.TextIOBase):
    """Standard output that fails at its first write as a full device (ENOSPC) or a closed pipe (EPIPE) does."""

    def __init__(self, error: int):
        self.error, self.tried = error, False

    def write(self, text: str) -> int:
        if not text:
            return 0
        self.tried = True
        raise (BrokenPipeError if self.error == errno.EPIPE else OSError)(self.error, os.strerror(self.error))

    def writable(self) -> bool:
        return True


class CtrlCOnceServing(io.StringIO):
    """Standard output of `ui`, which serves until Ctrl-C: the user's Ctrl-C (SIGINT) once it says it serves."""

    def write(self, text: str) -> int:
        written = super().write(text)
        if "Ctrl-C stops it" in text:
            os.kill(os.getpid(), signal.SIGINT)
        return written


def run(argv: list[str], stdout: io.TextIOBase | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO() if stdout is None else stdout, io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue() if isinstance(out, io.StringIO) else "", err.getvalue()


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and not p.name.endswith(("-wal", "-shm", "-journal"))}


def temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith((".part", ".tmp")))


def _immutable(path: Path, on: bool) -> None:
    subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True, capture_output=True)


@contextlib.contextmanager
def store_fault(w: dict, which: str, fault: str):
    """Apply `fault` to the store `which` ("optuna", "mlflow" or "journal"); yields the argv changes (the URL to
    use)."""
    key = STORE_KEYS[which]
    db = w["path"] / STORE_FILES[which]
    swap = {w["storage"]: w["journal"]} if which == "journal" else {}  # the row's command on the journal
    if fault == "missing":
        db.unlink()
        yield dict(swap)
    elif fault == "corrupted":
        db.write_bytes(b"this is not a database\n" * 200)
        yield dict(swap)
    elif fault == "truncated":
        db.write_bytes(db.read_bytes()[:len(db.read_bytes()) // 3])
        yield dict(swap)
    elif fault == "read-only":
        if not IS_ROOT:
            pytest.skip("making a file immutable needs root (chattr +i); CI runs as root")
        _immutable(db, True)
        _immutable(w["path"], True)
        try:
            yield dict(swap)
        finally:
            _immutable(w["path"], False)
            _immutable(db, False)
    elif fault == "locked":
        holder = subprocess.Popen([sys.executable, "-c", (
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n"), str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            yield dict(swap)
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
    elif fault == "never answers":
        with SilentServer() as silent:
            url = (f"postgresql://optuna:{PASSWORD}@127.0.0.1:{silent.port}/optuna" if which == "optuna"
                   else f"http://alice:{PASSWORD}@127.0.0.1:{silent.port}")
            yield {w[key]: url, "silent": silent}
    else:
        raise AssertionError(fault)


def one_line(code: int, err: str) -> str:
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert "internal error" not in err and code != 70, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"exit {code}, not one error line:\n{err[-3000:]}"
    assert code in DOCUMENTED_EXITS, (code, lines[0])
    assert PASSWORD not in lines[0], lines[0]
    return lines[0]


def assert_clean_afterwards(w: dict, storage: str | None = None) -> None:
    """The stores still open and agree: `check` exits 0 (on the Optuna store the case used: SQLite's, or the
    journal, a copy of the study that a sweep resumed on SQLite no longer matches)."""
    code, out, err = run(["check", STUDY, "--storage", storage or w["storage"], "--tracking-uri", w["tracking"]])
    assert code == 0, out + err


# ---- the properties -----------------------------------------------------------------------------------------------
def test_every_command_is_in_the_table():
    commands = set(cli_commands())
    assert {"estimate", "sweep", "status", "slurm render"} <= commands  # the walk found the app's commands
    missing = commands - set(COMMANDS) - set(NOT_RUN)
    assert not missing, f"commands without a row in the fault table: {sorted(missing)}"
    assert not (set(COMMANDS) | set(NOT_RUN)) - commands, "rows for commands the CLI no longer has"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_answers_on_the_finished_sweep(world, command):
    """The rows are meaningful: each argv runs (exit 0) where nothing fails."""
    if command == "ui":
        pytest.skip("ui serves until Ctrl-C: its clean run is tests/orchestrator/test_mlflow_ui.py's")
    code, out, err = run(COMMANDS[command](world), CtrlCOnceServing() if command in SERVES else None)
    if command in REFUSES_ON_THE_WORLD:
        one_line(code, err)
    else:
        assert code == 0, err[-3000:]
    assert temporaries(world["path"]) == []


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("command", "fault"), cases())
def test_every_command_meets_every_fault_with_one_line(world, command, fault):
    argv = COMMANDS[command](world)
    root: Path = world["path"]
    target, _, kind = fault.partition(": ")
    if target == "stdout":
        stream = FailingStdout(errno.ENOSPC if kind == "full device" else errno.EPIPE)
        code, _, err = run(argv, stream)
        if stream.tried:
            line = one_line(code, err)
            assert code == 6 and "standard output" in line, line
        elif command in REFUSES_ON_THE_WORLD:
            one_line(code, err)
        else:
            assert code == 0, err[-3000:]
    elif target == "output file":
        option = "--csv" if "--csv" in options_of(command) else "--out"
        if option in argv:
            argv = [*argv[:argv.index(option) + 1], "/dev/full", *argv[argv.index(option) + 2:]]
        else:
            argv = [*argv, option, "/dev/full"]
        code, _, err = run(argv)
        one_line(code, err)
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    else:
        which = target.split()[0]
        assert world["tracking" if which == "mlflow" else "storage"] in argv, "the row does not use this store"
        unusable = UNUSABLE_JOURNAL if which == "journal" else UNUSABLE
        before = tree(root)
        with store_fault(world, which, kind) as changes:
            silent = changes.pop("silent", None)
            faulty = [changes.get(a, a) for a in argv]
            after_fault = tree(root)
            code, out, err = run(faulty, CtrlCOnceServing() if command in SERVES else None)
            if code == 0:
                assert kind not in unusable or command in PASSES_STORES_ALONG or (
                    (command, which) in CREATES and kind == "missing"), f"exit 0 on an unusable store: {err[-2000:]}"
            elif (command, which, kind) == ("check", "journal", "truncated"):  # check's answer: what was lost
                assert code == 1 and "which the study does not have" in out, (code, out[-2000:], err[-2000:])
            else:
                one_line(code, err)
            if silent is not None and code != 0 and command not in REFUSES_ON_THE_WORLD:
                # the line names the endpoint that did not answer
                assert f"127.0.0.1:{silent.port}" in err, err
            if kind in unusable and code != 0:
                assert tree(root) == after_fault, "an unusable store was changed, or a file left behind"
        if which == "journal" and code == 0 and command == "sweep":  # it cut the torn line and resumed: still whole
            assert (root / "optuna.journal").read_bytes().endswith(b"\n")
            code, out, err = run(["check", STUDY, "--storage", world["journal"], "--tracking-uri", world["tracking"]])
            assert code == 0, out + err
            return
        if kind == "missing" and code == 0 and which != "journal":  # the command made the store (CREATES): whole
            with contextlib.closing(sqlite3.connect(root / f"{which}.db")) as made:
                assert made.execute("PRAGMA quick_check").fetchone() == ("ok",)
            assert temporaries(root) == []
            return  # this process's MLflow engine holds the made store open: the old one is not put back under it
        if kind in ("missing", "corrupted", "truncated"):  # lift the fault: the stores as they were
            db = root / STORE_FILES[which]
            for side in ("-wal", "-shm", "-journal"):  # of a store the command made meanwhile: not the old one's
                db.with_name(db.name + side).unlink(missing_ok=True)
            db.write_bytes(before[STORE_FILES[which]])
        if kind in ("read-only", "locked") and code != 0 and command != "sweep":
            assert tree(root) == before, "a refused command changed the store"
    assert temporaries(root) == []
    assert_clean_afterwards(world, world["journal"] if target == "journal store" else None)
