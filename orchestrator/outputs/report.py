"""The sweep report: why the winner won, as one HTML page plus one PNG per figure, all drawn with plotly.

Figures: the Pareto front of tokens/s/GPU against peak memory, Optuna's parameter importance, predicted vs
measured throughput and memory, the winner's memory (predicted beside measured, GiB components only) and
time breakdown, and the best-so-far curve. Each figure is built once: the page embeds it (plotly.js inlined
once, so the page opens offline) and kaleido exports the same object to PNG, every figure in one headless
Chrome session. Kaleido finds Chrome/Chromium at $BROWSER_PATH or on PATH; without one the page is still
written and the PNGs are skipped with a note saying why.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import jinja2
import optuna
import plotly.graph_objects as go
from markupsafe import Markup
from plotly.subplots import make_subplots

from search_spaces.cost.breakdown import COUNT_KEYS, PEAK_KEYS

from orchestrator.outputs.packing_view import study_comparison
from orchestrator.outputs.winner import TrialView, throughput, views
from orchestrator.records import StudyRecord
from orchestrator.storage import studies
from orchestrator.userio import write_text

FIGURES = ("pareto", "importance", "predicted_vs_measured", "winner_breakdown", "best_so_far", "gpu_hours")
_STATUS_COLORS = {"ok": "#1f77b4", "oom": "#d62728", "error": "#7f7f7f", "invalid": "#9467bd",
                  "timeout": "#ff7f0e", "infeasible": "#bcbd22", "interrupted": "#8c564b",
                  "unschedulable": "#17becf"}
PNG_SIZE = (1000, 500)  # width, height in pixels
# plotly's hover labels, like sig(): 4 significant digits, thousands separators, no e-notation (d3-format)
_HOVER_FORMAT = ",.4~r"
# the page: a packaged template, every value escaped but plotly's own figure HTML; a missing value is an error
_PAGE = jinja2.Environment(loader=jinja2.PackageLoader("orchestrator", "templates"), autoescape=True,
                           undefined=jinja2.StrictUndefined).get_template("report.html.j2")


@dataclass
class Report:
    html_path: Path
    pngs: dict[str, Path]
    winner: TrialView | None
    png_note: str | None = None  # why no PNGs were written, when none were


def sig(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits with thousands separators: 0.872, 1,235, 475,500."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    text = f"{round(value, decimals):,.{max(decimals, 0)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _num(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def pareto_front(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """Non-dominated (peak memory low, tokens/s high) points, by increasing memory."""
    front, best = [], -math.inf
    for mem, tps, number in sorted(points, key=lambda p: (p[0], -p[1])):
        if tps > best:
            front.append((mem, tps, number))
            best = tps
    return front


def best_so_far(trials: list[TrialView]) -> list[tuple[int, float]]:
    """(trial number, best tokens/s/GPU among fitting ok trials up to it)."""
    curve, best = [], None
    for v in sorted(trials, key=lambda v: v.number):
        tps = _num(v.tokens_per_sec_per_gpu)
        if v.status == "ok" and v.fits and tps is not None:
            best = tps if best is None else max(best, tps)
        if best is not None:
            curve.append((v.number, best))
    return curve


def _ok_points(trials: list[TrialView]) -> list[tuple[float, float, int]]:
    pts = []
    for v in trials:
        mem, tps = _num(v.peak_memory_gib), _num(v.tokens_per_sec_per_gpu)
        if v.status == "ok" and mem is not None and tps is not None:
            pts.append((mem, tps, v.number))
    return pts


def _predicted_measured(trials: list[TrialView], key: str) -> list[tuple[float, float, int]]:
    pairs = []
    for v in trials:
        pred, meas = v.predicted(key), v.measured(key)
        if v.status == "ok" and pred is not None and meas is not None:
            pairs.append((pred, meas, v.number))
    return pairs


def memory_components(memory_gib: dict[str, Any] | None) -> dict[str, float]:
    """The GiB components of a memory breakdown; its counts (parameters, microbatches, the pipeline rank)
    are not memory and never go on a GiB axis."""
    return {k: float(v) for k, v in (memory_gib or {}).items() if k not in COUNT_KEYS and _num(v) is not None}


def _breakdown(view: TrialView | None) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(predicted memory GiB, measured memory GiB, predicted time s) components of the winner."""
    if view is None:
        return {}, {}, {}
    memory, time = view.predicted_breakdown()
    times = {k: float(v) for k, v in time.items() if _num(v) is not None}
    return memory_components(memory), memory_components(view.measured_memory()), times


def _component_order(*parts: dict[str, float]) -> list[str]:
    """The components summed into the peak first (cost model order), then the informational ones."""
    seen = list(dict.fromkeys(k for part in parts for k in part))
    return [k for k in PEAK_KEYS if k in seen] + [k for k in seen if k not in PEAK_KEYS]


