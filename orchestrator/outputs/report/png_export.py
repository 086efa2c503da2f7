"""The report's figures as PNG files (`export_pngs`): every figure in one headless Chrome session, through kaleido.
Kaleido finds Chrome/Chromium at $BROWSER_PATH or on PATH; without one no PNG is written and the note says why."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

PNG_SIZE = (1000, 500)  # width, height in pixels: a figure that sets its own height (one bar per row) keeps it


def png_size(fig: go.Figure) -> tuple[int, int]:
    """The PNG's (width, height): PNG_SIZE, but the figure's own height where it set one."""
    return PNG_SIZE[0], int(fig.layout.height or PNG_SIZE[1])


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
    specs = [{"fig": fig, "path": paths[name], "opts": {"format": "png", "width": width, "height": height}}
             for name, fig in figs.items() for width, height in [png_size(fig)]]
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
