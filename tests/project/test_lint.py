"""The linters CI runs (.ci/run), configured in pyproject.toml: ruff's rules ([tool.ruff]) and the type check
([tool.mypy]) both pass over the repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ruff() -> str:
    """The venv's ruff, beside this interpreter (the dev extra installs it), else one on PATH."""
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return found


def _check(argv: list[str], timeout: int) -> None:
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}"


def test_ruff_is_clean():
    _check([_ruff(), "check", "--no-cache", "--output-format", "concise", "."], timeout=120)


@pytest.mark.slow  # a cold type check of the packages takes a minute or more
@pytest.mark.timeout(900)
def test_mypy_is_clean(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[dev]')")
    # a cache of its own: xdist workers and a developer's run do not share one. It starts from a copy of the
    # repository's cache where one is (CI's own `mypy` run leaves it): incremental mypy rechecks every module that
    # changed since and those that depend on it, the verdict of a cold run in seconds instead of a minute
    cache = tmp_path / "mypy_cache"
    if (REPO / ".mypy_cache").is_dir():
        shutil.copytree(REPO / ".mypy_cache", cache)
    _check([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], timeout=800)


def test_no_module_is_exempt_from_the_type_check():
    """The baseline that hid 280 errors in 67 modules is gone; an `ignore_errors` override would bring one back."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert not config.get("ignore_errors")
    exempt = [o["module"] for o in config.get("overrides", []) if o.get("ignore_errors")]
    assert exempt == []
    # only third-party packages may lack types; our own are all checked
    ours = ("search_spaces", "orchestrator", "trainers", "bench")
    untyped = [m for o in config.get("overrides", []) for m in o.get("module", []) if m.split(".")[0] in ours]
    assert untyped == []


# ---- sizes a reader can hold (issue 54) -------------------------------------------------------------------------
MAX_ORCHESTRATOR_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
PACKAGES = ("orchestrator", "search_spaces", "trainers", "slurm")


def long_functions(source: str, limit: int) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of each function or method of `source` longer than `limit` lines, its decorators
    left out and its docstring counted."""
    import ast

    return [(node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (node.end_lineno or node.lineno) - node.lineno + 1 > limit]


def test_the_size_check_sees_what_it_judges():
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    assert long_functions(f"def f():\n{body}\n\ndef g():\n    pass\n", 3) == [("f", 1, 4)]
    method = "\n".join("    " + line for line in f"def m(self):\n{body}".splitlines())
    assert long_functions(f"class C:\n{method}\n", 3) == [("m", 2, 4)]  # a method counts as a function
    assert long_functions(f"class C:\n{method}\n", 4) == []


def test_no_orchestrator_module_over_400_lines_and_no_function_over_60():
    """A newcomer reads a module of the orchestrator and a function anywhere in one sitting (issue 54)."""
    big = sorted(f"{p.relative_to(REPO)}: {n} lines" for p in (REPO / "orchestrator").rglob("*.py")
                 if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_ORCHESTRATOR_MODULE_LINES)
    assert big == [], big
    long = sorted(f"{p.relative_to(REPO)}:{line} {name}: {n} lines" for package in PACKAGES
                  for p in (REPO / package).rglob("*.py")
                  for name, line, n in long_functions(p.read_text(encoding="utf-8"), MAX_FUNCTION_LINES))
    assert long == [], long
