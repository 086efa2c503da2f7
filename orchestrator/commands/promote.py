"""`moe-autotune promote`, `export` and `report`: take the winner to production and show why it won."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import typer

from search_spaces.errors import SpecError
from search_spaces.inputs import check_name, check_optional_name

from orchestrator.commands import store_options
from orchestrator.spec.schema import DEFAULT_STORAGE
from orchestrator.userio import echo, output_folder

EXPORT_FORMATS = {"megatron-args": "megatron-args.txt", "bridge-yaml": "bridge-overrides.yaml",
                  "sbatch": "launch.sbatch", "layout-yaml": "layout.yaml"}

_STORAGE = typer.Option(DEFAULT_STORAGE, "--storage", help="Optuna storage URL of the sweep.")
_TRACKING = typer.Option(None, "--tracking-uri", callback=store_options.tracking_uri,
                         help="MLflow tracking/registry URI (default: the one the sweep recorded, "
                              "$MLFLOW_TRACKING_URI, sqlite:///mlflow.db).")
_TRIAL = typer.Option(None, "--trial", help="Trial number (default: the best measured trial that fits).")
_ESTIMATED = typer.Option(False, "--allow-estimated", help="Accept trials from the analytic backend.")
_PROXY = typer.Option(False, "--allow-proxy", help="Accept a proxy trial's composed figures (not confirmed at "
                                                   "full size).")
_BENCHMARK = typer.Option(False, "--allow-benchmark", help="Accept a layout with a benchmark-only setting "
                                                           "(routing forced_balance: random routing).")


def _study_and_tracking(study_name: Optional[str], storage: str, tracking_uri: Optional[str]):
    from orchestrator.outputs import registry, winner

    study = winner.load(storage, study_name)
    ctx = winner.context(study)
    return study, dataclasses.replace(ctx, tracking_uri=registry.use_tracking_uri(tracking_uri or ctx.tracking_uri))


def _existing_registry(tracking_uri: Optional[str]) -> str:
    """Point MLflow at the registry a read (rollback, export of a version) uses; it must already exist."""
    from orchestrator.outputs import registry
    from orchestrator.tracking.client import require_existing_store

    uri = registry.use_tracking_uri(tracking_uri)
    require_existing_store(uri)
    return uri


def _is_registry_ref(ref: str) -> bool:
    """VERSION or STUDY? Study names are plain ([A-Za-z0-9._-]), so '@' or '/' means a registered version."""
    return ref.startswith("models:/") or "@" in ref or "/" in ref


def _check_registry_ref(ref: str) -> None:
    """`models:/NAME@ALIAS`, `NAME@ALIAS` or `NAME/VERSION`: a plain name, then a plain alias or a version."""
    body = ref[len("models:/"):] if ref.startswith("models:/") else ref
    name, sep, rest = body.partition("@") if "@" in body else body.partition("/")
    check_name(name, "registered model name")
    if sep == "@":
        check_name(rest, "model alias")
    elif not rest.isdigit() or not rest.isascii():
        raise SpecError(f"{ref[:60]!r}: a registered version is NAME@ALIAS or NAME/VERSION (a number)")


def promote(
    study_name: Optional[str] = typer.Argument(None, metavar="STUDY", help="Study name (default: the newest)."),
    trial: Optional[int] = _TRIAL,
    storage: str = _STORAGE,
    tracking_uri: Optional[str] = _TRACKING,
    allow_estimated: bool = _ESTIMATED,
    allow_proxy: bool = _PROXY,
    allow_benchmark: bool = _BENCHMARK,
    rollback: bool = typer.Option(False, "--rollback",
                                  help="Move 'production' back to the previous production version."),
    name: Optional[str] = typer.Option(None, "--name", help="Registered model to roll back (instead of STUDY)."),
) -> None:
    """Register the winning layout in the MLflow Model Registry and point the alias 'production' at it."""
    check_optional_name(study_name, "study name")
    check_optional_name(name, "--name")
    from orchestrator.outputs import registry, winner
    if rollback:
        if trial is not None or allow_estimated or allow_proxy or allow_benchmark:
            raise SpecError("--rollback takes no --trial, --allow-estimated, --allow-proxy or --allow-benchmark")
        if name:
            _existing_registry(tracking_uri)
        else:
            _, ctx = _study_and_tracking(study_name, storage, tracking_uri)
            _existing_registry(ctx.tracking_uri)
            name = registry.registered_model_name(ctx.model, ctx.seq_len)
        done = registry.rollback(name)
        echo(f"rolled back models:/{done.name}@{registry.PRODUCTION}: version {done.previous} -> "
                   f"{done.version}")
        return
    if name:
        raise SpecError("--name is only for --rollback (a promotion names its model from the study)")
    study, ctx = _study_and_tracking(study_name, storage, tracking_uri)
    view = winner.pick(study, trial, allow_estimated, allow_proxy, allow_benchmark)
    done = registry.promote(view, ctx, study.study_name)
    was = f" (was version {done.previous})" if done.previous else ""
    how = ", estimated" if view.estimated else (", composed from a proxy" if view.proxy else "")
    echo(f"promoted {study.study_name} trial {view.number} ({view.tokens_per_sec_per_gpu:.1f} tokens/s/GPU"
         f"{how}) to models:/{done.name}@{registry.PRODUCTION}: version {done.version}{was}")
    assert view.layout is not None  # winner.pick refuses a trial with no layout recorded
    echo(f"layout: {view.layout.key()}")


def export(
    ref: str = typer.Argument(..., metavar="VERSION|STUDY",
                              help="models:/NAME@ALIAS, NAME@ALIAS, NAME/VERSION, or a study name."),
    fmt: str = typer.Option("megatron-args", "--format", "-f", help=f"One of: {', '.join(EXPORT_FORMATS)}."),
    trial: Optional[int] = _TRIAL,
    storage: str = _STORAGE,
    tracking_uri: Optional[str] = _TRACKING,
    allow_estimated: bool = _ESTIMATED,
    allow_proxy: bool = _PROXY,
    allow_benchmark: bool = _BENCHMARK,
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1,
                                                help="GPUs per node for sbatch (default: the sweep's)."),
) -> None:
    """Print a registered version's (or a study winner's) Megatron flags, Bridge overrides or sbatch script."""
    if fmt not in EXPORT_FORMATS:
        raise SpecError(f"unknown export format {fmt!r}; allowed: {', '.join(EXPORT_FORMATS)}")
    filename = EXPORT_FORMATS[fmt]
    if _is_registry_ref(ref):
        _check_registry_ref(ref)
        if trial is not None or gpus_per_node is not None:
            raise SpecError("--trial and --gpus-per-node apply to a study, not a registered version")
    else:
        check_name(ref, "study name")
    from orchestrator.outputs import registry, winner
    if _is_registry_ref(ref):
        _existing_registry(tracking_uri)
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            folder = registry.download(ref, tmp)
            if not (folder / filename).is_file():
                raise SpecError(f"{registry.model_uri(ref)} has no {filename}")
            echo((folder / filename).read_text(), nl=False)
        return
    study = winner.load(storage, ref)
    ctx = winner.context(study)
    view = winner.pick(study, trial, allow_estimated, allow_proxy, allow_benchmark)
    echo(registry.render(view, ctx, study.study_name, gpus_per_node)[filename], nl=False)


def report(
    study_name: Optional[str] = typer.Argument(None, metavar="STUDY", help="Study name (default: the newest)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for report.html and the PNGs "
                                                                 "(default: ./report-STUDY)."),
    storage: str = _STORAGE,
    tracking_uri: Optional[str] = _TRACKING,
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log the report to the sweep's MLflow run."),
) -> None:
    """Write an HTML report with PNGs (Pareto front, importance, predicted vs measured, breakdown, progress).

    The PNGs need a Chrome or Chromium (on PATH or at $BROWSER_PATH); without one they are skipped with a note.
    """
    from search_spaces.inputs import check_output_dir

    check_optional_name(study_name, "study name")
    if out is not None:
        check_output_dir(out, "--out")
    from orchestrator.outputs import report as report_mod
    from orchestrator.outputs import winner
    study, family = _report_study(storage, study_name)
    ctx = winner.context(study)
    parent = None if no_mlflow else ctx.mlflow_parent_run_id
    client = None
    if parent:  # the run it is logged to must be there before anything is written, its server answering
        from mlflow.exceptions import MlflowException

        from orchestrator.storage import open_mlflow

        uri = _existing_registry(tracking_uri or ctx.tracking_uri)
        client = open_mlflow(uri)
        try:
            client.get_run(parent)
        except MlflowException:
            raise SpecError(f"the sweep's MLflow run {parent} is not in {uri}: pass the sweep's --tracking-uri, "
                            "or --no-mlflow") from None
    if out is None:  # the default folder is named after the study: an output file stem
        out = check_output_dir(Path(f"report-{check_name(study.study_name, 'study name')}"), "report folder")
    with output_folder(out, "report folder"):  # a full disk, an I/O error: one line, and no half-written page
        done = report_mod.write(study, out, family=family)
    echo(f"report: {done.html_path}")
    if done.png_note:
        typer.echo(f"note: PNGs skipped: {done.png_note}", err=True)
    if no_mlflow:
        return
    if not parent:
        typer.echo("note: the study records no MLflow parent run; report not logged to MLflow", err=True)
        return
    report_mod.log_to_mlflow(done, parent, client)
    echo(f"logged to MLflow run {parent} under report/")


def register(app: typer.Typer) -> None:
    app.command("promote")(promote)
    app.command("export")(export)
    app.command("report")(report)


def _report_study(storage: str, name: str | None):
    """The study a report is about, and its length family's rows when it belongs to one (a family's name
    reports on its longest length)."""
    from orchestrator.outputs import winner
    from orchestrator.records import StudyRecord
    from orchestrator.storage import studies
    from orchestrator.sweep.family import family_rows

    members = studies.family_members(storage, name) if name else []
    study = members[-1] if members else winner.load(storage, name)
    family = StudyRecord.of(study).family
    if family and not members:
        members = studies.family_members(storage, family)
    return study, family_rows(members) if members else None
