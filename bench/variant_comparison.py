"""Two end-to-end fits side by side (issue 57, item 2): every GEMM term fitted to the published rows, and Hopper's
GEMM terms read from the kernel tables (search_spaces/calibration/kernel_pins.py) with the rest fitted.

bench/estimator_accuracy.py runs each variant (bench/fit_calibration.py's `Variant`) the same way -- fitted on the
declared fit half, its folds refitted with its own parameter vector -- and this module lays their figures beside
each other: the held-out half, the long-context MoE rows, every leave-one-out fold, the means, the generalisation
columns, the knob pairs (the precision ones apart: FP8 pairs must keep their direction) and the number of constants
fitted to end-to-end rows. `holds` applies the validation that decides which variant the product ships.
"""

from __future__ import annotations

from typing import Any

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.calibration.knob_pairs import load_knob_pairs, predicted_ratio

from bench.knob_effects import direction_right

# the validation a variant must hold to ship (issue 57): leave-one-source-out mean and worst source fold, % MAPE
SOURCE_MEAN_LIMIT, SOURCE_MAX_LIMIT = 12.0, 16.0
# a held-out figure that moves by no more than this is the same (house rule)
SAME_WITHIN = 0.1


def knob_figures(cal: Calibration) -> dict[str, Any]:
    """Pairs whose direction the variant gets right (all; the precision pairs), and the held-out ratio MAPE."""
    rows = [(p, predicted_ratio(p, cal)) for p in load_knob_pairs()]
    right = [bool(r and direction_right(p.ratio, r)) for p, r in rows]
    precision = [ok for (p, _), ok in zip(rows, right) if p.knob == "precision"]
    held = [abs(r / p.ratio - 1) for p, r in rows if p.half == "held" and r]
    return {"knob pairs: direction right": f"{sum(right)}/{len(right)}",
            "precision (FP8) pairs: direction right": f"{sum(precision)}/{len(precision)}",
            "knob pairs: held-out ratio MAPE %": round(100 * sum(held) / len(held), 1) if held else None}


def figures(result: dict, cal: Calibration) -> dict[str, Any]:
    """One variant's figures, by label, from its bench/estimator_accuracy.py result and its calibration."""
    out: dict[str, Any] = {f"{k} MAPE %": v["mape"] for k, v in result["mape"].items()}
    out |= {f"{k} MAPE %": v for k, v in result["mape_by_family"].items()}
    out |= {f"long-context MoE {k} MAPE %": v for k, v in result["long_context_moe"]["mape"].items()}
    loo = result.get("leave_one_out")
    if loo:
        out |= {f"left out {f['kind']} {f['name']} MAPE %": f["mape"] for f in loo["folds"]}
        sources = [f["mape"] for f in loo["folds"] if f["kind"] == "source"]
        out["mean leave-one-source-out %"] = loo["mean"]["source"]
        out["worst source fold %"] = max(sources)
        out["mean leave-one-GPU-out %"] = loo["mean"]["gpu"]
        out["mean leave-one-family-out %"] = loo["mean"]["family"]
        out |= {f"leave-one-{c['column'].replace(' ', '-')}-out {c['held_out']}: mean |error| %": c["mean"]
                for c in loo["generalisation"]["columns"]}
    out |= knob_figures(cal)
    out["constants fitted to end-to-end rows"] = result["fitted_constants"]["count"]
    return out


def holds(fig: dict[str, Any]) -> bool | None:
    """Whether a variant holds the validation by source (None without folds)."""
    mean, worst = fig.get("mean leave-one-source-out %"), fig.get("worst source fold %")
    if mean is None or worst is None:
        return None
    return mean <= SOURCE_MEAN_LIMIT + SAME_WITHIN and worst <= SOURCE_MAX_LIMIT + SAME_WITHIN


def side_by_side(variants: list[tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
    """[(Variant, figures)] -> the table: variant keys and titles, one row per label, whether each holds."""
    keys = [v.key for v, _ in variants]
    labels = list(dict.fromkeys(label for _, fig in variants for label in fig))
    return {"variants": keys, "titles": {v.key: v.title for v, _ in variants},
            "rows": [{"figure": label} | {v.key: fig.get(label) for v, fig in variants} for label in labels],
            "holds": {v.key: holds(fig) for v, fig in variants}}


def lines(table: dict[str, Any]) -> list[str]:
    """The table as the command prints it."""
    keys = table["variants"]
    out = ["fits side by side: " + "; ".join(f"{k} = {table['titles'][k]}" for k in keys),
           f"{'figure':58}" + "".join(f"{k:>14}" for k in keys)]
    out += [f"{r['figure'][:58]:58}" + "".join(f"{_cell(r[k]):>14}" for k in keys) for r in table["rows"]]
    out.append(f"{'holds leave-one-source-out <= 12%, no source > 16%':58}"
               + "".join(f"{_cell(table['holds'][k]):>14}" for k in keys))
    return out


def markdown(table: dict[str, Any] | None) -> list[str]:
    """The table for RESULTS.md."""
    if not table:
        return []
    keys = table["variants"]
    lines_ = ["", "**Fits side by side** (issue 57, item 2; `.venv/bin/python bench/estimator_accuracy.py` prints "
              "it): " + "; ".join(f"`{k}`: {table['titles'][k]}" for k in keys) + ".", "",
              "| figure | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines_ += [f"| {r['figure']} | " + " | ".join(_cell(r[k]) for k in keys) + " |" for r in table["rows"]]
    lines_.append("| holds the validation by source | " + " | ".join(_cell(table["holds"][k]) for k in keys) + " |")
    return lines_


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:g}" if isinstance(value, float) else str(value)


__all__ = ["figures", "holds", "knob_figures", "lines", "markdown", "side_by_side"]
