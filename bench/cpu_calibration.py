"""The CPU path, honestly: the real gloo/eager trainer's measured tokens/s and peak memory against `estimate --gpu
cpu`, on layouts the calibration never saw.

    .venv/bin/python bench/cpu_calibration.py [--write]

Measurements: bench/cpu_measurements.py (tiny-moe, 4 ranks, seq 256, the quickstart's situation; cached in
bench/cpu_measurements.json, so a rerun measures only what is missing). The CPU constants (GEMM and attention
rates of the eager trainer, its overhead per layer, the fixed cost of a gloo collective, the process's resident
baseline) are fitted by the same code as `moe-autotune calibrate` (orchestrator.outputs.calibrate) on the FIT layouts,
then the HELD layouts are scored with the fitted constants -- and with the hand-set ones they replace.
`--write` stores the fitted CPU constants in search_spaces/calibration/calibration.json (what `estimate --gpu cpu` and
the quickstart's sweep use). Last line: `cpu calibration: tokens/s MAPE X%, peak memory MAPE Y% over N layouts`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_spaces.calibration.calibration_file import CALIBRATION_PATH, Calibration, calibration  # noqa: E402
from search_spaces.calibration.fit import Measurement, predict_peak_gib, predict_tokens  # noqa: E402
from search_spaces.cost.costmodel import estimate  # noqa: E402
from search_spaces.cost.packing import load_histogram  # noqa: E402

from bench.cpu_measurements import FIT, HELD, PACKED, PACKED_LENGTHS, ensure, find  # noqa: E402
from orchestrator.outputs.calibrate import calibrate  # noqa: E402

SEQ_LEN = 256
# what the CPU fit owns in calibration.json (the GPU constants are bench/fit_calibration.py's)
CPU_KEYS = ("cpu_overhead_per_layer_s", "cpu_collective_latency_s", "cpu_process_baseline_gib")
CPU_FAMILY_KEYS = ("gemm_efficiency", "attention_fwd_efficiency", "attention_bwd_efficiency")


def measurements(cache: dict, layouts, seq_len: int = SEQ_LEN) -> tuple[list[Measurement], int]:
    """The layouts' runs that measured ok as Measurements; and how many did not (trainer errors)."""
    out, failed = [], 0
    for layout in layouts:
        run = find(cache, layout, seq_len)
        if run is None or run["status"] != "ok" or not run["tokens_per_sec_per_gpu"]:
            failed += 1
            continue
        out.append(Measurement(run["model"], "cpu", run["num_gpus"], seq_len, layout,
                               tokens_per_sec_per_gpu=run["tokens_per_sec_per_gpu"],
                               peak_memory_gib=run["peak_memory_gib"], source="bench cpu"))
    return out, failed


def uncalibrated() -> Calibration:
    """The packaged calibration with the CPU constants back at their hand-set defaults."""
    defaults = Calibration()
    return calibration().updated({**{key: getattr(defaults, key) for key in CPU_KEYS},
                                  **{key: {"cpu": getattr(defaults, key)["cpu"]} for key in CPU_FAMILY_KEYS}})


def predicted_tokens(m: Measurement, cal: Calibration) -> float:
    """predict_tokens of a layout that ran: the rules allow it, so there is a prediction."""
    tokens = predict_tokens(m, cal)
    if tokens is None:
        raise ValueError(f"{m.layout.key()}: the cost model's rules refuse a layout that ran")
    return tokens


def score(ms: list[Measurement], cal: Calibration) -> dict:
    rows: list[dict[str, Any]] = []
    for m in ms:
        tok, peak = predicted_tokens(m, cal), predict_peak_gib(m, cal)
        if peak is None or m.peak_memory_gib is None:  # measured runs are legal and report their peak
            raise ValueError(f"{m.layout.key()}: no predicted or no measured peak memory")
        rows.append({"layout": m.layout.key(), "measured_tokens": round(m.tokens(), 1),
                     "predicted_tokens": round(tok, 1), "tokens_error_pct": round(100 * (tok / m.tokens() - 1), 1),
                     "measured_peak_gib": round(m.peak_memory_gib, 3), "predicted_peak_gib": round(peak, 3),
                     "peak_error_pct": round(100 * (peak / m.peak_memory_gib - 1), 1)})
    def mape(key: str) -> float:
        return round(sum(abs(r[key]) for r in rows) / len(rows), 1)
    return {"rows": rows, "tokens_mape": mape("tokens_error_pct"), "peak_mape": mape("peak_error_pct")}


