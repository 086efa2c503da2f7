"""The sweep report: why the winner won, as one HTML page (interactive plotly) plus PNGs (matplotlib).

Figures: the Pareto front of tokens/s/GPU against peak memory, Optuna's parameter importance, predicted vs
measured throughput and memory, the winner's memory and time breakdown, and the best-so-far curve.
PNGs are drawn with matplotlib: kaleido 1.x installs but needs a Chrome at run time and starts it for
every image, too slow and fragile on a shared CI machine. The HTML embeds plotly.js, so it opens offline.
"""

from __future__ import annotations

import contextlib
import html
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import optuna
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from orchestrator.winner import TrialView, views

FIGURES = ("pareto", "importance", "predicted_vs_measured", "winner_breakdown", "best_so_far")
_STATUS_COLORS = {"ok": "#1f77b4", "oom": "#d62728", "error": "#7f7f7f", "invalid": "#9467bd",
                  "timeout": "#ff7f0e", "infeasible": "#bcbd22", "interrupted": "#8c564b"}


@dataclass
class Report:
    html_path: Path
    pngs: dict[str, Path]
    winner: TrialView | None


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
        pred, meas = _num(v.prediction.get(key)), _num(v.result.get(key))
        if v.status == "ok" and pred is not None and meas is not None:
            pairs.append((pred, meas, v.number))
    return pairs


def _breakdown(view: TrialView | None) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(predicted memory GiB, measured memory GiB, predicted time s) components of the winner."""
    if view is None:
        return {}, {}, {}
    bd = view.prediction.get("breakdown") or {}
    clean = lambda d: {k: float(v) for k, v in (d or {}).items() if _num(v) is not None}  # noqa: E731
    return clean(bd.get("memory_gib")), clean(view.result.get("memory_gib")), clean(bd.get("time_s"))


def _importance_target(trial: optuna.trial.FrozenTrial) -> float:
    # Optuna's default evaluator (PED-ANOVA) ranks what makes the target *low*: negate tokens/s
    return -trial.values[0] if trial.values else float("nan")


@contextlib.contextmanager
def _negated_target_ok() -> Iterator[None]:
    """Silence Optuna's reminder to negate the target: _importance_target already does."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes")
        yield


# ---- plotly (the HTML page) -------------------------------------------------------------------------

def _label(v: TrialView) -> str:
    return f"trial {v.number}: {v.layout.key() if v.layout else '?'}"


def figures(study: optuna.Study, trials: list[TrialView], winner: TrialView | None) -> dict[str, go.Figure]:
    figs: dict[str, go.Figure] = {}
    limit = trials[0].memory_limit_gib if trials else None

    fig = go.Figure()
    for status in sorted({v.status for v in trials}):
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
        fig.add_vline(x=limit, line_dash="dash", annotation_text=f"GPU memory {limit:g} GiB")
    fig.update_layout(title="Pareto front: tokens/s/GPU vs peak memory", xaxis_title="peak memory (GiB)",
                      yaxis_title="tokens/s/GPU")
    figs["pareto"] = fig

    try:
        with _negated_target_ok():
            fig = optuna.visualization.plot_param_importances(
                study, target=_importance_target, target_name="tokens/s/GPU")
        fig.update_layout(title="Parameter importance for tokens/s/GPU (Optuna)")
    except Exception as exc:  # too few trials, or nothing varied
        fig = go.Figure().add_annotation(text=f"parameter importance unavailable: {exc}", showarrow=False)
        fig.update_layout(title="Parameter importance (Optuna)")
    figs["importance"] = fig

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
    figs["predicted_vs_measured"] = fig

    pred_mem, meas_mem, pred_time = _breakdown(winner)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("memory (GiB)", "time per step (s), predicted"))
    if pred_mem:
        fig.add_bar(x=list(pred_mem), y=list(pred_mem.values()), name="predicted memory", row=1, col=1)
    if meas_mem:
        fig.add_bar(x=list(meas_mem), y=list(meas_mem.values()), name="measured memory", row=1, col=1)
    if pred_time:
        fig.add_bar(x=list(pred_time), y=list(pred_time.values()), name="predicted time", row=1, col=2)
    fig.update_layout(title=f"Winner breakdown: {_label(winner) if winner else 'no winner'}", barmode="group")
    figs["winner_breakdown"] = fig

    curve = best_so_far(trials)
    fig = go.Figure()
    ok = [(v.number, v.tokens_per_sec_per_gpu) for v in trials
          if v.status == "ok" and _num(v.tokens_per_sec_per_gpu) is not None]
    fig.add_scatter(x=[p[0] for p in ok], y=[p[1] for p in ok], mode="markers", name="trial")
    fig.add_scatter(x=[p[0] for p in curve], y=[p[1] for p in curve], mode="lines", name="best so far",
                    line={"shape": "hv"})
    fig.update_layout(title="Best tokens/s/GPU so far", xaxis_title="trial", yaxis_title="tokens/s/GPU")
    figs["best_so_far"] = fig
    return figs


