"""`moe-autotune sweep SPEC` runs a sweep; `moe-autotune status [STUDY]` prints its leaderboard."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import rich
import typer

from orchestrator import dispatch as backends
from orchestrator.commands import store_options
from orchestrator.search import table as searches
from orchestrator.spec.schema import DEFAULT_STORAGE
from orchestrator.userio import console, write_file

REASON_WIDTH = 80  # the characters of a failure's line `status` prints (the CSV has it whole)


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
    app.command("status")(status)


def sweep(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="sweep spec YAML (see examples/)"),
    backend: Optional[str] = typer.Option(None, help=backends.CHOICES_HELP),
    n_trials: Optional[int] = typer.Option(None, "--n-trials", help="trials to run (cost-model rejections are free)"),
    max_concurrent: Optional[int] = typer.Option(None, "--max-concurrent"),
    storage: Optional[str] = typer.Option(None, help=f"Optuna storage URL (default {DEFAULT_STORAGE})",
                                          envvar=store_options.STORAGE_ENV),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow tracking URI, or none",
                                               envvar=store_options.TRACKING_URI_ENV),
    study_name: Optional[str] = typer.Option(None, "--study-name"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted sweep of the same name"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="join a running Ray cluster"),
    seed: Optional[int] = typer.Option(None, help="sampler seed (reproducible proposals)"),
    replay_table: Optional[str] = typer.Option(None, "--replay-table", help="CSV for --backend replay"),
    search: Optional[str] = typer.Option(None, "--search", help=searches.CHOICES_HELP),
    fidelity: Optional[str] = typer.Option(None, "--fidelity", help="auto (default) | full | proxy"),
    trial_gpus: Optional[int] = typer.Option(None, "--trial-gpus", help="the most GPUs one trial may use"),
    calibration: Optional[str] = typer.Option(None, "--calibration",
                                              help="a file from `moe-autotune calibrate`: the cost model's constants"),
    quiet: bool = typer.Option(False, "--quiet", help="no live progress"),
) -> int:
    """Run a sweep: Optuna proposes layouts, the cost model screens them, a backend measures them."""
    from orchestrator.commands import crashlog
    from orchestrator.spec.schema import load_spec

    spec = load_spec(spec_path, {"backend": backend, "n_trials": n_trials, "max_concurrent": max_concurrent,
                                 "storage": storage, "tracking_uri": tracking_uri, "study_name": study_name,
                                 "ray_address": ray_address, "seed": seed, "replay_table": replay_table,
                                 "search": search, "fidelity": fidelity, "trial_gpus": trial_gpus,
                                 "calibration": calibration})
    _check_names(spec)  # a model or GPU the catalogs do not know: refused before the sweep's libraries load
    from orchestrator.storage import check_tracking_uri

    tracked = check_tracking_uri(spec.tracking_uri, none_ok=True).lower() != "none"  # a plain path: one line, now
    crashlog.here(Path(spec.workdir) / spec.name)  # an internal error of this sweep is logged beside its trials
    if spec.lengths:
        return _family(spec, resume, quiet)
    from orchestrator.search.prior import make_prior

    prior = make_prior(spec, explore_ahead=True)  # a large space is explored in a forked child while the libraries
    ahead = prior.exploring  # below load; stopped here when the sweep leaves
    try:
        from orchestrator.commands.interrupts import unwind_on_signals
        from orchestrator.dispatch.slurm_job import job_tags
        from orchestrator.sweep import run_sweep  # Optuna, MLflow, pandas, Ray: only for a spec that passed
        from orchestrator.tracking.client import preload_store

        if ahead is not None and tracked:
            preload_store(spec.tracking_uri)  # while the child explores

        unwind_on_signals()  # scancel / kill / Ctrl-C: running trials are recorded as interrupted
        outcome = run_sweep(spec, resume=resume, prior=prior, show_progress=not quiet, run_tags=job_tags())
    finally:
        if ahead is not None:
            ahead.stop()  # a sweep refused before it needed the ranking leaves no child computing it
    _print_outcome(outcome)
    return outcome.exit_code


def _family(spec, resume: bool, quiet: bool) -> int:
    from orchestrator.commands.interrupts import unwind_on_signals
    from orchestrator.dispatch.slurm_job import job_tags
    from orchestrator.sweep.family import run_family

    unwind_on_signals()  # scancel / kill / Ctrl-C: running trials are recorded as interrupted
    family = run_family(spec, resume=resume, show_progress=not quiet, run_tags=job_tags())
    for outcome in family.outcomes.values():
        _print_outcome(outcome)
    console().print(family_table(family.rows, spec.name))
    return family.exit_code


def _check_names(spec) -> None:
    """The spec's model and GPU, looked up in the catalogs (what the sweep's prior would do first)."""
    from search_spaces.catalog.hardware import load_gpu
    from search_spaces.catalog.models import load_model

    load_model(spec.model)
    load_gpu(spec.gpu)


def _print_outcome(outcome) -> None:
    from orchestrator.redact import redact_uri

    found = outcome.summary
    out = console()
    out.print(f"sweep {found.name}: {found.tally.line()} ({found.measured} count against n_trials), "
              f"{outcome.wall_time_s:.1f} s")
    out.print(_gpu_hours_line(found))
    if found.pareto:
        out.print(_pareto_table(found))
    if found.best is not None:
        b = found.best
        out.print(f"best layout (trial {b.number}): {found.records[b.number].layout_key}  "
                  f"{b.values[0]:,.1f} tokens/s/GPU, peak {b.values[1]:.2f} GiB{_train_line(found)}")
    else:
        statuses = Counter(r.status for r in found.records.values() if r.status)
        typer.echo("error: no trial measured a layout that fits; statuses: "
                   + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())), err=True)
    if outcome.stopped and outcome.stopped not in outcome.messages:  # its budget: how likely a better layout still is
        out.print(f"stopped: {outcome.stopped}", markup=False)
    for msg in outcome.messages:
        typer.echo(("error: " if outcome.mlflow_pending else "note: ") + redact_uri(msg), err=True)


def _pareto_table(found) -> rich.table.Table:
    from rich.table import Table

    what = "predicted" if found.predicted else "measured"
    table = Table(title=f"Pareto front ({what} tokens/s/GPU vs peak memory GiB)")
    for col in ("trial", "layout", "fidelity", "tokens/s/GPU", "peak GiB"):
        table.add_column(col)
    for t in found.pareto:
        record = found.records[t.number]
        table.add_row(str(t.number), record.layout_key or "", record.fidelity_label, f"{t.values[0]:,.1f}",
                      f"{t.values[1]:.2f}")
    return table


def family_table(rows: list[dict], name: str) -> rich.table.Table:
    """A length family as the long-context recipes publish it: per length the best layout and its figures."""
    from rich.table import Table  # tables only when one is printed: not at every start-up

    table = Table(title=f"length family {name}: the best layout per sequence length")
    for col in ("seq_len", "best layout", "tokens/s/GPU", "TF/s/GPU", "peak GiB", "TF/s vs shortest"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["seq_len"]), r["layout"] or "nothing fits", _cell(r["tokens_per_sec_per_gpu"]),
                      _cell(r["tflops_per_gpu"]), _cell(r["peak_memory_gib"]),
                      f"{r['tflops_vs_shortest']:.0%}" if r["tflops_vs_shortest"] else "-")
    return table


def status(
    study_name: Optional[str] = typer.Argument(None, metavar="[STUDY]", help="default: the last study"),
    storage: str = typer.Option(DEFAULT_STORAGE, help="Optuna storage URL"),
    csv: Optional[Path] = typer.Option(None, "--csv", help="write the leaderboard (replay-table columns)"),
    top: int = typer.Option(20, help="rows to print"),
) -> int:
    """Leaderboard of a running or finished sweep, from the Optuna storage."""
    from search_spaces.inputs import check_optional_name, check_output_file

    check_optional_name(study_name, "study name")
    if csv is not None:
        check_output_file(csv, "--csv")
    from rich.table import Table

    from search_spaces.layouts.layout import PARALLEL_SIZES

    from orchestrator.records import StudyRecord, queries
    from orchestrator.storage import studies
    from orchestrator.sweep.lease import Holder
    # a length family: its table, then each length's leaderboard
    if study_name and (members := studies.family_members(storage, study_name)):
        from orchestrator.sweep.family import family_rows

        console().print(family_table(family_rows(members), study_name))
        return 0
    study = studies.load_study(storage, study_name)
    frame = queries.leaderboard(study)
    if csv is not None:  # whole or not at all; a full device or a closed pipe is one line (exit 6)
        write_file(csv, "--csv", lambda fh: frame.to_csv(fh, index=False))
    out = console()
    found = queries.summary(study)
    out.print(f"study {found.name}: {found.tally.line()} ({found.measured} count against n_trials)")
    lease = Holder.of(study)
    if lease:
        out.print(f"being run by pid {lease.pid} on {lease.host}")
    elif stopped := StudyRecord.of(study).stopped:  # a running sweep's last stop is no longer the news
        out.print(f"stopped: {stopped}", markup=False)
    out.print(_gpu_hours_line(found))
    table = Table()
    cols = ["trial", "status", "fidelity", *PARALLEL_SIZES, "mbs", "recompute", "tokens_per_sec_per_gpu",
            "predicted_tokens_per_sec_per_gpu", "peak_memory_gib"]
    cols += [c for c in ("train_days", "train_usd") if not frame.empty and frame[c].notna().any()]
    # failed trials: the root cause's class (and rank) and its line (`--csv`: failure_class, _rank, _reason)
    cols += [c for c in ("failure", "failure_reason") if not frame.empty and frame["failure_class"].notna().any()]
    for col in cols:
        table.add_column(col.replace("_per_", "/").replace("tokens", "tok"))
    for _, row in frame.head(top).iterrows():
        table.add_row(*[_failure_cell(row, c) if c.startswith("failure") else _cell(row[c]) for c in cols])
    out.print(table)
    best = found.best
    if best is not None:
        out.print(f"best that fits: trial {best.number} {found.records[best.number].layout_key} "
                  f"{best.values[0]:,.1f} tokens/s/GPU{_train_line(found)}")
    return 0


def _gpu_hours_line(found) -> str:
    """What the sweep spent (and, with proxies, what the same trials would have cost at full size); a what-if
    sweep's figure is what its trials would have spent: nothing ran."""
    from orchestrator.spec.economics import money

    spend = found.spend
    usd = f" ({money(spend.usd)})" if spend.usd is not None else ""
    full_usd = f" ({money(spend.full_size_usd)})" if spend.full_size_usd is not None else ""
    saved = (f"; the same trials at full size: {spend.full_size_gpu_hours:,.1f} GPU-h{full_usd} ({found.proxies} "
             f"ran as proxies)") if found.proxies else ""
    what = "GPU time the trials would take (predicted: nothing ran)" if found.predicted else "GPU time"
    to_best = (f"; {found.gpu_hours_to_best:,.1f} GPU-h until the best was first measured"
               if found.gpu_hours_to_best is not None else "")
    return f"{what}: {spend.gpu_hours:,.1f} GPU-h{usd}{saved}{to_best}"


def _train_line(found) -> str:
    """How long (and how much) the best layout takes to train the spec's cost.train_tokens; '' without."""
    from orchestrator.spec.economics import money

    if found.train is None:
        return ""
    usd = f", {money(found.train.usd)}" if found.train.usd is not None else ""
    return (f"; trains {found.context.cost.train_tokens:.3g} tokens on {found.context.num_gpus} GPUs in "
            f"{found.train.days:,.1f} days{usd}")


def _failure_cell(row, col: str) -> str:
    """`failure`: the class and the rank that failed first (`killed (rank 1)`); `failure_reason`: its line, cut
    to what a terminal shows (the CSV has it whole)."""
    if _cell(row["failure_class"]) == "-":
        return "-"
    if col == "failure_reason":
        reason = _cell(row["failure_reason"])
        return reason if len(reason) <= REASON_WIDTH else reason[:REASON_WIDTH - 3] + "..."
    rank = row["failure_rank"]
    return f"{row['failure_class']} (rank {int(rank)})" if _cell(rank) != "-" else str(row["failure_class"])


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)

