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
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from orchestrator.commands.promote import EXPORT_FORMATS

# one built wheel and its venvs (module fixtures) for the module's tests: they share one xdist worker
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.xdist_group("wheel")]

REPO = Path(__file__).resolve().parents[2]
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
        # a user's shell: no PYTHONPATH, and bytecode cached as Python does by default (installed --no-compile,
        # each command would otherwise compile MLflow, Ray and Optuna again: ~4 s of CPU a command)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
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


def _venv_with(wheel: Path, venv: Path) -> None:
    """A venv of the same interpreter with no site packages of its own, the wheel installed into it by the project
    venv's pip (its dependencies from the package index, as a user's pip takes them)."""
    base = getattr(sys, "_base_executable", sys.executable)
    _checked([base, "-m", "venv", "--without-pip", str(venv)])
    _checked([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
              "--no-compile", str(wheel)], timeout=900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dist")
    src = _source_copy(root / "src")
    # the build backend of the project's venv: no download, no build isolation
    _checked([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
              str(root / "dist"), str(src)])
    (built,) = (root / "dist").glob("moe_autotune-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    _venv_with(wheel, root / "venv")
    cwd = root / "work"
    shutil.copytree(REPO / "examples", cwd / "examples")
    return Installed(wheel, root / "venv", cwd)


# ---- the wheel with its [train] extra: the trainer runs from site-packages too --------------------------------
TRAIN_EXTRA = "train"


def _extra_requirements(wheel: Path, extra: str) -> list[Requirement]:
    """The wheel's own Requires-Dist lines of `extra`."""
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(name).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is not None and r.marker.evaluate({"extra": extra})
            and not r.marker.evaluate({"extra": ""})]


def _distribution_closure(requirements: list[Requirement]) -> list[metadata.Distribution]:
    """The installed distributions of this (the project's) venv that the requirements need, their own
    requirements (with the extras asked for) included; each must satisfy the version it is wanted at."""
    found: dict[str, metadata.Distribution] = {}
    extras_done: set[tuple[str, str]] = set()
    todo = [Requirement(f"{r.name}[{','.join(r.extras)}]{r.specifier}") for r in requirements]  # whatever their marker
    while todo:
        req = todo.pop()
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        dist = found.get(key) or metadata.distribution(req.name)
        assert dist.version in req.specifier, f"the project venv has {req.name} {dist.version}, the wheel wants {req}"
        found[key] = dist
        for extra in ("", *req.extras):
            if (key, extra) in extras_done:
                continue
            extras_done.add((key, extra))
            for line in dist.requires or []:
                dep = Requirement(line)
                if dep.marker is None or dep.marker.evaluate({"extra": extra}):
                    todo.append(dep)
    return list(found.values())


def _link_into(dists: list[metadata.Distribution], venv: Path) -> int:
    """Put the distributions' files (code and dist-info) into the venv's site-packages as pip laid them out in the
    project venv: hard links of the same files (a symlink across file systems), so the [train] extra's
    gigabytes of torch are neither downloaded nor copied again. Returns the number of files."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    present = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in metadata.distributions(path=[str(site)])}
    count = 0
    for dist in dists:
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower() in present:  # pip installed it for the wheel
            continue
        for rel in dist.files or []:
            src = Path(dist.locate_file(rel))
            if ".." in Path(rel).parts or not src.is_file():  # console scripts live outside site-packages
                continue
            dst = site / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                os.symlink(src, dst)
            count += 1
    return count


@pytest.fixture(scope="module")
def installed_train(wheel, tmp_path_factory) -> Installed:
    """The wheel in a clean venv plus its [train] extra (the trainer's torch and megatron-core)."""
    root = tmp_path_factory.mktemp("wheel-train")
    _venv_with(wheel, root / "venv")
    wanted = _extra_requirements(wheel, TRAIN_EXTRA)
    assert {r.name for r in wanted} >= {"torch", "megatron-core"}, wanted
    assert _link_into(_distribution_closure(wanted), root / "venv") > 1000
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
    assert len([n for n in wanted if n.startswith("search_spaces/catalog/hf_configs/")]) >= 10
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
    assert list(Path(out[0]).parent.glob("__pycache__/__init__.*.pyc")), "the import cached no bytecode"
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


# ---- every command of the README, run by the installed package --------------------------------------------------
def test_every_readme_command_runs_from_the_installed_wheel(installed_train):
    """README.md and trainers/README.md, every shell line expanded by tests/project/test_readme.py's rules, run in
    order by
    the wheel's console script (and the trainer by its interpreter) in a folder outside the source tree."""
    from tests.project.test_readme import MAPPED, REAL_TRAINER_TRIALS, commands, is_real_trainer_sweep

    venv, cwd = installed_train.venv, installed_train.cwd
    earlier_blocks, this_block, current = [], [], None
    for block, line, argv in commands():
        if block != current:
            earlier_blocks, this_block, current = earlier_blocks + this_block, [], block
        if argv in earlier_blocks or (argv[0], argv[1]) in MAPPED:  # run by the test MAPPED names
            continue
        if argv[0] == "moe-autotune":
            extra = ["--n-trials", str(REAL_TRAINER_TRIALS)] if is_real_trainer_sweep(argv, cwd) else []
            run = [str(venv / "bin" / "moe-autotune"), *argv[1:], *extra]
        else:
            assert argv[0] == "torchrun", argv  # the same launcher, as a module of the venv's interpreter
            run = [str(venv / "bin" / "python"), "-m", "torch.distributed.run", *argv[1:]]
        done = subprocess.run(run, cwd=cwd, env=installed_train.env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (f"{block.where}: {line!r} -> {run} exited {done.returncode}\n"
                                      f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")
        this_block.append(argv)
    assert (cwd / "my-cluster.json").exists() and (cwd / "report" / "report.html").exists()
    # trainers/README.md's torchrun line ran the trainer from site-packages, into a folder it had to create
    assert json.loads((cwd / "out" / "result.json").read_text())["status"] == "ok"
