"""The MLflow Model Registry as the record of which layout runs in production.

A layout is not a model, so it is registered as the simplest thing the registry accepts: a model version
whose source is a folder of plain files logged to an MLflow run (no MLmodel/pyfunc wrapper):

    layout.yaml            Layout.to_dict() (what `--layout FILE` and Layout.from_dict read)
    megatron-args.txt      the exact Megatron-LM pretrain_gpt.py flags, one per line
    bridge-overrides.yaml  Megatron-Bridge ConfigContainer overrides
    launch.sbatch          a ready Slurm launch script
    trial.json             the measurement and the prediction it was chosen on

One registered model per model and sequence length (`<model>-<seq_len>-layout`). The alias `production`
points at the version in use (aliases, not the deprecated stages); each version remembers, in the tag
`moe_autotune.previous_production`, which version was production before it, so `rollback` walks back. A promote's
read, record and move of the alias, and a rollback's, take turns (promotion_lock.py): promotes run at once chain one
after the other, and each rollback steps back exactly one version.
Load it back with `mlflow.artifacts.download_artifacts("models:/<name>@production")`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.outputs import export, promotion_lock
from orchestrator.outputs.winner import TrialView
from orchestrator.records import PROMOTION_TAG, StudyRecord
from orchestrator.spec.economics import to_train
from orchestrator.storage import connections

log = logging.getLogger("moe_autotune")
PRODUCTION = "production"
PREVIOUS_TAG = "moe_autotune.previous_production"
ARTIFACT_DIR = "layout"
FILES = ("layout.yaml", "megatron-args.txt", "bridge-overrides.yaml", "launch.sbatch", "trial.json")
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def registered_model_name(model: str, seq_len: int) -> str:
    """`deepseek-v3-131072-layout`; a config.json path contributes its folder name."""
    stem = Path(model).parent.name if model.endswith("config.json") else Path(model).name
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-") or "model"
    return f"{stem}-{int(seq_len)}-layout"


def use_tracking_uri(uri: str | None) -> str:
    """Point MLflow (tracking and registry) at one URI for this process and return it."""
    import mlflow

    # a fresh SQLite store announces its schema migration on stderr: noise for a CLI user (MLflow's own store log
    # is muted by connections.bound_mlflow)
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stdout is the export
    connections.bound_mlflow()  # also mlflow.artifacts' calls (download) are bounded
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def _client():
    """The registry's client (the URI use_tracking_uri set), bounded; a missing SQLite store is created whole."""
    import mlflow

    from orchestrator.storage import open_mlflow

    return open_mlflow(mlflow.get_registry_uri(), create=True)


def _writing_client():
    """_client, for a command that writes: a SQLite store that refuses writes, is damaged or held locked is one
    line before anything is written (MLflow logs a traceback per refused statement and stops half way)."""
    import mlflow

    from orchestrator.tracking.client import check_store

    check_store(mlflow.get_registry_uri())
    return _client()


def _situation(view: TrialView, ctx: StudyRecord, study_name: str) -> tuple[Layout, str, int, int]:
    """The trial's layout and the study's model, seq_len and num_gpus (winner.pick and winner.context refuse a
    trial or study without them)."""
    if view.layout is None or ctx.model is None or ctx.seq_len is None or ctx.num_gpus is None:
        raise SpecError(f"{study_name} trial {view.number}: no layout, model, seq_len or num_gpus recorded")
    return view.layout, ctx.model, ctx.seq_len, ctx.num_gpus


