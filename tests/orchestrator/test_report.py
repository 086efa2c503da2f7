"""`moe-autotune report`: the HTML page and PNGs, logged to the sweep's MLflow parent run, opened in Chromium."""

from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest

from search_spaces.cost.breakdown import COUNT_KEYS

from orchestrator.commands.cli import main
from orchestrator.outputs import report
from orchestrator.outputs.report import charts
from orchestrator.outputs.winner import views
from tests.orchestrator.test_promote import make_study

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# measurements with more digits than mean anything (the user saw "peak 0.8719635009765625 GiB")
ODD_TRIALS = [(dict(ep=4, gbs=8), "ok", 1234.5678, 0.8719635009765625),
              (dict(tp=2, ep=2, gbs=8), "ok", 987.654321, 1.23456789),
              (dict(gbs=8), "oom", None, None)]


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, pixels) of an 8-bit RGB or RGBA PNG, decoded with the standard library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and color in (2, 6), f"{path.name}: bit depth {depth}, colour type {color}"
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # undo the PNG row filter (None, Sub, Up, Average, Paeth)
            a, b = (line[i - bpp] if i >= bpp else 0), prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pred = (0, a, b, (a + b) // 2,
                    a if abs(p - a) <= min(abs(p - b), abs(p - c)) else b if abs(p - b) <= abs(p - c) else c)[kind]
            line[i] = (line[i] + pred) & 0xFF
        rows.append(line)
        prev = line
    return width, height, [bytes(r[i:i + bpp]) for r in rows for i in range(0, stride, bpp)]


def significant_digits(number: str) -> int:
    whole, _, frac = number.replace(",", "").partition(".")
    return len((whole + frac).lstrip("0")) if frac else len(whole.strip("0"))


