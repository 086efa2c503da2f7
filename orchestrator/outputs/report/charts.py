"""The report's figures, drawn with plotly once each (the page embeds them, png_export.py writes them to PNG):
the Pareto front of tokens/s/GPU against peak memory, Optuna's parameter importance, predicted vs measured
throughput and memory, the winner's memory (predicted beside measured, GiB components only) and time breakdown,
the best-so-far curve, the GPU-hours per trial and, for a length family, the best layout per sequence length."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import optuna
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from search_spaces.layouts.layout import DEFAULT_FREE

from orchestrator.outputs.report.png_export import PNG_SIZE
from orchestrator.outputs.report.trial_series import (
    best_so_far,
    component_order,
    ok_points,
    pareto_front,
    predicted_measured,
    winner_breakdown,
)
from orchestrator.outputs.report.values import finite_number, layout_key, sig, trial_label
from orchestrator.outputs.winner import TrialView, views
from orchestrator.records import StudyRecord, TrialRecord
from orchestrator.storage import studies

FIGURES = ("pareto", "importance", "predicted_vs_measured", "winner_breakdown", "best_so_far", "gpu_hours")
_STATUS_COLORS = {"ok": "#1f77b4", "oom": "#d62728", "error": "#7f7f7f", "invalid": "#9467bd",
                  "timeout": "#ff7f0e", "infeasible": "#bcbd22", "interrupted": "#8c564b",
                  "unschedulable": "#17becf", "pruned": "#e377c2"}
_ROW_PX = 24  # one category of a horizontal bar chart: its label (12 px) and the gap to the next
# plotly's hover labels, like sig(): 4 significant digits, thousands separators, no e-notation (d3-format)
_HOVER_FORMAT = ",.4~r"


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

def _pareto_figure(trials: list[TrialView]) -> go.Figure:
    limit = trials[0].memory_limit_gib if trials else None
    fig = go.Figure()
    for status in sorted({v.status for v in trials if v.status is not None}):
        sel = [v for v in trials if v.status == status and finite_number(v.peak_memory_gib) is not None
               and finite_number(v.tokens_per_sec_per_gpu) is not None]
        if sel:
            fig.add_scatter(x=[v.peak_memory_gib for v in sel], y=[v.tokens_per_sec_per_gpu for v in sel],
                            mode="markers", name=status, text=[trial_label(v) for v in sel],
                            marker={"color": _STATUS_COLORS.get(status), "size": 9})
    front = pareto_front([p for p in ok_points(trials) if limit is None or p[0] <= limit])
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


def measured_snapshot(study: optuna.Study) -> optuna.Study:
    """An in-memory copy of the trials that measured a throughput (finished, status ok): what parameter importance
    learns from. A proposal the cost model rejected, a trial that failed or ran out of memory is told 0 tokens/s,
    which is no measurement. In memory: Optuna's importance reads every trial many times, and from a SQLite storage
    that is most of a report's time."""
    storage = studies.in_memory()
    storage.create_new_study(study.directions, study.study_name)
    copy = _Snapshot(study_name=study.study_name, storage=storage)
    copy.add_trials([t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                     if TrialRecord.of(t).status == "ok" and t.values and finite_number(t.values[0]) is not None])
    return copy


def searched_params(study: optuna.Study, measured: list[optuna.trial.FrozenTrial]) -> list[str]:
    """The parameters the sweep searched: the spec's free dimensions less its fixed ones (a study that recorded no
    spec: the default free ones), among those every measured trial has."""
    spec = StudyRecord.of(study).spec
    fixed = spec.get("fixed") or {}
    return [p for p in (spec.get("free") or DEFAULT_FREE)
            if p not in fixed and measured and all(p in t.params for t in measured)]


def _importance_figure(study: optuna.Study) -> go.Figure:
    measured = measured_snapshot(study)
    params = searched_params(study, measured.trials)
    fig = go.Figure()
    if len(measured.trials) < 2 or not params:
        why = (f"{len(measured.trials)} trial(s) measured a throughput; it needs 2" if params or not measured.trials
               else "the sweep searched no parameter (every one fixed)")
        fig.add_annotation(text=f"parameter importance unavailable: {why}", showarrow=False)
        fig.update_layout(title="Parameter importance (Optuna)")
        return fig
    try:
        with _negated_target_ok():
            fig = optuna.visualization.plot_param_importances(
                measured, params=params, target=_importance_target, target_name="tokens/s/GPU")
        fig.update_layout(title=f"Parameter importance for tokens/s/GPU (Optuna)<br><sup>{len(measured.trials)} "
                                f"measured trials, {len(params)} searched parameters</sup>")
        _one_row_per_bar(fig, len(params))
    except Exception as exc:  # noqa: BLE001 -- nothing varied: the figure says so instead
        fig.add_annotation(text=f"parameter importance unavailable: {exc}", showarrow=False)
        fig.update_layout(title="Parameter importance (Optuna)")
    return fig


def _one_row_per_bar(fig: go.Figure, rows: int, row_px: int = _ROW_PX, around_px: int = 170) -> None:
    """A horizontal bar chart tall enough for every category's label (`row_px` each; `around_px` for the title, the
    value axis and the margins), every label drawn (plotly skips every other one when rows are crowded), the
    labels' margin as wide as the longest, the values' text outside the bars at its own size."""
    fig.update_layout(height=max(PNG_SIZE[1], around_px + row_px * rows))
    fig.update_yaxes(dtick=1, automargin=True)
    fig.update_traces(constraintext="none", cliponaxis=False, selector={"type": "bar"})


