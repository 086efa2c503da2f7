"""`moe-autotune report`: the HTML page and PNGs, logged to the sweep's MLflow parent run, opened in Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from orchestrator import report
from orchestrator.cli import main
from tests.test_promote import make_study

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_pareto_front_and_best_so_far(tmp_path):
    # (memory, tokens/s, trial): trial 3 is dominated by trial 1 (less memory, more throughput)
    front = report.pareto_front([(30, 1000, 0), (50, 1500, 1), (90, 2000, 2), (60, 1400, 3), (20, 1200, 4)])
    assert [p[2] for p in front] == [4, 1, 2]
    _, study = make_study(tmp_path)
    # trial 2 is faster but does not fit: it never raises the best-so-far
    assert report.best_so_far(report.views(study)) == [(0, 1000.0), (1, 1500.0), (2, 1500.0), (3, 1500.0),
                                                       (4, 1500.0), (5, 1500.0)]


@pytest.fixture
def written(tmp_path, monkeypatch):
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


@pytest.mark.timeout(300)
def test_report_files_and_mlflow_artifacts(written):
    import matplotlib.image

    out, client, parent = written
    page = (out / "report.html").read_text()
    assert "Winner:</b> trial 1" in page  # the best that fits, not trial 2
    for name in report.FIGURES:
        png = out / f"{name}.png"
        pixels = matplotlib.image.imread(png)
        assert pixels.shape[0] > 100 and pixels.std() > 0.01, f"{name}.png is blank"
        assert f'src="{name}.png"' in page and f'id="fig-{name}"' in page
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert logged == {"report/report.html", *(f"report/{n}.png" for n in report.FIGURES)}


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
