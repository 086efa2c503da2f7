"""Render the Ray-on-Slurm sbatch script for a sweep spec, and submit it with sbatch.

Every value that reaches the script is validated here (pydantic) and then either checked against a strict
pattern (`#SBATCH` lines, which sbatch parses itself) or shell-quoted with shlex.quote (the script body).
Submission runs `sbatch` with an argv list; nothing goes through a shell. The template is package data
(orchestrator/templates/ray-sweep.sbatch.j2), read through importlib.resources so that an installed wheel
renders it as a source checkout does.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Literal, Mapping

import jinja2
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from search_spaces.bounded import read_yaml
from search_spaces.errors import SpecError
from search_spaces.pydantic_line import one_line

TEMPLATE = "ray-sweep.sbatch.j2"  # in the package's templates/ folder

# `#SBATCH` values are parsed by sbatch, not a shell: allow only plain tokens.
_DIRECTIVE_VALUE = re.compile(r"^[A-Za-z0-9._:,/@%+=\-\[\]]+$")
_EXTRA_SBATCH = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9._:,/@%+=\-\[\]]+)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A value the template names but the renderer does not give is an error, never an empty string. Bash's
# `${#ARRAY[@]}` opens Jinja's default comment `{#`, so comments take a delimiter bash never writes.
_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
                            comment_start_string="{##", comment_end_string="##}")


class SlurmSettings(BaseModel):
    """What a site adapts. Also readable from a YAML file (`--site FILE`)."""

    model_config = ConfigDict(extra="forbid")

    job_name: str = "moe-autotune"
    nodes: int = Field(1, ge=1, le=4096)
    gpus_per_node: int = Field(8, ge=0, le=64)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = Field(None, description="sbatch --time, e.g. 04:00:00")
    cpus_per_task: int | None = Field(None, ge=1, le=4096)
    mem: str | None = Field(None, description="sbatch --mem, e.g. 0 (whole node) or 200G")
    exclusive: bool = False
    constraint: str | None = None
    output: str = "runs/slurm/%x-%j.out"
    extra_sbatch: list[str] = Field(default_factory=list, description="more directives, e.g. --reservation=x")
    container_image: str = ""
    container_mounts: str = ""
    venv: str = Field("", description="venv directory (its bin/activate is sourced); '' = PATH as is")
    workdir: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    gpu_mode: Literal["gpus", "fake"] = "gpus"
    ray_port_base: int | None = Field(None, ge=1024, le=65000)
    object_store_mb: int = Field(512, ge=64)
    ray_up_timeout_s: int = Field(180, ge=5)

    @field_validator("job_name", "partition", "account", "qos", "time", "mem", "constraint", "output")
    @classmethod
    def _directive_value(cls, value: str | None) -> str | None:
        if value is not None and not _DIRECTIVE_VALUE.match(value):
            raise ValueError(f"{value!r} has characters not allowed in an #SBATCH line")
        return value

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _EXTRA_SBATCH.match(item):
                raise ValueError(f"{item!r} is not of the form --option or --option=value")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if "\n" in str(val) or "\0" in str(val):
                raise ValueError(f"the value of {key} has a newline")
        return {k: str(v) for k, v in value.items()}

    @field_validator("container_image", "container_mounts", "venv", "workdir")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\n" in value or "\0" in value:
            raise ValueError("has a newline")
        return value


def load_settings(site_file: str | Path | None = None, **overrides) -> SlurmSettings:
    """Site YAML (optional) + command-line overrides (None = not given); SpecError names a bad field."""
    data: dict = {}
    if site_file:
        path = Path(site_file)
        data = read_yaml(path, "site file") or {}  # search_spaces.bounded: size, nesting, digits, keys once
        if not isinstance(data, dict):
            raise SpecError(f"site file {path}: top level must be a mapping of settings")
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "env":
            data["env"] = {**dict(data.get("env") or {}), **value}
        elif key == "extra_sbatch":
            data["extra_sbatch"] = [*list(data.get("extra_sbatch") or []), *value]
        else:
            data[key] = value
    try:
        return SlurmSettings.model_validate(data)
    except ValidationError as exc:
        raise SpecError(one_line(exc, SlurmSettings, noun="slurm setting", whole="slurm settings")) from None


def parse_env_pairs(pairs: list[str] | None) -> dict[str, str] | None:
    """`KEY=VALUE` items from the command line."""
    if not pairs:
        return None
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SpecError(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def default_venv() -> str:
    """The venv running this command, if any: the job uses the same installation."""
    return sys.prefix if sys.prefix != sys.base_prefix else ""


def sweep_argv(spec_path: str | Path, **options) -> list[str]:
    """`moe-autotune sweep SPEC [options]`; the script appends --ray-address."""
    argv = ["moe-autotune", "sweep", str(Path(spec_path).resolve())]
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def link_argv(spec_path: str | Path, study_name: str | None = None, storage: str | None = None) -> list[str]:
    argv = ["moe-autotune", "slurm", "link-run", str(Path(spec_path).resolve())]
    if study_name:
        argv += ["--study-name", study_name]
    if storage:
        argv += ["--storage", storage]
    return argv


def ray_check_argv(nodes: int) -> list[str]:
    """A tiny Ray job instead of a sweep: one task per node, to prove the cluster works."""
    return ["moe-autotune", "slurm", "ray-check", "--nodes", str(nodes)]


def _directives(s: SlurmSettings) -> list[str]:
    lines = [f"--job-name={s.job_name}", f"--nodes={s.nodes}", "--ntasks-per-node=1", f"--output={s.output}"]
    if s.gpus_per_node:
        lines.append(f"--gpus-per-node={s.gpus_per_node}")
    for name in ("partition", "account", "qos", "time", "cpus_per_task", "mem", "constraint"):
        value = getattr(s, name)
        if value is not None:
            lines.append(f"--{name.replace('_', '-')}={value}")
    if s.exclusive:
        lines.append("--exclusive")
    lines += s.extra_sbatch
    return ["#SBATCH " + line for line in lines]


def template_text(name: str = TEMPLATE) -> str:
    """A template shipped inside the package (a wheel's site-packages or the source tree alike)."""
    return resources.files("orchestrator").joinpath("templates", name).read_text(encoding="utf-8")


def render(settings: SlurmSettings, driver: list[str], link: list[str] | None = None,
           template: str = TEMPLATE) -> str:
    """The batch script text. `driver` and `link` are argv lists (quoted here); `template` names a file of
    the package's templates/ folder."""
    venv_activate = ""
    if settings.venv:
        venv = Path(settings.venv)
        venv_activate = str(venv if venv.name == "activate" else venv / "bin" / "activate")
    env_lines = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in settings.env.items())
    values = {
        "sbatch_directives": "\n".join(_directives(settings)),
        "workdir": shlex.quote(settings.workdir or os.getcwd()),
        "venv_activate": shlex.quote(venv_activate),
        "container_image": shlex.quote(settings.container_image),
        "container_mounts": shlex.quote(settings.container_mounts),
        "gpus_per_node": shlex.quote(str(settings.gpus_per_node)),
        "gpu_mode": shlex.quote(settings.gpu_mode),
        "ray_port_base": shlex.quote("" if settings.ray_port_base is None else str(settings.ray_port_base)),
        "object_store_bytes": str(settings.object_store_mb * 1024 * 1024),
        "ray_up_timeout_s": str(settings.ray_up_timeout_s),
        "extra_env": env_lines or "# (no extra environment)",
        "driver_argv": " ".join(shlex.quote(a) for a in driver),
        "link_argv": " ".join(shlex.quote(a) for a in (link or [])),
    }
    return _JINJA.from_string(template_text(template)).render(values)