# ---- matplotlib (the PNGs) --------------------------------------------------------------------------

def _pngs(study: optuna.Study, trials: list[TrialView], winner: TrialView | None, out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}
    limit = trials[0].memory_limit_gib if trials else None

    def save(name: str, fig) -> None:
        fig.tight_layout()
        paths[name] = out / f"{name}.png"
        fig.savefig(paths[name], dpi=90)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for status in sorted({v.status for v in trials}):
        sel = [v for v in trials if v.status == status and _num(v.peak_memory_gib) is not None
               and _num(v.tokens_per_sec_per_gpu) is not None]
        if sel:
            ax.scatter([v.peak_memory_gib for v in sel], [v.tokens_per_sec_per_gpu for v in sel],
                       label=status, color=_STATUS_COLORS.get(status))
    front = pareto_front([p for p in _ok_points(trials) if limit is None or p[0] <= limit])
    if front:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", label="Pareto front")
    if limit:
        ax.axvline(limit, linestyle="--", color="gray", label=f"GPU memory {limit:g} GiB")
    ax.set(xlabel="peak memory (GiB)", ylabel="tokens/s/GPU", title="Pareto front")
    ax.legend(fontsize=8)
    save("pareto", fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        with _negated_target_ok():
            imp = optuna.importance.get_param_importances(study, target=_importance_target)
        names = list(imp)[::-1]
        ax.barh(names, [imp[n] for n in names])
        ax.set(xlabel="importance for tokens/s/GPU", title="Parameter importance (Optuna, PED-ANOVA)")
    except Exception as exc:
        ax.text(0.5, 0.5, f"parameter importance unavailable:\n{exc}", ha="center", va="center", wrap=True)
        ax.set_axis_off()
    save("importance", fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, key, title in ((axes[0], "tokens_per_sec_per_gpu", "tokens/s/GPU"),
                           (axes[1], "peak_memory_gib", "peak memory (GiB)")):
        pairs = _predicted_measured(trials, key)
        if pairs:
            ax.scatter([p[0] for p in pairs], [p[1] for p in pairs])
            lo = min(min(p[0], p[1]) for p in pairs)
            hi = max(max(p[0], p[1]) for p in pairs)
            ax.plot([lo, hi], [lo, hi], linestyle=":", color="gray")
        ax.set(xlabel="predicted", ylabel="measured", title=title)
    save("predicted_vs_measured", fig)

    pred_mem, meas_mem, pred_time = _breakdown(winner)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    keys = list(dict.fromkeys([*pred_mem, *meas_mem]))
    xs = range(len(keys))
    axes[0].bar([x - 0.2 for x in xs], [pred_mem.get(k, 0) for k in keys], width=0.4, label="predicted")
    axes[0].bar([x + 0.2 for x in xs], [meas_mem.get(k, 0) for k in keys], width=0.4, label="measured")
    axes[0].set_xticks(list(xs), keys, rotation=40, ha="right", fontsize=7)
    axes[0].set(ylabel="GiB", title="winner memory")
    axes[0].legend(fontsize=8)
    axes[1].bar(list(pred_time), list(pred_time.values()))
    axes[1].tick_params(axis="x", labelrotation=40, labelsize=7)
    axes[1].set(ylabel="s per step", title="winner time (predicted)")
    save("winner_breakdown", fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    curve = best_so_far(trials)
    ok = [(v.number, v.tokens_per_sec_per_gpu) for v in trials
          if v.status == "ok" and _num(v.tokens_per_sec_per_gpu) is not None]
    ax.scatter([p[0] for p in ok], [p[1] for p in ok], label="trial", s=12)
    if curve:
        ax.step([p[0] for p in curve], [p[1] for p in curve], where="post", label="best so far")
    ax.set(xlabel="trial", ylabel="tokens/s/GPU", title="Best tokens/s/GPU so far")
    ax.legend(fontsize=8)
    save("best_so_far", fig)
    return paths


# ---- the page -----------------------------------------------------------------------------------

def _table(trials: list[TrialView], limit: int = 50) -> str:
    rows = sorted(trials, key=lambda v: (v.status != "ok", -(_num(v.tokens_per_sec_per_gpu) or 0)))[:limit]
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            v.number, v.status, v.layout.key() if v.layout else "",
            f"{v.tokens_per_sec_per_gpu:.1f}" if _num(v.tokens_per_sec_per_gpu) is not None else "",
            f"{v.peak_memory_gib:.2f}" if _num(v.peak_memory_gib) is not None else "",
            v.backend, v.reason or "")) + "</tr>" for v in rows)
    head = "".join(f"<th>{h}</th>" for h in ("trial", "status", "layout", "tokens/s/GPU", "peak GiB",
                                              "backend", "reason"))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>"


