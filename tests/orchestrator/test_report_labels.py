"""The report's figures are readable (issue 56, item 5): every label drawn, none over another, none cut off, none
shrunk past reading, in headless Chromium at the page's width and at each PNG's size
(orchestrator/outputs/report/label_check.py). Reported: every other parameter of the importance chart dropped, the
GPU-hours chart's text unreadable."""

from __future__ import annotations

import json
import math
import struct

import optuna
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from search_spaces.layouts.layout import DIMENSIONS

from orchestrator.commands.cli import main
from orchestrator.outputs.report import FIGURES, charts, label_check
from tests.sweep_helpers import spec_data

CHROMIUM = label_check.chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH or at $BROWSER_PATH (CI installs "
                                                             "Debian's chromium: scripts/setup.sh)")
SEARCHABLE = [d.name for d in DIMENSIONS if d.searchable]  # every dimension a sweep may search: the importance's rows


def _box(x0: float, y0: float, x1: float, y1: float) -> list[list[float]]:
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def _turned(cx: float, cy: float, w: float, h: float, degrees: float) -> list[list[float]]:
    """A w x h label centred on (cx, cy), turned by `degrees`."""
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    return [[cx + x * c - y * s, cy + x * s + y * c] for x, y in ((-w / 2, -h / 2), (w / 2, -h / 2),
                                                                 (w / 2, h / 2), (-w / 2, h / 2))]


def _label(text: str, quad: list[list[float]], group: str = "xtick", font_px: float = 12.0, clips=()) -> dict:
    return {"text": text, "group": group, "quad": quad, "font_px": font_px, "clips": list(clips)}


def _figure(*texts: dict, categories=(), hidden=()) -> dict:
    return {"id": "fig-x", "box": [0, 0, 1000, 500], "texts": list(texts), "categories": list(categories),
            "hidden": list(hidden)}


def test_labels_overlap_by_their_drawn_corners_not_their_upright_boxes():
    # touching (1 px): fine; covering each other by 5 px: an overlap
    assert label_check.problems(_figure(_label("a", _box(10, 10, 60, 25)), _label("b", _box(10, 24, 60, 39)))) == []
    assert label_check.problems(_figure(_label("a", _box(10, 10, 60, 25)), _label("b", _box(10, 20, 60, 35)))) \
        == ["overlap: 'a' (xtick) and 'b' (xtick)"]
    # two tick labels turned 45 degrees side by side: their upright boxes overlap, the labels do not
    left, right = _turned(100, 100, 120, 14, 45), _turned(130, 100, 120, 14, 45)
    assert label_check._upright(left)[2] > label_check._upright(right)[0]
    assert label_check.problems(_figure(_label("left", left), _label("right", right))) == []
    crossing = _turned(115, 100, 120, 14, -45)  # the same place turned the other way crosses both
    assert len(label_check.problems(_figure(_label("left", left), _label("x", crossing)))) == 1


def test_a_label_past_an_edge_shrunk_or_not_drawn_is_a_problem():
    past_figure = _label("a long title", _box(900, 5, 1100, 25), group="gtitle")
    past_clip = _label("legend entry", _box(10, 400, 80, 415), group="legendtext", clips=[_box(0, 300, 100, 410)])
    shrunk = _label("trial 3: tp2/cp8", _box(10, 100, 20, 102), group="bartext", font_px=0.2)
    found = label_check.problems(_figure(past_figure, past_clip, shrunk, hidden=["4"],
                                         categories=[{"axis": "yaxis", "asked": ["tp", "cp", "ep"],
                                                      "drawn": ["tp", "ep"]}]), view=(1280, 900))
    assert found == ["clipped: 'a long title' (gtitle) reaches 100 px past the right edge of the figure",
                     "clipped: 'legend entry' (legendtext) reaches 5 px past the bottom edge of its clip box",
                     "small: 'trial 3: tp2/cp8' (bartext) drawn at 0.2 px",
                     "hidden: yaxis draws 2 of its 3 categories (not drawn: cp)",
                     "hidden: tick label '4' not drawn"]
    # the window: the page's figure is as wide as the window's content
    assert label_check.problems(_figure(_label("t", _box(700, 5, 850, 25))), view=(800, 600)) \
        == ["clipped: 't' (xtick) reaches 50 px past the right edge of the window"]


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path.name
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow  # a family sweep, its report with PNGs and two Chromium checks: ~25 s on 2 cores
@pytest.mark.timeout(600)
@needs_chromium
def test_every_chart_of_a_report_passes_the_label_check(tmp_path, monkeypatch):
    """A length family of two lengths searching every dimension there is (21 rows of parameter importance), trials
    run as proxies on 2 of the 4 GPUs (the GPU-hours chart's full-size marks): every figure of the report, at two
    window widths and as its PNG."""
    monkeypatch.chdir(tmp_path)
    spec = spec_data(tmp_path, "labels", seq_len=[128, 256], free=SEARCHABLE, fixed={}, trial_gpus=2,
                     budget={"n_trials": 10})
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["sweep", str(tmp_path / "spec.json"), "--quiet"]) == 0
    out = tmp_path / "rep"
    assert main(["report", "labels", "--storage", spec["storage"], "--out", str(out), "--no-mlflow"]) == 0
    page = out / "report.html"
    assert f"{len(SEARCHABLE)} searched parameters" in page.read_text()
    for window in (label_check.WINDOW, (1024, 768)):
        result = label_check.check_page(page, window)
        assert set(result.shown) == set(result.png) == {*FIGURES, "length_family"}
        assert all(count >= 5 for count in result.label_counts.values()), result.label_counts  # drawn, read
        assert result.label_counts["importance"] >= len(SEARCHABLE)
        assert result.failures() == []
    for name, size in result.png_sizes.items():  # the check read each figure at the size its PNG has
        assert _png_size(out / f"{name}.png") == size, name