def page_text(page: str) -> str:
    """What a reader sees printed: the page without its scripts (plotly.js, the figures' JSON) and styles."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_pareto_front_and_best_so_far(tmp_path):
    # (memory, tokens/s, trial): trial 3 is dominated by trial 1 (less memory, more throughput)
    front = report.pareto_front([(30, 1000, 0), (50, 1500, 1), (90, 2000, 2), (60, 1400, 3), (20, 1200, 4)])
    assert [p[2] for p in front] == [4, 1, 2]
    _, study = make_study(tmp_path)
    # trial 2 is faster but does not fit: it never raises the best-so-far
    assert report.best_so_far(views(study)) == [(0, 1000.0), (1, 1500.0), (2, 1500.0), (3, 1500.0),
                                                (4, 1500.0), (5, 1500.0)]


def write_report(tmp_path: Path, monkeypatch) -> tuple[Path, object, str]:
    """A report written through the CLI for a fake sweep whose parent MLflow run exists."""
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    parent = client.create_run(client.create_experiment("fake")).info.run_id
    storage, _ = make_study(tmp_path, parent_run_id=parent, tracking_uri=uri)
    out = tmp_path / "rep"
    assert main(["report", "fake", "--storage", storage, "--out", str(out)]) == 0
    return out, client, parent


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One report for the tests that only read it (writing one renders every PNG in Chromium)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return write_report(tmp_path_factory.mktemp("written"), monkeypatch)


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (CI installs it)")
def test_report_files_and_mlflow_artifacts(written):
    out, client, parent = written
    page = (out / "report.html").read_text()
    assert "Winner:</b> trial 1" in page  # the best that fits, not trial 2
    for name in report.FIGURES:
        width, height, pixels = png_pixels(out / f"{name}.png")
        # as wide as every PNG; a chart of one bar per row as tall as its rows need
        assert width == report.PNG_SIZE[0] and height >= report.PNG_SIZE[1]
        background, count = Counter(pixels).most_common(1)[0]
        # a drawn figure: several colours, and more than a sliver of the image off the background
        assert len(set(pixels)) >= 3 and len(pixels) - count > 0.01 * len(pixels), f"{name}.png is blank"
        assert f'<img class="png" alt="{name}" src="{name}.png">' in page and f'id="fig-{name}"' in page
    assert not re.search(r'<script[^>]*\bsrc="https?:', page)  # plotly.js is inlined: the page opens offline
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert logged == {"report/report.html", *(f"report/{n}.png" for n in report.FIGURES)}


@pytest.mark.timeout(120)
def test_report_without_a_browser_writes_the_page_and_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chrome"))
    out, client, parent = write_report(tmp_path, monkeypatch)
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "PNG" in line]
    assert notes == [f"note: PNGs skipped: no Chrome or Chromium at BROWSER_PATH={tmp_path / 'no-chrome'}"]
    assert "Traceback" not in err
    page = (out / "report.html").read_text()
    assert all(f'id="fig-{name}"' in page for name in report.FIGURES)
    assert "<img" not in page and "Static PNGs not written" in page
    assert not list(out.glob("*.png"))
    assert {a.path for a in client.list_artifacts(parent, "report")} == {"report/report.html"}


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(120)
def test_report_with_a_browser_that_does_not_start_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BROWSER_PATH", shutil.which("false"))
    out, _, _ = write_report(tmp_path, monkeypatch)
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "PNG" in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: PNGs skipped: the browser {shutil.which('false')} "
                                                   "did not start: ")
    assert "Traceback" not in err and (out / "report.html").is_file() and not list(out.glob("*.png"))


@pytest.mark.timeout(120)
def test_a_page_chrome_cannot_render_is_a_note_not_an_internal_error(tmp_path, monkeypatch, capsys):
    # kaleido raises JavascriptError when the page's scripts are not there yet ("kaleido_scopes is not
    # defined", seen on a loaded machine): the PNGs are skipped with a note, the page is still written
    import kaleido
    from kaleido.errors import JavascriptError

    def unrendered(*args, **kwargs):
        raise JavascriptError("ReferenceError: kaleido_scopes is not defined")

    monkeypatch.setattr(kaleido, "write_fig_from_object_sync", unrendered)
    out, _, _ = write_report(tmp_path, monkeypatch)
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "PNG" in line]
    assert notes == ["note: PNGs skipped: Chrome could not render the figures: "
                     "ReferenceError: kaleido_scopes is not defined"]
    assert "Traceback" not in err and (out / "report.html").is_file() and not list(out.glob("*.png"))


def test_sig_rounds_to_four_significant_digits():
    assert [report.sig(x) for x in (0.8719635009765625, 1234.5678, 475549.25, 9.99996, 80.0, 0.0, 0.00055253)] \
        == ["0.872", "1,235", "475,500", "10", "80", "0", "0.0005525"]


def test_memory_chart_plots_gib_components_only_predicted_beside_measured(tmp_path):
    # the cost model's breakdown carries parameter and microbatch counts beside the GiB components
    _, study = make_study(tmp_path, costmodel=True)
    trials = views(study)
    winner = next(v for v in trials if v.number == 1)
    assert winner.prediction["breakdown"]["memory_gib"]["params_on_rank"] > 1000
    fig = report.figures(study, trials, winner)["winner_breakdown"]
    memory = [t for t in fig.data if t.yaxis == "y"]  # the GiB subplot: one row of bars per component
    assert [t.name for t in memory] == ["predicted", "measured"] and fig.layout.barmode == "group"
    assert all(t.type == "bar" and t.orientation == "h" for t in memory) and memory[0].y == memory[1].y
    assert "weights" in memory[0].y and not set(memory[0].y) & set(COUNT_KEYS)
    # the axis range is set by memory: nothing on it exceeds the predicted peak (about 2.5 GiB)
    tallest = max(x for t in memory for x in t.x if x is not None)
    assert tallest <= winner.prediction["peak_memory_gib"]


@pytest.mark.timeout(120)
def test_no_number_in_the_page_has_more_than_four_significant_digits(tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chrome"))  # the page only: no PNGs needed
    _, study = make_study(tmp_path, trials=ODD_TRIALS, costmodel=True)
    text = page_text(report.write(study, tmp_path / "rep").html_path.read_text())
    assert "1,235 tokens/s/GPU, peak 0.872 GiB" in text
    numbers = re.findall(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?", text)
    assert "987.7" in numbers and "1.235" in numbers  # the table's rows are read too
    assert [n for n in numbers if significant_digits(n) > 4] == []


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (CI installs it)")
def test_report_opens_in_headless_chromium(written, tmp_path):
    out, _, _ = written
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=15000",
            "--dump-dom", (out / "report.html").as_uri()]
    dom = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=True).stdout
    # every plotly figure was drawn by the browser (plotly adds its svg only when its JS ran)
    for name in report.FIGURES:
        div = re.search(rf'<div id="fig-{name}"[^>]*class="[^"]*js-plotly-plot', dom)
        assert div, f"figure {name} was not rendered"
    assert dom.count('class="main-svg"') >= len(report.FIGURES)
    assert len(re.findall(r'<img class="png" alt="\w+" src="\w+\.png"', dom)) == len(report.FIGURES)
    assert "Pareto front" in dom


def test_the_page_escapes_what_it_did_not_write(tmp_path):
    # the page is a template with autoescape: names a user chose (here the model field of the study) are text
    # on the page, never markup; only plotly's own figure HTML goes in as it is
    _, study = make_study(tmp_path)
    study.set_user_attr("model", "<script>alert('x')</script>")
    page = report.write(study, tmp_path / "out", pngs=False).html_path.read_text()
    assert "<script>alert('x')</script>" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    assert '<section id="pareto">' in page and '<section id="trials">' in page and "<div id=\"fig-pareto\"" in page


def test_the_page_every_sweep_writes_leaves_the_importance_to_report(tmp_path, monkeypatch):
    """`moe-autotune report` draws Optuna's parameter importance; the page each sweep logs to its parent run names
    that command instead: the importance's fANOVA loads scikit-learn, seconds of every sweep."""
    from orchestrator.sweep import loop

    _, study = make_study(tmp_path)
    asked = []
    real = charts._importance_figure
    monkeypatch.setattr(charts, "_importance_figure", lambda s: asked.append(s) or real(s))
    full = report.write(study, tmp_path / "full", pngs=False)
    assert len(asked) == 1 and 'id="fig-importance"' in full.html_path.read_text()
    assert "Parameter importance" in full.html_path.read_text()

    logged = []

    class Tracker:  # the parent run's side of the sweep's end
        def log_views(self, leaderboard, pareto_figure, files):
            logged.extend((path.name, path.read_text()) for path in files)

    loop._log_views(Tracker(), study)
    (name, page), = logged
    assert name == "report.html" and len(asked) == 1  # no importance computed at the sweep's end
    assert 'id="fig-importance"' in page and f"moe-autotune report {study.study_name} draws it" in page