def write(study: optuna.Study, out_dir: str | Path) -> Report:
    """report.html and one PNG per figure in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trials = views(study)
    fitting = [v for v in trials if v.status == "ok" and v.fits and _num(v.tokens_per_sec_per_gpu) is not None]
    winner = max(fitting, key=lambda v: v.tokens_per_sec_per_gpu, default=None)
    figs = figures(study, trials, winner)
    pngs = _pngs(study, trials, winner, out)

    attrs = study.user_attrs
    title = f"moe-autotune report: {study.study_name}"
    summary = (f"model {attrs.get('model')} · seq_len {attrs.get('seq_len')} · {attrs.get('num_gpus')}× "
               f"{attrs.get('gpu')} · backend {attrs.get('backend')} · {len(trials)} trials")
    won = (f"<p><b>Winner:</b> {html.escape(_label(winner))} — {winner.tokens_per_sec_per_gpu:.1f} tokens/s/GPU, "
           f"peak {winner.peak_memory_gib if winner.peak_memory_gib is not None else '?'} GiB</p>"
           if winner else "<p><b>No trial succeeded and fits.</b></p>")
    sections = []
    for i, name in enumerate(FIGURES):
        div = figs[name].to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"fig-{name}")
        sections.append(f'<section id="{name}"><h2>{name.replace("_", " ")}</h2>{div}'
                        f'<details><summary>static image ({pngs[name].name})</summary>'
                        f'<img class="png" alt="{name}" src="{pngs[name].name}"></details></section>')
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} img.png{{max-width:48%;border:1px solid #ddd}}
table{{border-collapse:collapse;font-size:12px}} td,th{{border:1px solid #ccc;padding:2px 6px}}</style>
</head><body>
<h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>{won}
{''.join(sections)}
<section id="trials"><h2>trials</h2>{_table(trials)}</section>
</body></html>
"""
    html_path = out / "report.html"
    html_path.write_text(page, encoding="utf-8")
    return Report(html_path, pngs, winner)


def log_to_mlflow(report: Report, parent_run_id: str) -> None:
    """Attach the page and PNGs to the sweep's parent run (tracking URI already set)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    client.log_artifact(parent_run_id, str(report.html_path), "report")
    for path in report.pngs.values():
        client.log_artifact(parent_run_id, str(path), "report")
