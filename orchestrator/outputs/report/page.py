"""The report's page: report.html (a packaged Jinja2 template, orchestrator/templates/report.html.j2) with the
headline, the winner, the trials' table and every figure of charts.py (plotly.js inlined once, so the page opens
offline), the PNGs beside it (png_export.py), and the page and PNGs logged to the sweep's MLflow parent run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import optuna
import plotly.graph_objects as go
from markupsafe import Markup

from orchestrator import records
from orchestrator.outputs.packing_view import study_comparison
from orchestrator.outputs.report.charts import figures
from orchestrator.outputs.report.png_export import export_pngs
from orchestrator.outputs.report.values import finite_number, sig, trial_label
from orchestrator.outputs.winner import TrialView, throughput, views
from orchestrator.records import StudyRecord
from orchestrator.records.lifecycle import Tally
from orchestrator.userio import write_text

# the page: a packaged template, every value escaped but plotly's own figure HTML; a missing value is an error
_PAGE = jinja2.Environment(loader=jinja2.PackageLoader("orchestrator", "templates"), autoescape=True,
                           undefined=jinja2.StrictUndefined).get_template("report.html.j2")


@dataclass
class Report:
    html_path: Path
    pngs: dict[str, Path]
    winner: TrialView | None
    png_note: str | None = None  # why no PNGs were written, when none were


def _cell(value: Any) -> str:
    return sig(float(value)) if finite_number(value) is not None else ""


_TABLE_HEAD = ("trial", "status", "layout", "fidelity", "tokens/s/GPU", "peak GiB", "backend", "reason")


def _table_rows(trials: list[TrialView], limit: int = 50) -> list[tuple]:
    rows = sorted(trials, key=lambda v: (v.status != "ok",
                                         -(finite_number(v.tokens_per_sec_per_gpu) or 0)))[:limit]
    return [(v.number, v.status, v.layout.key() if v.layout else "", v.runs_at, _cell(v.tokens_per_sec_per_gpu),
             _cell(v.peak_memory_gib), v.backend, v.reason or "") for v in rows]


def _winner(winner: TrialView | None) -> dict[str, str] | None:
    if winner is None:
        return None
    def numbers(tps: Any, peak: Any) -> str:
        return f"{_cell(tps) or '?'} tokens/s/GPU, peak {_cell(peak) or '?'} GiB"

    line = numbers(winner.tokens_per_sec_per_gpu, winner.peak_memory_gib)
    tps, peak = winner.predicted("tokens_per_sec_per_gpu"), winner.predicted("peak_memory_gib")
    if tps is not None or peak is not None:
        line += f" (predicted {numbers(tps, peak)})"
    return {"label": trial_label(winner), "line": line}


def _section(name: str, fig: go.Figure, first: bool, png: Path | None) -> dict[str, Any]:
    # plotly's own HTML goes in as it is (Markup); every other value the template escapes
    div = Markup(fig.to_html(full_html=False, include_plotlyjs=first, div_id=f"fig-{name}"))
    return {"name": name, "div": div, "png": png.name if png else None}


def write(study: optuna.Study, out_dir: str | Path, pngs: bool = True,
          family: list[dict[str, Any]] | None = None, compare_packing: bool = True, importance: bool = True) -> Report:
    """report.html and, where a Chrome runs (and `pngs`), one PNG per figure in out_dir; `family`: the rows
    of the length family the study belongs to; `compare_packing`: a packed sweep's page sets the cost model's
    best layout for full-length documents beside its best for the sweep's (two explorations of its space);
    `importance`: Optuna's parameter importance (fANOVA, which loads scikit-learn), else a note."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trials = views(study)
    fitting = [v for v in trials
               if v.status == "ok" and v.fits and finite_number(v.tokens_per_sec_per_gpu) is not None]
    winner = max(fitting, key=throughput, default=None)
    figs = figures(study, trials, winner, family, importance)
    pngs_written, png_note = export_pngs(figs, out) if pngs else ({}, "not asked for")

    context = StudyRecord.of(study)
    title = f"moe-autotune report: {study.study_name}"
    summary = (f"model {context.model} · seq_len {context.seq_len} · {context.num_gpus}× "
               f"{context.gpu} · backend {context.backend} · trials: {Tally.of(records.trials(study)).line()}")
    page = _PAGE.render(
        title=title, summary=summary, winner=_winner(winner), headline=headline(study, trials, winner),
        packing=study_comparison(context.spec or {}, int(context.num_gpus or 0)) if compare_packing else "",
        png_note=png_note if png_note and pngs else None, table_head=_TABLE_HEAD, table_rows=_table_rows(trials),
        sections=[_section(name, fig, i == 0, pngs_written.get(name)) for i, (name, fig) in enumerate(figs.items())])
    html_path = out / "report.html"
    write_text(html_path, "report", page)  # renamed over the old page once whole (commands/output.py)
    return Report(html_path, pngs_written, winner, png_note)


