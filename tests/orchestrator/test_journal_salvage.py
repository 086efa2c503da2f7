"""One damaged line in the middle of a journal storage (issue 58): every reader says which file and line, and what to
do, in one line; `check --salvage NEW.journal` writes every study the journal still holds to a new journal, the
damaged line's study named, the source left as it was (orchestrator/storage/journal_salvage.py).

A real journal of three sweeps (alpha, beta, gamma, one after the other), one line of beta's damaged as a disk or an
append cut short damages it: bytes garbled in place, a line cut short with the next one glued to it, a line whose first
bytes are gone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.commands.cli import main
from orchestrator.outputs.check import check
from orchestrator.storage import journal_salvage, studies
from tests.sweep_helpers import spec_data, write_spec

NAMES = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """A journal of three finished sweeps (their MLflow store beside it)."""
    root = tmp_path_factory.mktemp("whole")
    for name in NAMES:
        data = spec_data(root, name, budget={"n_trials": 3}, storage=f"journal:///{root / 'optuna.journal'}")
        assert main(["sweep", str(write_spec(root / f"{name}.json", data)), "--quiet"]) == 0
    return root


def _copy(whole: Path, tmp_path: Path) -> Path:
    for item in whole.iterdir():  # the journal and the MLflow store its studies recorded (absolute paths)
        if item.is_file():
            shutil.copy(item, tmp_path / item.name)
    return tmp_path / "optuna.journal"


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def _beta_line(path: Path, op: int) -> int:
    """The index of the first line of operation `op` after beta's creation (beta's own: the sweeps ran in turn)."""
    ops = [json.loads(line) for line in _lines(path)]
    start = next(i for i, o in enumerate(ops) if o.get("study_name") == "beta")
    return next(i for i, o in enumerate(ops) if i > start and o["op_code"] == op)


def _damage(path: Path, index: int, how: str) -> None:
    lines = _lines(path)
    line = lines[index]
    if how == "garble":
        middle = len(line) // 2
        lines[index] = line[:middle] + b"\x00\xff#@" + line[middle + 4:]
    elif how == "glue":  # cut short, and the next append glued to it
        lines[index:index + 2] = [line[: len(line) // 2] + lines[index + 1]]
    elif how == "headless":
        lines[index] = line[30:]
    elif how == "cut":
        lines[index] = line[:40]
    path.write_bytes(b"\n".join(lines) + b"\n")


def _stored(storage: str, name: str) -> list[tuple]:
    return [(t.number, t.state, t.values, t.params, t.user_attrs) for t in studies.load_study(storage, name).trials]


def _read_error(url: str, capsys) -> str:
    capsys.readouterr()
    assert main(["status", "alpha", "--storage", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how, op, placeholder", [("garble", 8, False), ("glue", 4, True), ("headless", 5, False)])
def test_one_damaged_line_is_named_and_every_study_is_salvaged(whole, tmp_path, capsys, how, op, placeholder):
    path = _copy(whole, tmp_path)
    url, new = f"journal:///{path}", tmp_path / "salvaged.journal"
    index = _beta_line(path, op)
    _damage(path, index, how)
    damaged = path.read_bytes()
    error = _read_error(url, capsys)  # any reader: the file, the line, what to do
    assert f"is damaged at line {index + 1} of {str(path)!r}" in error, error
    assert f"--storage {url} --salvage NEW.journal" in error, error

    assert main(["check", "--storage", url, "--salvage", str(new)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith(f"line {index + 1} is damaged") and "of study 'beta'" in out[0], out
    assert ("a placeholder trial stands for it" in out[0]) == placeholder, out
    assert "2 studies whole (alpha, gamma); beta without 1 damaged line(s)" in out[-1], out
    assert path.read_bytes() == damaged  # the source is never changed

    salvaged = f"journal:///{new}"
    original = f"journal:///{whole / 'optuna.journal'}"
    for name in ("alpha", "gamma"):  # whole: as stored, and consistent with MLflow
        assert _stored(salvaged, name) == _stored(original, name)
        assert check(salvaged, name)[1] == []
    beta, before = _stored(salvaged, "beta"), _stored(original, "beta")
    assert [t[0] for t in beta] == [t[0] for t in before]  # every trial keeps its number
    assert beta[1:] == before[1:]  # the line lost was trial 0's: the others are whole


@pytest.mark.timeout(300)
def test_a_lost_creation_that_cannot_be_placed_refuses_and_writes_nothing(whole, tmp_path, capsys):
    path = _copy(whole, tmp_path)
    url, new = f"journal:///{path}", tmp_path / "salvaged.journal"
    index = next(i for i, line in enumerate(_lines(path)) if b'"study_name":"beta"' in line)
    _damage(path, index, "cut")  # beta's creation, its name cut off: every later study id would shift
    assert journal_salvage.first_damage(path).line == index + 1
    capsys.readouterr()
    assert main(["check", "--storage", url, "--salvage", str(new)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"line {index + 1} of {str(path)!r}" in err[0] and "restore the journal" in err[0], err
    assert not new.exists()


@pytest.mark.timeout(120)
def test_salvage_refuses_what_it_must_not_write_or_read(whole, tmp_path, capsys):
    path = _copy(whole, tmp_path)
    url = f"journal:///{path}"
    (tmp_path / "taken.journal").write_text("mine")
    for argv, message in [
        (["check", "--storage", url, "--salvage", str(tmp_path / "taken.journal")], "exists; name a new file"),
        (["check", "--storage", url, "--salvage", str(path)], "exists; name a new file"),
        (["check", "alpha", "--storage", url, "--salvage", str(tmp_path / "x.journal")], "give no STUDY"),
        (["check", "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--salvage", str(tmp_path / "x.journal")],
         "no journal URL"),
    ]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert (tmp_path / "taken.journal").read_text() == "mine"
    # a journal with nothing damaged is salvaged whole
    assert main(["check", "--storage", url, "--salvage", str(tmp_path / "copy.journal")]) == 0
    assert "3 studies whole (alpha, beta, gamma)" in capsys.readouterr().out
    assert (tmp_path / "copy.journal").read_bytes() == path.read_bytes()