def run(write: bool = False) -> dict:
    cache = ensure([SEQ_LEN])
    fit_ms, fit_failed = measurements(cache, FIT)
    held_ms, held_failed = measurements(cache, HELD)
    start = uncalibrated()
    result = calibrate(fit_ms, start, holdout=0.0, with_published=False)
    cal = result.cal
    fitted = {k: getattr(cal, k) for k in CPU_KEYS} | {k: getattr(cal, k)["cpu"] for k in CPU_FAMILY_KEYS}
    if write:
        stored = json.loads(CALIBRATION_PATH.read_text())
        for key in CPU_KEYS:
            stored[key] = float(f"{getattr(cal, key):.4g}")
        for key in CPU_FAMILY_KEYS:
            value = getattr(cal, key)["cpu"]
            stored.setdefault(key, {})["cpu"] = {k: float(f"{v:.4g}") for k, v in value.items()} \
                if isinstance(value, dict) else float(f"{value:.4g}")
        CALIBRATION_PATH.write_text(json.dumps(stored, indent=2) + "\n")
    return {"fit_layouts": len(fit_ms), "held_layouts": len(held_ms), "failed_runs": fit_failed + held_failed,
            "fitted": fitted, "before": score(held_ms, start), "after": score(held_ms, cal),
            "fit_after": score(fit_ms, cal), "cores": cal.cpu_cores, "packed": score_packed(cal)}


def score_packed(cal: Calibration) -> dict:
    """Packed documents (never fitted): real tokens/s and peak memory measured against `estimate --lengths`."""
    cache = ensure([SEQ_LEN], PACKED, lengths=PACKED_LENGTHS)
    hist = load_histogram(ROOT / PACKED_LENGTHS)
    rows = []
    for layout in PACKED:
        run = find(cache, layout, SEQ_LEN, PACKED_LENGTHS)
        if run is None or run["status"] != "ok":
            continue
        est = estimate(run["model"], "cpu", run["num_gpus"], SEQ_LEN, layout, cal=cal, packing=hist)
        tok, peak = est.tokens_per_sec_per_gpu, est.peak_memory_gib
        if tok is None or peak is None:  # the layout ran: the rules allow it
            raise ValueError(f"{layout.key()}: the cost model's rules refuse a layout that ran")
        rows.append({"layout": layout.key(), "measured_tokens": round(run["tokens_per_sec_per_gpu"], 1),
                     "predicted_tokens": round(tok, 1),
                     "tokens_error_pct": round(100 * (tok / run["tokens_per_sec_per_gpu"] - 1), 1),
                     "measured_peak_gib": round(run["peak_memory_gib"], 3), "predicted_peak_gib": round(peak, 3),
                     "peak_error_pct": round(100 * (peak / run["peak_memory_gib"] - 1), 1),
                     "useful_token_share": round(run.get("useful_token_share") or 1.0, 3)})
    mape = {key: round(sum(abs(r[key]) for r in rows) / len(rows), 1) if rows else None
            for key in ("tokens_error_pct", "peak_error_pct")}
    return {"rows": rows, "tokens_mape": mape["tokens_error_pct"], "peak_mape": mape["peak_error_pct"],
            "lengths": PACKED_LENGTHS}


def summary_line(r: dict) -> str:
    a, p = r["after"], r["packed"]
    return (f"cpu calibration: tokens/s MAPE {a['tokens_mape']}%, peak memory MAPE {a['peak_mape']}% over "
            f"{r['held_layouts']} layouts; packed documents {p['tokens_mape']}% and {p['peak_mape']}% over "
            f"{len(p['rows'])}")


def section(r: dict) -> list[str]:
    b, a = r["before"], r["after"]
    lines = [f"tiny-moe, 4 CPU ranks (gloo), seq {SEQ_LEN}, GBS 8: the real trainer's measurements "
             f"(bench/cpu_measurements.json) against the cost model on {r['held_layouts']} layouts the fit never "
             f"saw; fitted on {r['fit_layouts']} others ({r['failed_runs']} run(s) failed in the trainer and are "
             f"left out). Host: {r['cores']:g} cores, shared with other jobs while measuring.", "",
             "| held-out layouts | tokens/s MAPE % | peak memory MAPE % |", "|---|---|---|",
             f"| hand-set CPU constants (before) | {b['tokens_mape']} | {b['peak_mape']} |",
             f"| fitted CPU constants (after) | **{a['tokens_mape']}** | **{a['peak_mape']}** |",
             f"| (fit layouts, after) | {r['fit_after']['tokens_mape']} | {r['fit_after']['peak_mape']} |", "",
             "Fitted: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in r["fitted"].items()), "",
             "| layout | measured tokens/s | predicted | error % | measured peak GiB | predicted | error % |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {x['layout']} | {x['measured_tokens']} | {x['predicted_tokens']} | {x['tokens_error_pct']} | "
              f"{x['measured_peak_gib']} | {x['predicted_peak_gib']} | {x['peak_error_pct']} |" for x in a["rows"]]
    p = r["packed"]
    lines += ["", f"Packed documents ({p['lengths']}, THD, never fitted): real tokens/s against "
                  f"`estimate --lengths` with the fitted constants.", "",
              "| layout | useful share | measured tokens/s | predicted | error % | measured peak GiB | predicted | "
              "error % |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {x['layout']} | {x['useful_token_share']} | {x['measured_tokens']} | {x['predicted_tokens']} | "
              f"{x['tokens_error_pct']} | {x['measured_peak_gib']} | {x['predicted_peak_gib']} | "
              f"{x['peak_error_pct']} |" for x in p["rows"]]
    return lines + ["", summary_line(r)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the fitted CPU constants in calibration.json")
    r = run(write=parser.parse_args().write)
    for line in section(r)[:-1]:
        print(line)
    print(summary_line(r))


if __name__ == "__main__":
    main()