def submit(script: str, workdir: str | Path, job_name: str = "moe-autotune", wait: bool = False,
           sbatch: str = "sbatch") -> tuple[str, Path, int]:
    """Write the script under WORKDIR/runs/slurm/ and sbatch it.

    Returns (job id, script path, exit code): with wait, sbatch blocks until the job ends and the exit code
    is the job's; otherwise 0.
    """
    exe = shutil.which(sbatch)
    if exe is None:
        raise SpecError("sbatch not found on PATH: run this on a Slurm login node")
    from orchestrator.errors import OutputError
    from orchestrator.userio import write_text

    jobs_dir = Path(workdir) / "runs" / "slurm"
    try:
        jobs_dir.mkdir(parents=True, exist_ok=True)  # sbatch does not create the --output directory
    except OSError as exc:
        raise OutputError(f"cannot make the job folder {str(jobs_dir)!r}: {exc.strerror or exc}") from None
    path = jobs_dir / f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sbatch"
    write_text(path, "batch script", script)  # whole or not at all (a full device is one line, exit 6)
    argv = [exe, "--parsable", *(["--wait"] if wait else []), str(path)]
    proc = subprocess.run(argv, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    job_id = first.split(";")[0]  # --parsable prints "id" or "id;cluster"
    if not job_id.isdigit():
        path.unlink(missing_ok=True)  # no job runs it: a refused submission leaves no script behind
        last = (proc.stderr or proc.stdout).strip().splitlines()
        raise SpecError(f"sbatch failed: {last[-1] if last else f'exit code {proc.returncode}'}")
    return job_id, path, proc.returncode if wait else 0


def job_tags(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """MLflow tags linking a run to the Slurm job and the Ray cluster it ran on (empty outside Slurm)."""
    env = os.environ if env is None else env
    tags = {}
    job_id = env.get("MOE_AUTOTUNE_SLURM_JOB_ID") or env.get("SLURM_JOB_ID")
    if job_id:
        tags["slurm_job_id"] = job_id
        if env.get("SLURM_JOB_NODELIST"):
            tags["slurm_nodelist"] = env["SLURM_JOB_NODELIST"]
    ray_address = env.get("MOE_AUTOTUNE_RAY_ADDRESS")
    if ray_address:
        tags["ray_address"] = ray_address
    return tags