def log_to_mlflow(report: Report, parent_run_id: str, client: Any = None) -> None:
    """Attach the page and PNGs to the sweep's parent run (with `client`, else the tracking URI already set)."""
    from mlflow import MlflowClient

    client = client or MlflowClient()
    client.log_artifact(parent_run_id, str(report.html_path), "report")
    for path in report.pngs.values():
        client.log_artifact(parent_run_id, str(path), "report")


# ---- headline (issue 13) ---------------------------------------------------------------------------

def headline(study: optuna.Study, trials: list[TrialView], winner: TrialView | None) -> str:
    """What the winner saves against the first rule of thumb, the time and money to train, the sweep's spend
    (plain text; empty when there is nothing to say)."""
    from orchestrator.records import queries
    from orchestrator.spec.economics import money, to_train

    parts = []
    seeds = [v for v in trials if v.proposed_by in records.SEED_SOURCES]
    first = min(seeds, key=lambda v: v.number) if seeds else None
    context = StudyRecord.of(study)
    cost, gpus = context.cost, int(context.num_gpus or 0)
    if winner and first and first.status == "ok" and first.fits and finite_number(first.tokens_per_sec_per_gpu):
        gain = throughput(winner) / throughput(first) - 1
        parts.append(f"The winner runs {sig(100 * gain)}% faster than the first rule-of-thumb layout "
                     f"(trial {first.number}).")
        a, b = to_train(winner.tokens_per_sec_per_gpu, gpus, cost), to_train(first.tokens_per_sec_per_gpu, gpus, cost)
        if a and b:
            saved = f" and {money(b.usd - a.usd)}" if a.usd is not None and b.usd is not None else ""
            parts.append(f"Training {cost.train_tokens:.3g} tokens takes {sig(a.days)} days instead of "
                         f"{sig(b.days)}: {sig(b.days - a.days)} days{saved} saved.")
    elif winner and (found := to_train(winner.tokens_per_sec_per_gpu, gpus, cost)):
        usd = f" ({money(found.usd)})" if found.usd is not None else ""
        parts.append(f"Training {cost.train_tokens:.3g} tokens takes {sig(found.days)} days{usd}.")
    spend = queries.sweep_spend(study)
    if spend.gpu_hours:
        usd = f" ({money(spend.usd)})" if spend.usd is not None else ""
        full = (f"; at full size the same trials would have used {sig(spend.full_size_gpu_hours)} GPU-hours"
                if spend.full_size_gpu_hours > spend.gpu_hours * 1.001 else "")
        read = queries.summary(study)
        to_best = (f", {sig(read.gpu_hours_to_best)} of them until the best layout was first measured"
                   if read.gpu_hours_to_best is not None else "")
        used = "would have used (predicted: nothing ran)" if read.predicted else "used"
        parts.append(f"The sweep {used} {sig(spend.gpu_hours)} GPU-hours{usd}{to_best}{full}.")
    if context.stopped and not context.driver_lease:  # why it stopped (a sweep being run has not yet)
        parts.append(f"It stopped: {context.stopped.rstrip('.')}.")
    return " ".join(parts)