def render(view: TrialView, ctx: StudyRecord, study_name: str, gpus_per_node: int | None = None) -> dict[str, str]:
    """The artifact files of one trial, as text (also what `export` prints); `gpus_per_node` for the sbatch
    script (default: the sweep's)."""
    from search_spaces.catalog.models import load_model

    layout, model_name, seq_len, num_gpus = _situation(view, ctx, study_name)
    model = load_model(model_name)  # production runs the full model, whatever proxy was profiled
    trial = {"study": study_name, "trial": view.number, "backend": view.backend, "estimated": view.estimated,
             "model": ctx.model, "seq_len": seq_len, "gpu": ctx.gpu, "num_gpus": ctx.num_gpus,
             "profiled_with_model_overrides": ctx.model_overrides or None, **view.evidence()}
    megatron_args, bridge = export.megatron_args_text(layout, model, seq_len), export.bridge_overrides_yaml(
        layout, seq_len, model)
    if ((ctx.spec or {}).get("packing") or {}).get("mode") == "packed":  # the packing settings ride along
        import yaml

        from search_spaces.cost.packing import packing_exports

        packed = packing_exports(layout, seq_len)
        megatron_args += "".join(f"{flag}\n" for flag in packed["megatron_args"])
        overrides = export.bridge_overrides(layout, seq_len, model)
        overrides["dataset"].update(packed["bridge"]["dataset"])
        bridge = yaml.safe_dump(overrides, sort_keys=False)
        trial["packing"] = packed
    return {
        "layout.yaml": export.layout_yaml(layout, model=ctx.model, seq_len=seq_len, gpu=ctx.gpu,
                                          num_gpus=ctx.num_gpus, study=study_name, trial=view.number),
        "megatron-args.txt": megatron_args,
        "bridge-overrides.yaml": bridge,
        "launch.sbatch": export.sbatch_script(layout, model, seq_len, num_gpus, gpus_per_node or ctx.gpus_per_node),
        "trial.json": json.dumps(trial, indent=2, default=str) + "\n",
    }


def _experiment_id(client, ctx: StudyRecord, study_name: str) -> str:
    exp_id = ctx.mlflow_experiment_id
    if exp_id:
        try:
            if client.get_experiment(str(exp_id)) is not None:
                return str(exp_id)
        except MlflowException as exc:  # recorded on another tracking server: find it by name instead
            log.info("experiment %s is not on this tracking server (%s); looking it up by name", exp_id, exc)
    exp = client.get_experiment_by_name(study_name)
    if exp:
        return exp.experiment_id
    try:
        return client.create_experiment(study_name)
    except MlflowException as exc:  # another promote of the study created it at the same moment
        exp = client.get_experiment_by_name(study_name) if exc.error_code == "RESOURCE_ALREADY_EXISTS" else None
        if exp is None:
            raise
        return exp.experiment_id


def current_production(name: str, client=None):
    """The ModelVersion the alias points at, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return (client or _client()).get_model_version_by_alias(name, PRODUCTION)
    except MlflowException:
        return None


@dataclass(frozen=True)
class Promotion:
    name: str
    version: str
    previous: str | None
    run_id: str


def promote(view: TrialView, ctx: StudyRecord, study_name: str) -> Promotion:
    """Log the trial's files to a new run, register them as a new version, move `production` to it."""
    layout, model_name, seq_len, _ = _situation(view, ctx, study_name)
    client = _writing_client()
    name = registered_model_name(model_name, seq_len)
    files = render(view, ctx, study_name)
    tags = {"moe_autotune.study": study_name, PROMOTION_TAG: str(view.number),
            "moe_autotune.layout_key": layout.key()}
    if ctx.mlflow_parent_run_id:
        tags["mlflow.parentRunId"] = str(ctx.mlflow_parent_run_id)
    run = client.create_run(_experiment_id(client, ctx, study_name), run_name=f"promote-trial-{view.number}",
                            tags=tags)
    with tempfile.TemporaryDirectory() as tmp:
        for filename, text in files.items():
            Path(tmp, filename).write_text(text)
        client.log_artifacts(run.info.run_id, tmp, ARTIFACT_DIR)
    client.set_terminated(run.info.run_id)
    _registered_model(client, name, ctx)
    version_tags = dict(tags, **{
        "moe_autotune.backend": str(view.backend), "moe_autotune.estimated": str(view.estimated).lower(),
        "moe_autotune.tokens_per_sec_per_gpu": f"{view.tokens_per_sec_per_gpu:.6g}",
        "moe_autotune.gpu": str(ctx.gpu), "moe_autotune.num_gpus": str(ctx.num_gpus)})
    version_tags.pop("mlflow.parentRunId", None)
    if view.peak_memory_gib is not None:
        version_tags["moe_autotune.peak_memory_gib"] = f"{view.peak_memory_gib:.6g}"
    version_tags["moe_autotune.fidelity"] = view.runs_at
    # the time (and dollars) to train the spec's cost.train_tokens with this layout on the target cluster
    found = to_train(view.tokens_per_sec_per_gpu, int(ctx.num_gpus or 0), ctx.cost)
    for key, value in (found.metrics() if found else {}).items():
        version_tags[f"moe_autotune.{key}"] = f"{value:.6g}"
    mv = client.create_model_version(name, source=f"{run.info.artifact_uri}/{ARTIFACT_DIR}",
                                     run_id=run.info.run_id, tags=version_tags,
                                     description=f"{study_name} trial {view.number}: {layout.key()}")
    previous = _move_production(client, name, str(mv.version))
    return Promotion(name, str(mv.version), previous, run.info.run_id)