def _importance_target(trial: optuna.trial.FrozenTrial) -> float:
    # Optuna's default evaluator (PED-ANOVA) ranks what makes the target *low*: negate tokens/s
    return -trial.values[0] if trial.values else float("nan")


@contextlib.contextmanager
def _negated_target_ok() -> Iterator[None]:
    """Silence Optuna's reminder to negate the target: _importance_target already does."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes")
        yield


# ---- the figures (plotly: drawn once, embedded in the page and exported to PNG) --------------------------

def _key(v: TrialView) -> str:
    return v.layout.key() if v.layout else "?"


def _label(v: TrialView) -> str:
    return f"trial {v.number}: {_key(v)}"


def _pareto_figure(trials: list[TrialView]) -> go.Figure:
    limit = trials[0].memory_limit_gib if trials else None
    fig = go.Figure()
    for status in sorted({v.status for v in trials if v.status is not None}):
        sel = [v for v in trials if v.status == status and _num(v.peak_memory_gib) is not None
               and _num(v.tokens_per_sec_per_gpu) is not None]
        if sel:
            fig.add_scatter(x=[v.peak_memory_gib for v in sel], y=[v.tokens_per_sec_per_gpu for v in sel],
                            mode="markers", name=status, text=[_label(v) for v in sel],
                            marker={"color": _STATUS_COLORS.get(status), "size": 9})
    front = pareto_front([p for p in _ok_points(trials) if limit is None or p[0] <= limit])
    if front:
        fig.add_scatter(x=[p[0] for p in front], y=[p[1] for p in front], mode="lines+markers",
                        name="Pareto front", line={"shape": "hv", "color": "black"},
                        text=[f"trial {p[2]}" for p in front])
    if limit:
        fig.add_vline(x=limit, line_dash="dash", annotation_text=f"GPU memory {sig(limit)} GiB")
    fig.update_layout(title="Pareto front: tokens/s/GPU vs peak memory", xaxis_title="peak memory (GiB)",
                      yaxis_title="tokens/s/GPU")
    return fig


class _Snapshot(optuna.Study):
    """A study nothing writes to once filled: its `trials` are handed out without a deep copy (Optuna's importance
    figure reads `study.trials` once per parameter, and copying every trial each time was most of its time)."""

    @property
    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.get_trials(deepcopy=False)


def _snapshot(study: optuna.Study) -> optuna.Study:
    """An in-memory copy of the finished trials: Optuna's importance reads every trial many times, and from a
    SQLite storage that is most of a report's time."""
    storage = studies.in_memory()
    storage.create_new_study(study.directions, study.study_name)
    copy = _Snapshot(study_name=study.study_name, storage=storage)
    copy.add_trials([t for t in study.get_trials(deepcopy=False) if t.state.is_finished()])
    return copy


def _importance_figure(study: optuna.Study) -> go.Figure:
    try:
        with _negated_target_ok():
            fig = optuna.visualization.plot_param_importances(
                _snapshot(study), target=_importance_target, target_name="tokens/s/GPU")
        fig.update_layout(title="Parameter importance for tokens/s/GPU (Optuna)")
    except Exception as exc:  # noqa: BLE001 -- too few trials, or nothing varied: the figure says so instead
        fig = go.Figure().add_annotation(text=f"parameter importance unavailable: {exc}", showarrow=False)
        fig.update_layout(title="Parameter importance (Optuna)")
    return fig


def _importance_left_to_report(study: optuna.Study) -> go.Figure:
    fig = go.Figure().add_annotation(
        text=f"parameter importance: moe-autotune report {study.study_name} draws it (its fANOVA loads scikit-learn, "
             "a second or two: left out of the page every sweep writes)", showarrow=False)
    fig.update_layout(title="Parameter importance (Optuna)")
    return fig


def _predicted_measured_figure(trials: list[TrialView]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s/GPU", "peak memory (GiB)"))
    for col, key in ((1, "tokens_per_sec_per_gpu"), (2, "peak_memory_gib")):
        pairs = _predicted_measured(trials, key)
        if pairs:
            lo = min(min(p[0], p[1]) for p in pairs)
            hi = max(max(p[0], p[1]) for p in pairs)
            fig.add_scatter(x=[p[0] for p in pairs], y=[p[1] for p in pairs], mode="markers", row=1, col=col,
                            name=key, text=[f"trial {p[2]}" for p in pairs])
            fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "gray"},
                            row=1, col=col, name="predicted = measured", showlegend=col == 1)
        fig.update_xaxes(title_text="predicted", row=1, col=col)
        fig.update_yaxes(title_text="measured", row=1, col=col)
    fig.update_layout(title="Predicted (cost model) vs measured")
    return fig


