"""Redraw the screenshots of docs/tour.md: a sweep's report figures and its MLflow view, made by the product itself.

    .venv/bin/python docs/make_figures.py [--out docs/figures]

Runs the README's what-if sweep (DeepSeek-V3 at 128K on 1,024 H100, analytic backend, so every figure is an
estimate) in a scratch folder, writes its report (`moe-autotune report`, whose PNGs need Chromium) and checks its
labels (orchestrator/outputs/report/label_check.py: none hidden, overlapping or cut off), starts the
MLflow UI on the sweep's store (`moe-autotune ui`) and photographs the trials view with headless Chromium. The
PNGs are committed (the site build does not run a sweep); tests/project/test_docs.py checks every figure the page
shows is one this script makes, and its slow test runs the script.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/deepseek-v3-128k-h100x1024.yaml"
TRIALS = "24"
# the report's figures the tour shows (orchestrator/outputs/report/charts.py FIGURES); predicted-vs-measured is left
# out: in an analytic sweep the two are the same number
REPORT_FIGURES = ("pareto", "importance", "winner_breakdown", "best_so_far")
MLFLOW_FIGURE = "mlflow_trials"
FIGURES = (*REPORT_FIGURES, MLFLOW_FIGURE)
WINDOW = "1900,900"  # wide enough for the metric columns beside the run names


def _cli() -> list[str]:
    """The installed command of the interpreter running this script."""
    return [str(Path(sys.executable).parent / "moe-autotune")]


def _env() -> dict[str, str]:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # the sweep's own embedded stores
        env.pop(var, None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium() -> str:
    for name in (os.environ.get("BROWSER_PATH", ""), "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name) if name else None
        if found:
            return found
    raise SystemExit("error: no Chromium on PATH or at $BROWSER_PATH: the figures are screenshots")


def _run(argv: list[str], cwd: Path) -> None:
    """A command of the product, quiet unless it fails (then its output and exit code)."""
    done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(argv[1:3])} exited {done.returncode}\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")


def _report(work: Path, out: Path) -> None:
    _run([*_cli(), "sweep", EXAMPLE, "--n-trials", TRIALS, "--seed", "0", "--quiet"], work)
    _run([*_cli(), "report", "--no-mlflow", "-o", str(work / "report")], work)
    # every label of every figure drawn, none over another or cut off, on the page and in each PNG
    from orchestrator.outputs.report.label_check import check_page

    failures = check_page(work / "report" / "report.html").failures()
    if failures:
        raise SystemExit("error: the report's figures fail the label check:\n" + "\n".join(failures))
    for name in REPORT_FIGURES:
        shutil.copyfile(work / "report" / f"{name}.png", out / f"{name}.png")


def _mlflow_view(work: Path, out: Path) -> None:
    ui = subprocess.Popen([*_cli(), "ui", "--port", str(_free_port())], cwd=work, env=_env(),
                          stdout=subprocess.PIPE, text=True)
    try:
        assert ui.stdout is not None
        url = next((line.strip() for line in ui.stdout if re.match(r"https?://", line)), None)
        if url is None:
            raise SystemExit(f"error: moe-autotune ui exited {ui.wait()} without printing its URL")
        # the UI is a single-page app: the virtual time budget lets it fetch and draw the runs before the shot
        subprocess.run([_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size={WINDOW}", "--virtual-time-budget=15000",
                        f"--screenshot={out / (MLFLOW_FIGURE + '.png')}", url],
                       check=True, capture_output=True, timeout=180)
    finally:
        ui.send_signal(signal.SIGINT)  # the ui's own Ctrl-C: it stops its server
        try:
            ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ui.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "figures", help="folder for the PNGs")
    out = parser.parse_args(argv).out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="moe-autotune-figures-") as scratch:
        work = Path(scratch)
        shutil.copytree(REPO / "examples", work / "examples")
        _report(work, out)
        _mlflow_view(work, out)
    print("\n".join(str(out / f"{name}.png") for name in FIGURES))


if __name__ == "__main__":
    main()
