"""The sweep report: why the winner won, as one HTML page plus one PNG per figure, all drawn with plotly.

Each figure is built once (charts.py, from the series of trial_series.py): the page embeds it (page.py; plotly.js
inlined once, so the page opens offline) and kaleido exports the same object to PNG, every figure in one headless
Chrome session (png_export.py). Kaleido finds Chrome/Chromium at $BROWSER_PATH or on PATH; without one the page is
still written and the PNGs are skipped with a note saying why. values.py says how a number is read and written.
label_check.py opens a page in headless Chromium and reads every label plotly drew: none hidden, overlapping, cut off
or too small to read, on the page and at each PNG's size (png_export.png_size: a figure's own height where it set one).
This package's names are the report API: each is imported here from the module that owns it.
"""

from __future__ import annotations

from orchestrator.outputs.report.charts import FIGURES, figures, pareto_figure
from orchestrator.outputs.report.label_check import check_figures, check_page
from orchestrator.outputs.report.page import Report, headline, log_to_mlflow, write
from orchestrator.outputs.report.png_export import PNG_SIZE, export_pngs, png_size
from orchestrator.outputs.report.trial_series import best_so_far, memory_components, pareto_front
from orchestrator.outputs.report.values import sig

__all__ = ["FIGURES", "PNG_SIZE", "Report", "best_so_far", "check_figures", "check_page", "export_pngs", "figures",
           "headline", "log_to_mlflow", "memory_components", "pareto_figure", "pareto_front", "png_size", "sig",
           "write"]