def _breakdown_figure(winner: TrialView | None) -> go.Figure:
    """Left: each memory component in GiB, predicted beside measured. Right: predicted time per step."""
    pred_mem, meas_mem, pred_time = _breakdown(winner)
    keys = _component_order(pred_mem, meas_mem)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4],
                        subplot_titles=("memory (GiB), predicted vs measured", "time per step (s), predicted"))
    for name, values in (("predicted", pred_mem), ("measured", meas_mem)):
        if values:  # None, not 0, where one side lacks a component: a gap rather than a false zero
            fig.add_bar(x=keys, y=[values.get(k) for k in keys], name=name, row=1, col=1)
    if pred_time:
        fig.add_bar(x=list(pred_time), y=list(pred_time.values()), name="predicted time", row=1, col=2)
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    fig.update_yaxes(title_text="s per step", row=1, col=2)
    # the layout key is long: on its own smaller line, so the title fits the PNG's width
    title = "Winner breakdown: no winner"
    if winner:
        title = f"Winner breakdown: trial {winner.number}<br><sup>{_key(winner)}</sup>"
    fig.update_layout(title=title, barmode="group", margin={"t": 110})
    return fig


def _best_so_far_figure(trials: list[TrialView]) -> go.Figure:
    curve = best_so_far(trials)
    ok = [(v.number, v.tokens_per_sec_per_gpu) for v in trials
          if v.status == "ok" and _num(v.tokens_per_sec_per_gpu) is not None]
    fig = go.Figure()
    fig.add_scatter(x=[p[0] for p in ok], y=[p[1] for p in ok], mode="markers", name="trial")
    fig.add_scatter(x=[p[0] for p in curve], y=[p[1] for p in curve], mode="lines", name="best so far",
                    line={"shape": "hv"})
    fig.update_layout(title="Best tokens/s/GPU so far", xaxis_title="trial", yaxis_title="tokens/s/GPU")
    return fig


def pareto_figure(study: optuna.Study) -> go.Figure:
    """The report's Pareto figure on its own (the sweep's parent MLflow run carries it)."""
    fig = _pareto_figure(views(study))
    fig.update_xaxes(hoverformat=_HOVER_FORMAT)
    fig.update_yaxes(hoverformat=_HOVER_FORMAT)
    return fig


def figures(study: optuna.Study, trials: list[TrialView], winner: TrialView | None,
            family: list[dict[str, Any]] | None = None, importance: bool = True) -> dict[str, go.Figure]:
    """One figure per question; the length family's only for a family (its rows: sweep.family.family_rows);
    without `importance`, the importance figure is a note naming `moe-autotune report`."""
    figs = {"pareto": _pareto_figure(trials),
            "importance": _importance_figure(study) if importance else _importance_left_to_report(study),
            "predicted_vs_measured": _predicted_measured_figure(trials),
            "winner_breakdown": _breakdown_figure(winner), "best_so_far": _best_so_far_figure(trials),
            "gpu_hours": _gpu_hours_figure(trials)}
    if family:
        figs["length_family"] = _family_figure(family)
    for fig in figs.values():
        fig.update_xaxes(hoverformat=_HOVER_FORMAT)
        fig.update_yaxes(hoverformat=_HOVER_FORMAT)
    return figs


def export_pngs(figs: dict[str, go.Figure], out: Path) -> tuple[dict[str, Path], str | None]:
    """<name>.png for every figure, all in one headless Chrome session (kaleido); ({}, why) without Chrome."""
    import kaleido  # imported here: only the PNG export needs it (and its browser machinery)
    from kaleido.errors import (
        BrowserClosedError,
        BrowserFailedError,
        ChromeNotFoundError,
        JavascriptError,
        KaleidoError,
    )

    paths = {name: out / f"{name}.png" for name in figs}
    width, height = PNG_SIZE
    specs = [{"fig": fig, "path": paths[name], "opts": {"format": "png", "width": width, "height": height}}
             for name, fig in figs.items()]
    # plotly.js comes from the plotly package; MathJax would come from a CDN and no label needs it
    kopts: dict[str, Any] = {"mathjax": False}
    browser = os.environ.get("BROWSER_PATH")
    if browser:  # the user's choice wins over a Chrome that kaleido_get_chrome downloaded
        kopts["path"] = browser
    try:
        kaleido.write_fig_from_object_sync(specs, kopts=kopts, cancel_on_error=True)
        return paths, None
    except ChromeNotFoundError:
        where = f"at BROWSER_PATH={browser}" if browser else "on PATH (install chromium or set BROWSER_PATH)"
        note = f"no Chrome or Chromium {where}"
    except (BrowserFailedError, BrowserClosedError) as exc:
        why = ((str(exc.args[0]) if exc.args else "").strip().splitlines() or [type(exc).__name__])[0]
        note = f"the browser {browser or 'found on PATH'} did not start: {why}"
    except TimeoutError:  # kaleido's per-figure limit, on a machine too loaded to render in time
        note = "Chrome took longer than kaleido's limit to render a figure"
    except (JavascriptError, KaleidoError) as exc:  # e.g. the page's scripts not loaded yet on a loaded machine
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        note = f"Chrome could not render the figures: {why}"
    for path in paths.values():  # all or none: the page links no PNG that is missing
        path.unlink(missing_ok=True)
    return {}, note


