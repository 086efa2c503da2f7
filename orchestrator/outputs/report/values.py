"""How the report reads a trial's number (`finite_number`: a finite float or None) and writes one (`sig`: four
significant digits, as every number on the page and in the figures' hover labels), and how it names a trial."""

from __future__ import annotations

import math
from typing import Any

from orchestrator.outputs.winner import TrialView


def sig(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits with thousands separators: 0.872, 1,235, 475,500."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    text = f"{round(value, decimals):,.{max(decimals, 0)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def finite_number(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def layout_key(v: TrialView) -> str:
    return v.layout.key() if v.layout else "?"


def trial_label(v: TrialView) -> str:
    return f"trial {v.number}: {layout_key(v)}"
