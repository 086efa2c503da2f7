"""The installed package is what a cluster runs: build the wheel, install it (not editable, no `[train]`) into a
clean venv, and run the user's commands from a folder outside the source tree.

On a cluster the orchestrator is installed, not cloned, so every file the package reads at run time (the Slurm
template, the model catalog, the calibration, the reference tables) must ship inside the wheel. The source is
copied before the build so that nothing stale from an earlier in-tree build can slip into the wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from orchestrator.commands.promote import EXPORT_FORMATS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "search_spaces", "trainers")
DEEPSEEK = "deepseek-v3-128k-h100x1024"
NOT_SHIPPED = {".md"}  # documentation beside the code; nothing reads it at run time


def _source_copy(dst: Path) -> Path:
    """pyproject, README and the packages as they are in the working tree (no build/, egg-info, caches)."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for package in PACKAGES:
        shutil.copytree(REPO / package, dst / package, ignore=ignore)
    return dst


def _data_files() -> list[str]:
    """Every file of the packages that is not Python source or documentation: what the code reads at run time."""
    found = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*"):
            if (path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".py", ".pyc"}
                    and path.suffix not in NOT_SHIPPED):
                found.append(path.relative_to(REPO).as_posix())
    return sorted(found)


def _checked(argv: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n" \
                                 f"stderr:\n{proc.stderr[-3000:]}"
    return proc


class Installed:
    """The wheel installed in a clean venv, and a working folder outside the source tree to run it in."""

    def __init__(self, wheel: Path, venv: Path, cwd: Path):
        self.wheel, self.venv, self.cwd = wheel, venv, cwd
        path = os.pathsep.join([str(venv / "bin"), os.environ.get("PATH", "")])
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.env.update(PATH=path, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # the sweep's own stores, as for a new user
            self.env.pop(var, None)

    def run(self, *args: str, expect: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
        """`moe-autotune ARGS` from the venv; a failure shows the command's stdout and stderr."""
        argv = [str(self.venv / "bin" / "moe-autotune"), *args]
        proc = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == expect, (
            f"`moe-autotune {' '.join(args)}` exited {proc.returncode}, expected {expect}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
        return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    src = _source_copy(root / "src")
    # the build backend of the project's venv: no download, no build isolation
    _checked([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
              str(root / "dist"), str(src)])
    (wheel,) = (root / "dist").glob("moe_autotune-*.whl")
    # a venv of the same interpreter with no site packages of its own; the project venv's pip installs into it
    base = getattr(sys, "_base_executable", sys.executable)
    _checked([base, "-m", "venv", "--without-pip", str(root / "venv")])
    _checked([sys.executable, "-m", "pip", "--python", str(root / "venv" / "bin" / "python"), "install", "-q",
              "--no-compile", str(wheel)], timeout=900)
    cwd = root / "work"
    shutil.copytree(REPO / "examples", cwd / "examples")
    return Installed(wheel, root / "venv", cwd)


@pytest.fixture(scope="module")
def swept(installed) -> Installed:
    """An analytic what-if sweep at full scale (a few trials), run by the installed package."""
    out = installed.run("sweep", f"examples/{DEEPSEEK}.yaml", "--n-trials", "12", "--quiet").stdout
    assert "best layout" in out, out
    return installed


def test_the_wheel_ships_every_file_the_package_reads(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    wanted = _data_files()
    assert "orchestrator/templates/ray-sweep.sbatch.j2" in wanted  # the template lives in the package
    assert len([n for n in wanted if n.startswith("search_spaces/catalog/models/")]) >= 10
    assert [n for n in wanted if n not in names] == []
    assert not any(n.startswith(("slurm/", "tests/", "bench/")) for n in names)


def test_the_venv_imports_the_installed_package_not_the_source(installed):
    probe = ("import orchestrator, search_spaces, trainers, sys; "
             "print('\\n'.join(m.__file__ for m in (orchestrator, search_spaces, trainers))); "
             "print(sys.flags.no_site, 'torch' in sys.modules)")
    out = _checked([str(installed.venv / "bin" / "python"), "-c", probe], cwd=installed.cwd,
                   env=installed.env).stdout.splitlines()
    site = str(installed.venv / "lib")
    assert all(line.startswith(site) for line in out[:3]), out
    # clean: the project venv's packages (torch, megatron) are not visible
    nothing = subprocess.run([str(installed.venv / "bin" / "python"), "-c", "import torch"], env=installed.env,
                             capture_output=True, text=True)
    assert nothing.returncode != 0 and "No module named 'torch'" in nothing.stderr


def test_estimate_and_space(installed):
    out = installed.run("estimate", "--model", "deepseek-v3", "--gpu", "h100", "--num-gpus", "256",
                        "--seq-len", "131072", "--tp", "1", "--cp", "32", "--ep", "32", "--pp", "8", "--vpp", "4",
                        "--gbs", "128", "--precision", "fp8", "--dispatcher", "deepep",
                        "--recompute", "mla_up_proj,layernorm,moe,mlp", "--optimizer-offload", "1.0",
                        "--cp-comm-type", "a2a+p2p", "--hierarchical-cp", "8,4", "--json").stdout
    result = json.loads(out)
    assert result["legal"] is True and result["tokens_per_sec_per_gpu"] > 0 and result["peak_memory_gib"] > 0
    # a model the package reads from its catalog, with the calibration it ships
    out = installed.run("space", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--num-gpus", "16",
                        "--seq-len", "4096", "--top", "3", "--json").stdout
    space = json.loads(out)
    assert isinstance(space, dict) and space, out[:500]
    installed.run("estimate", "--model", "no-such-model", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096",
                  expect=2)


def test_slurm_render_from_the_installed_template(installed):
    script = installed.run("slurm", "render", "examples/quickstart.yaml", "--partition", "gpu").stdout
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --job-name=quickstart" in script
    assert "ray start --head" in script and "{{" not in script
    _checked(["bash", "-n"], input=script)


def test_status_promote_and_every_export(swept):
    board = swept.cwd / "board.csv"
    out = swept.run("status", DEEPSEEK, "--csv", str(board)).stdout
    assert "best that fits" in out
    rows = board.read_text().splitlines()
    assert rows[0].startswith("trial,") and len(rows) > 1
    # analytic estimates of proxy-sized trials: promoting them is a deliberate choice, refused without the flags
    refused = swept.run("promote", DEEPSEEK, expect=2)
    assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    out = swept.run("promote", DEEPSEEK, "--allow-estimated", "--allow-proxy").stdout
    version = re.search(r"models:/([\w.-]+)@production", out)
    assert version, out
    uri = f"models:/{version.group(1)}@production"
    exported = {fmt: swept.run("export", uri, "--format", fmt).stdout for fmt in EXPORT_FORMATS}
    assert "--tensor-model-parallel-size" in exported["megatron-args"]
    assert "context_parallel_size" in yaml.safe_load(exported["bridge-yaml"])["model"]
    assert "#SBATCH --nodes=128" in exported["sbatch"]
    assert yaml.safe_load(exported["layout-yaml"])["cp"] >= 1
    _checked(["bash", "-n"], input=exported["sbatch"])


def test_report_and_check(swept):
    out = swept.run("report", DEEPSEEK, "--out", "report").stdout
    assert "report.html" in out
    html = (swept.cwd / "report" / "report.html").read_text()
    assert DEEPSEEK in html and "<html" in html.lower()
    assert "consistent" in swept.run("check", DEEPSEEK).stdout