# ---- the page -----------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    return sig(float(value)) if _num(value) is not None else ""


_TABLE_HEAD = ("trial", "status", "layout", "fidelity", "tokens/s/GPU", "peak GiB", "backend", "reason")


def _table_rows(trials: list[TrialView], limit: int = 50) -> list[tuple]:
    rows = sorted(trials, key=lambda v: (v.status != "ok", -(_num(v.tokens_per_sec_per_gpu) or 0)))[:limit]
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
    return {"label": _label(winner), "line": line}


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
    fitting = [v for v in trials if v.status == "ok" and v.fits and _num(v.tokens_per_sec_per_gpu) is not None]
    winner = max(fitting, key=throughput, default=None)
    figs = figures(study, trials, winner, family, importance)
    pngs_written, png_note = export_pngs(figs, out) if pngs else ({}, "not asked for")

    context = StudyRecord.of(study)
    title = f"moe-autotune report: {study.study_name}"
    summary = (f"model {context.model} · seq_len {context.seq_len} · {context.num_gpus}× "
               f"{context.gpu} · backend {context.backend} · {len(trials)} trials")
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


# ---- spend, length family, headline (issue 13) ------------------------------------------------------

def _gpu_hours_figure(trials: list[TrialView]) -> go.Figure:
    """GPU-hours each trial used, by fidelity, beside what it would have used at full size."""
    ran = [(v, used) for v in trials if (used := v.gpu_seconds[0]) is not None]  # (trial, GPU-seconds used)
    fig = go.Figure()
    for fidelity in ("full", "proxy"):
        sel = [(v, s) for v, s in ran if v.runs_at == fidelity]
        if sel:
            fig.add_bar(x=[v.number for v, _ in sel], y=[s / 3600 for _, s in sel], name=f"used ({fidelity})",
                        text=[_label(v) for v, _ in sel])
    proxies = [(v, full) for v, _ in ran if v.proxy and (full := v.gpu_seconds[1])]  # (trial, at full size)
    if proxies:
        fig.add_scatter(x=[v.number for v, _ in proxies], y=[s / 3600 for _, s in proxies], mode="markers",
                        name="the same trial at full size", marker={"symbol": "line-ew-open", "size": 14})
    fig.update_layout(title="GPU-hours per trial (proxies ran on fewer GPUs)", xaxis_title="trial",
                      yaxis_title="GPU-hours", barmode="group")
    return fig


def _family_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """A length family: the best layout's TF/s and tokens/s per sequence length (separate axes: other units)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TF/s/GPU of the best layout", "tokens/s/GPU"))
    lengths = [str(r["seq_len"]) for r in rows]
    fig.add_scatter(x=lengths, y=[r["tflops_per_gpu"] for r in rows], mode="lines+markers", name="TF/s/GPU",
                    text=[r["layout"] or "nothing fits" for r in rows], row=1, col=1)
    fig.add_scatter(x=lengths, y=[r["tokens_per_sec_per_gpu"] for r in rows], mode="lines+markers",
                    name="tokens/s/GPU", row=1, col=2)
    fig.update_xaxes(title_text="sequence length", type="category")
    fig.update_layout(title="Length family: the best layout per sequence length")
    return fig


def headline(study: optuna.Study, trials: list[TrialView], winner: TrialView | None) -> str:
    """What the winner saves against the first rule of thumb, the time and money to train, the sweep's spend
    (plain text; empty when there is nothing to say)."""
    from orchestrator.records import queries
    from orchestrator.spec.economics import money, to_train

    parts = []
    seeds = [v for v in trials if v.proposed_by in ("rule-of-thumb", "previous length")]
    first = min(seeds, key=lambda v: v.number) if seeds else None
    context = StudyRecord.of(study)
    cost, gpus = context.cost, int(context.num_gpus or 0)
    if winner and first and first.status == "ok" and first.fits and _num(first.tokens_per_sec_per_gpu):
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
        parts.append(f"The sweep used {sig(spend.gpu_hours)} GPU-hours{usd}{full}.")
    return " ".join(parts)
