"""`moe-autotune slurm render|submit`: a sweep as a Slurm job running its own Ray cluster. A credential given in an
option never reaches the batch script: the job reads it from a file readable by its owner only
(orchestrator/commands/slurm_credentials.py).

Also the steps the batch script runs inside the job (wait-ray, ray-check, link-run; hidden from --help).
"""

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from search_spaces.errors import SpecError

from orchestrator.commands import store_options
from orchestrator.userio import echo

slurm_app = typer.Typer(help="Run a sweep on a Slurm cluster (a Ray cluster on the allocation).",
                        no_args_is_help=True)

Spec = Annotated[Path, typer.Argument(help="sweep spec YAML")]
_SITE = "Slurm site"
_SWEEP = "Sweep"


def _opt(help_: str, panel: str = _SITE, **kw):
    return typer.Option(help=help_, rich_help_panel=panel, **kw)


def _build(spec_path: Path, ray_check: bool, site: Optional[Path], sweep_options: dict, **settings) -> tuple:
    """The job's settings, driver and link command lines, and the credentials kept out of its script
    (orchestrator/commands/slurm_credentials.py); nothing is written yet."""
    from orchestrator.commands import slurm_credentials
    from orchestrator.dispatch import slurm_job
    from orchestrator.spec.schema import load_spec
    from orchestrator.storage import check_tracking_uri

    # a credential where no file can carry it (an #SBATCH value, a path): one line now, before a validator quotes it
    slurm_credentials.refuse_the_rest({"extra_sbatch" if k == "sbatch_arg" else k: v for k, v in settings.items()},
                                      [])
    slurm_credentials.refuse_in_env_names(settings.get("env"))
    spec = load_spec(spec_path, {"study_name": sweep_options.get("study_name"),
                                 "storage": sweep_options.get("storage"),
                                 "tracking_uri": sweep_options.get("tracking_uri")})
    check_tracking_uri(spec.tracking_uri, none_ok=True)  # a plain path: refused here, not in the job
    settings["env"] = slurm_job.parse_env_pairs(settings.pop("env"))
    settings["extra_sbatch"] = settings.pop("sbatch_arg") or None
    # the allocation holds one trial at a time: its size is trial_gpus (a proxy's), not the target cluster
    trial_nodes = -(-(spec.trial_gpus or spec.num_gpus) // spec.gpus_per_node)
    defaults = {"nodes": trial_nodes, "gpus_per_node": spec.gpus_per_node, "job_name": spec.name,
                "gpu_mode": "fake" if spec.gpu == "cpu" else "gpus", "venv": slurm_job.default_venv(),
                "workdir": os.getcwd()}
    merged = slurm_job.load_settings(site, **settings)
    given = merged.model_fields_set
    s = merged.model_copy(update={k: v for k, v in defaults.items() if k not in given})
    if s.nodes < trial_nodes:
        raise SpecError(f"--nodes {s.nodes} is fewer than one trial needs ({trial_nodes} nodes of "
                        f"{spec.gpus_per_node} GPUs for trial_gpus {spec.trial_gpus or spec.num_gpus})")
    # a credential in an option or the job's environment: kept out of the script (the job reads it from a file)
    options, env, kept = slurm_credentials.keep_out({} if ray_check else sweep_options, s.env)
    if ray_check:
        driver, link = slurm_job.ray_check_argv(s.nodes), []
    else:
        driver = slurm_job.sweep_argv(spec_path, **options)
        link = slurm_job.link_argv(spec_path, options.get("study_name"), options.get("storage"))
    slurm_credentials.refuse_the_rest(s.model_dump(), driver + link)  # any other: one line, nothing written
    return s.model_copy(update={"env": env}), driver, link, kept


def _script(settings, driver: list[str], link: list[str], kept, submit: bool, wait: bool) -> int:
    """Render the script (its credentials in a file beside it, mode 600) and print or submit it. When the script
    is not delivered (a refused submission, a closed standard output), its credentials file goes too."""
    from orchestrator.commands.slurm_credentials import CREDENTIALS_ENV
    from orchestrator.dispatch import slurm_job

    path = kept.write(Path(settings.workdir).absolute() / "runs" / "slurm", settings.job_name) if kept else None
    try:
        if path is not None:
            settings = settings.model_copy(update={"env": {CREDENTIALS_ENV: str(path), **settings.env}})
        script = slurm_job.render(settings, driver, link)
        if not submit:
            echo(script, nl=False)
            if path is not None:
                typer.echo(kept.note(path), err=True)
            return 0
        job_id, script_path, rc = slurm_job.submit(script, settings.workdir, settings.job_name, wait=wait)
    except BaseException:
        if path is not None:
            path.unlink(missing_ok=True)
        raise
    echo(job_id)
    typer.echo(f"submitted {script_path} as job {job_id}", err=True)
    if path is not None:
        typer.echo(kept.note(path), err=True)
    return rc


def _command(submit: bool):
    def command(
        spec: Spec,
        nodes: Annotated[Optional[int], _opt("nodes in the allocation (default: enough for trial_gpus)")] = None,
        gpus_per_node: Annotated[Optional[int], _opt("GPUs per node (default: the spec's)")] = None,
        partition: Annotated[Optional[str], _opt("sbatch --partition")] = None,
        account: Annotated[Optional[str], _opt("sbatch --account")] = None,
        qos: Annotated[Optional[str], _opt("sbatch --qos")] = None,
        time: Annotated[Optional[str], _opt("sbatch --time, e.g. 04:00:00")] = None,
        cpus_per_task: Annotated[Optional[int], _opt("CPUs per node for Ray")] = None,
        mem: Annotated[Optional[str], _opt("sbatch --mem, e.g. 0 for the whole node")] = None,
        exclusive: Annotated[Optional[bool], _opt("whole nodes")] = None,
        constraint: Annotated[Optional[str], _opt("sbatch --constraint")] = None,
        sbatch_arg: Annotated[Optional[list[str]], _opt("more #SBATCH directives (--option=value)")] = None,
        container_image: Annotated[Optional[str], _opt("pyxis/enroot image for every step")] = None,
        container_mounts: Annotated[Optional[str], _opt("pyxis --container-mounts")] = None,
        venv: Annotated[Optional[str], _opt("venv to activate in the job (default: this one)")] = None,
        workdir: Annotated[Optional[str], _opt("shared directory the job runs in (default: here)")] = None,
        env: Annotated[Optional[list[str]], _opt("KEY=VALUE exported in the job (repeatable)")] = None,
        gpu_mode: Annotated[Optional[str], _opt("gpus | fake (GPU-less nodes; default fake for gpu: cpu)")] = None,
        ray_port_base: Annotated[Optional[int], _opt("first Ray port (default: from the job id)")] = None,
        job_name: Annotated[Optional[str], _opt("sbatch --job-name (default: the spec's name)")] = None,
        output: Annotated[Optional[str], _opt("sbatch --output")] = None,
        site: Annotated[Optional[Path], _opt("YAML file of these settings")] = None,
        study_name: Annotated[Optional[str], _opt("study name", _SWEEP)] = None,
        storage: Annotated[Optional[str], _opt("Optuna storage URL (a password in it reaches the job through a "
                                               "file readable by you only, not the script)", _SWEEP,
                                               envvar=store_options.STORAGE_ENV)] = None,
        tracking_uri: Annotated[Optional[str], _opt("MLflow tracking URI (a password: as for --storage)", _SWEEP,
                                                    envvar=store_options.TRACKING_URI_ENV)] = None,
        n_trials: Annotated[Optional[int], _opt("trials", _SWEEP)] = None,
        max_concurrent: Annotated[Optional[int], _opt("trials in flight", _SWEEP)] = None,
        seed: Annotated[Optional[int], _opt("sampler seed", _SWEEP)] = None,
        resume: Annotated[bool, _opt("continue the study", _SWEEP)] = False,
        ray_check: Annotated[bool, _opt("run a tiny Ray check instead of the sweep", _SWEEP)] = False,
        wait: Annotated[bool, _opt("block until the job ends; exit with its code", hidden=not submit)] = False,
    ) -> int:
        sweep_options = {"study_name": study_name, "storage": storage, "tracking_uri": tracking_uri,
                         "n_trials": n_trials, "max_concurrent": max_concurrent, "seed": seed,
                         "resume": resume}
        settings, driver, link, kept = _build(
            spec, ray_check, site, sweep_options, nodes=nodes, gpus_per_node=gpus_per_node,
            partition=partition, account=account, qos=qos, time=time, cpus_per_task=cpus_per_task, mem=mem,
            exclusive=exclusive, constraint=constraint, sbatch_arg=sbatch_arg, container_image=container_image,
            container_mounts=container_mounts, venv=venv, workdir=workdir, env=env, gpu_mode=gpu_mode,
            ray_port_base=ray_port_base, job_name=job_name, output=output)
        return _script(settings, driver, link, kept, submit, wait)

    return command


slurm_app.command("render", help="Print the batch script for SPEC without submitting it.")(_command(False))
slurm_app.command("submit", help="Render the batch script for SPEC and sbatch it; prints the job id.")(
    _command(True))


@slurm_app.command("wait-ray", hidden=True)
def wait_ray(ray_address: Annotated[str, typer.Option()], nodes: Annotated[int, typer.Option()],
             timeout_s: Annotated[float, typer.Option()] = 180.0) -> int:
    from orchestrator.dispatch.slurm_ray import wait_for_nodes

    echo(f"{wait_for_nodes(ray_address, nodes, timeout_s)} Ray nodes alive")
    return 0


@slurm_app.command("ray-check", hidden=True)
def ray_check(ray_address: Annotated[str, typer.Option()], nodes: Annotated[int, typer.Option()]) -> int:
    from orchestrator.dispatch.slurm_ray import ray_check as check

    echo("ray-check " + json.dumps(check(ray_address, nodes), sort_keys=True))
    return 0


@slurm_app.command("link-run", hidden=True)
def link_run(spec: Spec, ray_address: Annotated[Optional[str], typer.Option()] = None,
             study_name: Annotated[Optional[str], typer.Option()] = None,
             storage: Annotated[Optional[str], typer.Option(envvar=store_options.STORAGE_ENV)] = None) -> int:
    from orchestrator.dispatch import slurm_job
    from orchestrator.dispatch.slurm_ray import link_run as link
    from orchestrator.spec.schema import load_spec

    s = load_spec(spec, {"study_name": study_name, "storage": storage})
    env = dict(os.environ)
    if ray_address:
        env["MOE_AUTOTUNE_RAY_ADDRESS"] = ray_address
    run_id = link(s.storage, s.name, slurm_job.job_tags(env))
    echo(f"tagged MLflow run {run_id}" if run_id else "no MLflow parent run to tag")
    return 0


def register(app: typer.Typer) -> None:
    app.add_typer(slurm_app, name="slurm")