def _importance_left_to_report(study: optuna.Study) -> go.Figure:
    fig = go.Figure().add_annotation(
        text=f"parameter importance: moe-autotune report {study.study_name} draws it<br>(its fANOVA loads "
             "scikit-learn, a second or two: left out of the page every sweep writes)", showarrow=False)
    fig.update_layout(title="Parameter importance (Optuna)")
    return fig


def _predicted_measured_figure(trials: list[TrialView]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s/GPU", "peak memory (GiB)"))
    for col, key in ((1, "tokens_per_sec_per_gpu"), (2, "peak_memory_gib")):
        pairs = predicted_measured(trials, key)
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
    """Top: each memory component in GiB, predicted beside measured. Below: predicted time per step. Horizontal bars,
    one labelled row per component (the names are long: upright beside their bars, never rotated into each other)."""
    pred_mem, meas_mem, pred_time = winner_breakdown(winner)
    keys = component_order(pred_mem, meas_mem)
    sides = sum(1 for values in (pred_mem, meas_mem) if values)  # bars per memory row
    mem_h = (_ROW_PX + 4 * max(sides - 1, 0)) * max(len(keys), 1)  # a memory row holds its two bars
    time_h = (_ROW_PX - 4) * max(len(pred_time), 1)
    gap = 90  # the memory chart's value axis and the time chart's title between the two
    fig = make_subplots(rows=2, cols=1, row_heights=[mem_h, time_h], vertical_spacing=gap / (mem_h + time_h + gap),
                        subplot_titles=("memory (GiB), predicted vs measured", "time per step (s), predicted"))
    for name, values in (("predicted", pred_mem), ("measured", meas_mem)):
        if values:  # None, not 0, where one side lacks a component: a gap rather than a false zero
            fig.add_bar(y=keys, x=[values.get(k) for k in keys], name=name, orientation="h", row=1, col=1)
    if pred_time:
        fig.add_bar(y=list(pred_time), x=list(pred_time.values()), name="predicted time", orientation="h",
                    row=2, col=1)
    fig.update_xaxes(title_text="GiB", row=1, col=1)
    fig.update_xaxes(title_text="s per step", row=2, col=1)
    fig.update_yaxes(autorange="reversed", dtick=1, automargin=True)  # the first component on top
    # the layout key is long: below the title, broken at its slashes into lines that fit the PNG's width; the
    # title hangs from the top, the plots start below its last line and the first plot's title
    title, lines = "Winner breakdown: no winner", 1
    if winner:
        key = _wrap(layout_key(winner), "/", 100)
        lines += key.count("<br>") + 1
        title = f"Winner breakdown: trial {winner.number}<br><sup>{key}</sup>"
    top = 20 + 23 * lines + 20
    fig.update_layout(title={"text": title, "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 20}},
                      barmode="group", margin={"t": top}, height=max(PNG_SIZE[1], top + mem_h + time_h + gap + 70))
    return fig


def _wrap(text: str, sep: str, width: int) -> str:
    """`text` broken after each `sep` where a line would pass `width` characters (a longer part keeps a line of its
    own), the lines joined by plotly's <br>."""
    lines: list[str] = []
    for part in text.split(sep):
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        elif lines:
            lines[-1] += sep
            lines.append(part)
        else:
            lines.append(part)
    return "<br>".join(lines)


def _best_so_far_figure(trials: list[TrialView]) -> go.Figure:
    curve = best_so_far(trials)
    ok = [(v.number, v.tokens_per_sec_per_gpu) for v in trials
          if v.status == "ok" and finite_number(v.tokens_per_sec_per_gpu) is not None]
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
        if not any(len(t.x or ()) or len(t.y or ()) for t in fig.data):
            # a note, not a chart: no empty axes (plotly's default ones put two "-1" on each other)
            fig.update_xaxes(visible=False)
            fig.update_yaxes(visible=False)
    return figs


# ---- spend, length family (issue 13) ----------------------------------------------------------------

def _gpu_hours_figure(trials: list[TrialView]) -> go.Figure:
    """GPU-hours each trial used, by fidelity, beside what it would have used at full size."""
    ran = [(v, used) for v in trials if (used := v.gpu_seconds[0]) is not None]  # (trial, GPU-seconds used)
    fig = go.Figure()
    for fidelity in ("full", "proxy"):
        sel = [(v, s) for v, s in ran if v.runs_at == fidelity]
        if sel:
            # the trial's layout on hover only: drawn as the bar's text it was shrunk to specks (issue 56)
            fig.add_bar(x=[v.number for v, _ in sel], y=[s / 3600 for _, s in sel], name=f"used ({fidelity})",
                        hovertext=[trial_label(v) for v, _ in sel])
    proxies = [(v, full) for v, _ in ran if v.proxy and (full := v.gpu_seconds[1])]  # (trial, at full size)
    if proxies:
        fig.add_scatter(x=[v.number for v, _ in proxies], y=[s / 3600 for _, s in proxies], mode="markers",
                        name="the same trial at full size", marker={"symbol": "line-ew-open", "size": 14})
    fig.update_layout(title="GPU-hours per trial (proxies ran on fewer GPUs)", xaxis_title="trial",
                      yaxis_title="GPU-hours", barmode="group")
    hours = [y for trace in fig.data for y in trace.y if y and y > 0]
    if hours and max(hours) > 100 * min(hours):  # proxies' bars would be slivers under their full-size marks
        fig.update_yaxes(type="log", title_text="GPU-hours (log scale)")
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
