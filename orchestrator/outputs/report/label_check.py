"""Are the report's figures readable? Every label of every plotly figure, as headless Chromium draws it.

`check_page` opens a report page (or `check_figures` a page of figure objects) in headless Chromium at a window
width, lets plotly draw, and reads every SVG <text> plotly drew (tick labels, axis and figure titles, legend entries,
annotations, bar texts): its box on screen (the four corners: rotated labels stay rotated) and the font size it is
drawn at. Then it does the same with every figure at the size of its PNG (png_export.png_size), as kaleido draws it.
A problem is one of:

- overlap: two labels of a figure cover each other (by more than `OVERLAP_PX` both ways);
- clipped: a label reaches past its figure's edge, the window's, or the clip box plotly drew it in (a scrolled legend);
- hidden: a category axis draws fewer labels than it has categories (plotly skips every other one when crowded),
  or a tick label plotly hid (display: none);
- small: a label drawn below `MIN_FONT_PX` (plotly shrinks a bar's text to fit inside the bar).

Chromium is driven with its own command line (`--dump-dom` after a script the check adds to a copy of the page),
no client library; Chromium comes from $BROWSER_PATH or PATH, as for the PNGs.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import plotly.graph_objects as go

from orchestrator.outputs.report.png_export import PNG_SIZE

WINDOW = (1280, 900)  # the window a report is read in: a laptop's (the page's width follows it)
OVERLAP_PX = 2.0  # two labels overlap when they cover each other by more than this, both ways
CLIP_PX = 1.0  # a label may reach this far past an edge (antialiasing, rounding)
MIN_FONT_PX = 9.0  # below this a label is unreadable (plotly's default font is 12 px)
_MARK = "label-check"

# Runs after the page's own scripts: waits for plotly to draw, reads every label of every figure at the shown size,
# then relayouts each figure to its PNG size and reads them again; writes the lot as JSON into <pre id=label-check>.
_SCRIPT = r"""
<script>
(function () {
  const PNG = __PNG__;
  const MARK = "__MARK__";
  function shown(el) {
    for (let n = el; n && n.nodeType === 1; n = n.parentNode) {
      const s = getComputedStyle(n);
      if (s.display === "none" || s.visibility === "hidden" || parseFloat(s.opacity) === 0) return false;
    }
    return true;
  }
  function corners(m, x, y, w, h) {
    return [[x, y], [x + w, y], [x + w, y + h], [x, y + h]].map(
      ([px, py]) => [m.a * px + m.c * py + m.e, m.b * px + m.d * py + m.f]);
  }
  function group(el) {  // what plotly calls the label: the class of the nearest classed ancestor
    for (let n = el; n && n.nodeType === 1; n = n.parentNode) {
      const c = n.getAttribute("class");
      if (c && !/^(main-svg|user-select-none|svg-container)/.test(c)) return c.split(" ")[0];
    }
    return "";
  }
  function clips(el, svg) {  // the boxes plotly clips the label to (clip-path on the label or an ancestor)
    const out = [];
    for (let n = el; n && n !== svg && n.nodeType === 1; n = n.parentNode) {
      const ref = n.getAttribute("clip-path");
      const id = ref && (ref.match(/#([^'")]+)/) || [])[1];
      const rect = id && document.getElementById(id) && document.getElementById(id).querySelector("rect");
      if (!rect) continue;
      const num = (a) => parseFloat(rect.getAttribute(a) || "0");
      out.push(corners(n.getScreenCTM(), num("x"), num("y"), num("width"), num("height")));
    }
    return out;
  }
  function read(gd) {
    const box = gd.querySelector("svg.main-svg").getBoundingClientRect();  // the figure as drawn
    const texts = [], hidden = [];
    for (const t of gd.querySelectorAll("svg.main-svg text")) {
      const words = (t.textContent || "").trim();
      if (!words) continue;
      const tick = /^[xy]\d*tick$/.test(t.parentNode.getAttribute("class") || "");
      if (!shown(t)) { if (tick) hidden.push(words); continue; }
      const b = t.getBBox();
      if (b.width === 0 && b.height === 0) continue;
      const m = t.getScreenCTM();
      const scale = Math.sqrt(Math.abs(m.a * m.d - m.b * m.c));
      let px = parseFloat(getComputedStyle(t).fontSize);
      for (const s of t.querySelectorAll("tspan")) {
        if ((s.textContent || "").trim()) px = Math.min(px, parseFloat(getComputedStyle(s).fontSize));
      }
      texts.push({text: words, group: group(t), quad: corners(m, b.x, b.y, b.width, b.height),
                  font_px: px * scale, clips: clips(t, gd)});
    }
    const categories = [];
    const fl = gd._fullLayout;
    for (const key of Object.keys(fl)) {
      if (!/^[xy]axis\d*$/.test(key)) continue;
      const ax = fl[key];
      if (!ax || !ax.visible || !ax.showticklabels || ax.type !== "category") continue;
      const [lo, hi] = [Math.min(...ax.range), Math.max(...ax.range)];
      const asked = (ax._categories || []).filter((c, i) => i >= lo && i <= hi).map(String);
      const drawn = [];
      for (const t of gd.querySelectorAll("g." + ax._id + "tick text")) {
        if (shown(t) && (t.textContent || "").trim()) drawn.push(t.textContent.trim());
      }
      categories.push({axis: key, asked: asked, drawn: drawn});
    }
    return {id: gd.id, box: [box.left, box.top, box.right, box.bottom], texts: texts, hidden: hidden,
            categories: categories};
  }
  function write(result) {
    const pre = document.createElement("pre");
    pre.id = MARK;
    pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  }
  async function run() {
    const gds = Array.from(document.querySelectorAll(".js-plotly-plot"));
    const view = [document.documentElement.clientWidth, window.innerHeight];
    const shownAt = gds.map(read);
    const png = [];
    for (const gd of gds) {
      const size = [PNG[0], gd.layout.height || PNG[1]];
      await Plotly.relayout(gd, {width: size[0], height: size[1]});
      const r = read(gd);
      r.size = size;
      png.push(r);
    }
    write({view: view, shown: shownAt, png: png});
  }
  window.addEventListener("load", () => setTimeout(() => run().catch(
    (e) => write({error: String(e && e.stack || e)})), 500));
})();
</script>
"""


@dataclass
class Label:
    text: str
    group: str  # plotly's class for it: xtick, ytick, legendtext, gtitle, annotation-text, bartext, ...
    quad: list[tuple[float, float]]  # its four corners on screen, px
    font_px: float
    clips: list[list[tuple[float, float]]] = field(default_factory=list)

    def name(self) -> str:
        text = self.text if len(self.text) <= 40 else self.text[:37] + "..."
        return f"{text!r} ({self.group})"


def chromium() -> str | None:
    """The Chromium the PNGs use: $BROWSER_PATH, else chromium, chromium-browser or google-chrome on PATH."""
    for name in (os.environ.get("BROWSER_PATH", ""), "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def _separated(a: list[tuple[float, float]], b: list[tuple[float, float]], margin: float) -> bool:
    """Whether the convex quads a and b cover each other by at most `margin` px along some axis of either (SAT)."""
    for quad in (a, b):
        for i in range(4):
            (x0, y0), (x1, y1) = quad[i], quad[(i + 1) % 4]
            nx, ny = y0 - y1, x1 - x0
            norm = (nx * nx + ny * ny) ** 0.5
            if norm == 0:
                continue
            pa = [(x * nx + y * ny) / norm for x, y in a]
            pb = [(x * nx + y * ny) / norm for x, y in b]
            if min(max(pa), max(pb)) - max(min(pa), min(pb)) <= margin:
                return True
    return False


def _past(quad: list[tuple[float, float]], box: tuple[float, float, float, float]) -> str | None:
    """How far a label's corners reach past an upright box (left, top, right, bottom), if past it by > CLIP_PX."""
    left, top, right, bottom = box
    xs, ys = [p[0] for p in quad], [p[1] for p in quad]
    gaps = {"left": left - min(xs), "top": top - min(ys), "right": max(xs) - right, "bottom": max(ys) - bottom}
    worst = max(gaps, key=lambda k: gaps[k])
    return f"{gaps[worst]:.0f} px past the {worst} edge" if gaps[worst] > CLIP_PX else None


def _upright(quad: Sequence[Sequence[float]]) -> tuple[float, float, float, float]:
    xs, ys = [p[0] for p in quad], [p[1] for p in quad]
    return min(xs), min(ys), max(xs), max(ys)


def problems(figure: dict[str, Any], view: tuple[float, float] | None = None) -> list[str]:
    """What is wrong with the labels of one figure as read by the page's script; [] when all are readable."""
    out = []
    labels = [Label(t["text"], t["group"], [tuple(p) for p in t["quad"]], t["font_px"],
                    [[tuple(p) for p in c] for c in t["clips"]]) for t in figure["texts"]]
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            if not _separated(a.quad, b.quad, OVERLAP_PX):
                out.append(f"overlap: {a.name()} and {b.name()}")
    edges = [("the figure", tuple(figure["box"]))]
    if view:
        edges.append(("the window", (0.0, -1e9, float(view[0]), 1e9)))
    for label in labels:
        boxes = edges + [("its clip box", _upright(c)) for c in label.clips]
        for what, box in boxes:
            if (gap := _past(label.quad, box)):
                out.append(f"clipped: {label.name()} reaches {gap} of {what}")
                break
        if label.font_px < MIN_FONT_PX:
            out.append(f"small: {label.name()} drawn at {label.font_px:.1f} px")
    for axis in figure["categories"]:
        missing = [c for c in axis["asked"] if c not in axis["drawn"]]
        if missing:
            shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
            out.append(f"hidden: {axis['axis']} draws {len(axis['asked']) - len(missing)} of its "
                       f"{len(axis['asked'])} categories (not drawn: {shown})")
    out.extend(f"hidden: tick label {text!r} not drawn" for text in figure["hidden"])
    return out


@dataclass
class Result:
    """Per figure (its div id less 'fig-'): the problems at the shown size and at the PNG size."""
    window: tuple[int, int]
    shown: dict[str, list[str]]
    png: dict[str, list[str]]
    png_sizes: dict[str, tuple[int, int]]
    label_counts: dict[str, int]  # labels read per figure, at the shown size

    def failures(self) -> list[str]:
        return ([f"{name} at {self.window[0]} px window: {p}" for name, ps in self.shown.items() for p in ps]
                + [f"{name} as PNG {w}x{h}: {p}" for name, ps in self.png.items()
                   for (w, h) in [self.png_sizes[name]] for p in ps])


def _figure_name(div_id: str) -> str:
    return div_id.removeprefix("fig-")


def check_page(page: str | Path, window: tuple[int, int] = WINDOW, browser: str | None = None,
               timeout_s: float = 120) -> Result:
    """Open the report page `page` in headless Chromium at `window` and read every figure's labels at that size
    and at its PNG size. Raises RuntimeError when Chromium is missing or the page's script did not report."""
    browser = browser or chromium()
    if browser is None:
        raise RuntimeError("no Chromium on PATH or at $BROWSER_PATH: the label check draws the figures in it")
    page = Path(page)
    script = _SCRIPT.replace("__PNG__", json.dumps(list(PNG_SIZE))).replace("__MARK__", _MARK)
    text = page.read_text()
    at = text.rfind("</body>")
    text = text[:at] + script + text[at:] if at >= 0 else text + script
    with tempfile.TemporaryDirectory(prefix="label-check-") as scratch:
        copy = Path(scratch) / "page.html"  # the labels need no file beside the page (its PNGs stay folded)
        copy.write_text(text)
        argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                "--hide-scrollbars", f"--user-data-dir={Path(scratch) / 'profile'}",
                f"--window-size={window[0]},{window[1]}", "--virtual-time-budget=20000", "--dump-dom",
                copy.as_uri()]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    found = re.search(rf'<pre id="{_MARK}">(.*?)</pre>', done.stdout, re.S)
    if not found:
        raise RuntimeError(f"the label check's script did not report (Chromium exited {done.returncode}): "
                           f"{done.stderr.strip()[-500:]}")
    data = json.loads(html.unescape(found.group(1)))
    if "error" in data:
        raise RuntimeError(f"the label check's script failed: {data['error']}")
    view = tuple(data["view"])
    return Result(window=window,
                  shown={_figure_name(f["id"]): problems(f, view) for f in data["shown"]},
                  png={_figure_name(f["id"]): problems(f) for f in data["png"]},
                  png_sizes={_figure_name(f["id"]): tuple(f["size"]) for f in data["png"]},
                  label_counts={_figure_name(f["id"]): len(f["texts"]) for f in data["shown"]})


def check_figures(figs: dict[str, go.Figure], window: tuple[int, int] = WINDOW, browser: str | None = None,
                  timeout_s: float = 120) -> Result:
    """check_page for figure objects: one page with each figure as the report embeds it."""
    with tempfile.TemporaryDirectory(prefix="label-check-page-") as scratch:
        divs = "".join(f'<section>{fig.to_html(full_html=False, include_plotlyjs=i == 0, div_id=f"fig-{name}")}'
                       "</section>" for i, (name, fig) in enumerate(figs.items()))
        page = Path(scratch) / "figures.html"
        page.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{{font-family:sans-serif;'
                        f'margin:2em}}</style></head><body>{divs}</body></html>')
        return check_page(page, window, browser, timeout_s)