def _registered_model(client, name: str, ctx: StudyRecord) -> None:
    """The registered model `name`, created at its first promotion (by one of two promotes that create it at once)."""
    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(
                name, description=f"Parallel layouts for {ctx.model} at sequence length {ctx.seq_len} "
                                  "(moe-autotune). Alias 'production' is the one to run.")
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def _move_production(client, name: str, version: str) -> str | None:
    """Point `production` at `version`, recording on it the version it replaces (what a rollback returns to); the
    version replaced. Read, record and move in one turn (promotion_lock): concurrent promotes chain, each after the
    other, so that each rollback steps back exactly one version."""
    try:
        with promotion_lock.turn(client, name):
            previous = current_production(name, client)
            if previous is not None:
                client.set_model_version_tag(name, version, PREVIOUS_TAG, str(previous.version))
            client.set_registered_model_alias(name, PRODUCTION, version)
    except SpecError as exc:
        raise SpecError(f"{exc} (version {version} is registered, not in production)") from None
    return str(previous.version) if previous is not None else None


def rollback(name: str) -> Promotion:
    """Move `production` back to the version that held it before the current one (in the same turn as a promote's
    move: promotion_lock)."""
    from mlflow.exceptions import MlflowException

    client = _writing_client()
    with promotion_lock.turn(client, name):
        current = current_production(name, client)
        if current is None:
            raise SpecError(f"registered model {name!r} has no production version to roll back")
        previous = current.tags.get(PREVIOUS_TAG)
        if not previous:
            raise SpecError(f"{name} version {current.version} was the first production version; nothing to roll "
                            "back to")
        try:
            client.get_model_version(name, previous)
        except MlflowException:
            raise SpecError(f"{name} version {previous} (the previous production) no longer exists") from None
        client.set_registered_model_alias(name, PRODUCTION, previous)
    return Promotion(name, str(previous), str(current.version), current.run_id)


def model_uri(ref: str) -> str:
    """`models:/name@alias`, `models:/name/3`, `name@alias` or `name/3` -> a models:/ URI."""
    return ref if ref.startswith("models:/") else f"models:/{ref}"


def download(ref: str, dst: str | os.PathLike | None = None) -> Path:
    """The artifact folder of a registered version (models:/<name>@production and the like)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return Path(mlflow.artifacts.download_artifacts(model_uri(ref), dst_path=None if dst is None else str(dst)))
    except Exception as exc:
        if connections.no_answer(exc) or connections.foreign_answer(exc):  # no answer, or not MLflow's answer
            raise connections.unreachable(mlflow.get_registry_uri(), exc) from None
        if not isinstance(exc, MlflowException):
            raise
        raise SpecError(f"cannot load {model_uri(ref)}: {str(exc).splitlines()[0]}") from None


def load_layout(ref: str) -> Layout:
    """The Layout of a registered version, read back through MLflow (within the bounded readers' limits: the
    store is another's to write)."""
    from search_spaces.bounded import loads_yaml
    from search_spaces.inputs import read_text_file

    what = f"layout.yaml of {model_uri(ref)}"
    with tempfile.TemporaryDirectory() as tmp:
        folder = download(ref, tmp)
        data = loads_yaml(read_text_file(folder / "layout.yaml", what), what)
        if not isinstance(data, dict):
            raise SpecError(f"{what} holds no mapping of layout fields")
        return Layout.from_dict(data)