@pytest.mark.slow  # one Chromium check: a few seconds
@pytest.mark.timeout(300)
@needs_chromium
def test_the_check_finds_what_the_report_used_to_draw():
    """The figures as they were: 21 importance rows in 450 px (plotly drew every other name), bar texts shrunk to fit
    their bars, long rotated labels of two charts side by side, a title longer than the figure; and a report's
    figures before anything was measured pass."""
    names = [f"parameter_{i}" for i in range(21)]
    crowded = go.Figure(go.Bar(x=list(range(21)), y=names, orientation="h", text=[str(i) for i in range(21)],
                               textposition="outside"))
    shrunk = go.Figure(go.Bar(x=list(range(24)), y=[5 + i % 7 for i in range(24)],
                              text=[f"trial {i}: tp2/cp8/ep16/etp1/pp8/vpp6/mbs1/gbs1024" for i in range(24)]))
    side = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4])  # the winner's memory and time, as they were
    memory = ["weights", "gradients", "optimizer_states", "activations", "dispatcher_buffers", "cuda_graphs",
              "runtime_overhead", "allocator_margin", "cp_attention_buffers", "delta_net_chunk_states", "host_process",
              "activations_per_microbatch", "embedding_logits", "offloaded_to_host"]
    time = ["compute", "gemm", "attention", "elementwise", "recompute", "tp_comm", "cp_comm", "ep_comm",
            "dispatcher_overhead", "pp_comm", "launch_overhead", "pipeline_bubble", "dp_comm", "optimizer",
            "optimizer_offload", "host_contention"]
    for name in ("predicted", "measured"):
        side.add_bar(x=memory, y=[1.0] * len(memory), name=name, row=1, col=1)
    side.add_bar(x=time, y=[1.0] * len(time), name="predicted time", row=1, col=2)
    side.update_yaxes(title_text="GiB", row=1, col=1).update_yaxes(title_text="s per step", row=1, col=2)
    side.update_layout(barmode="group", margin={"t": 110})
    titled = go.Figure(go.Scatter(x=[1, 2], y=[1, 2])).update_layout(title="tp2/cp8/ep16/etp1/pp8/vpp6/mbs1/" * 6)
    # and a sweep with nothing to plot yet: notes, no empty axes (plotly's default ones set "-1" on "-1")
    empty = optuna.create_study(directions=["maximize", "minimize"], study_name="nothing-measured-yet")
    notes = {f"empty_{name}": fig for name, fig in charts.figures(empty, [], None, importance=False).items()}
    result = label_check.check_figures({"crowded": crowded, "shrunk": shrunk, "side": side, "titled": titled,
                                        **notes})
    assert [p for name in notes for p in result.shown[name] + result.png[name]] == []
    kinds = {name: {p.split(":")[0] for p in found} for name, found in result.shown.items()}
    png_kinds = {name: {p.split(":")[0] for p in found} for name, found in result.png.items()}
    assert "hidden" in kinds["crowded"], result.shown["crowded"]
    assert "small" in kinds["shrunk"] and "small" in png_kinds["shrunk"], result.shown["shrunk"]
    assert "overlap" in png_kinds["side"], result.png["side"]  # at the PNG's 1000 px, not the window's 1216
    assert "clipped" in kinds["titled"] and "clipped" in png_kinds["titled"], result.shown["titled"]
    assert result.png_sizes == {name: (1000, 500) for name in result.png}
