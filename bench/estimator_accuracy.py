"""Predicted vs published TF/s/GPU for every published row the cost model can express, fitted and held out.

Rows: search_spaces.reference.published_rows() -- the Megatron-Bridge performance summary (newest release of each
configuration) and MoE skill card, moe_4k_more.csv (Megatron-MoE-ModelZoo / skill cards, 4K MoE), and
long_sequence_dense_cp.csv (NeMo: Llama2-7B on H100 from 4K to 1M, Llama3-8B on B200 from 8K to 1M, with CP;
their TF/s converted from NeMo's whole-square attention count to Bridge's causal one). Rows are split by
`declared_halves` (every other row of each source; every other length of each long-sequence series):
search_spaces/calibration.json was fitted on the first half only (bench/fit_calibration.py), so the second half
is held out. MAPE is reported for rows <= 8K and >= 16K apart, and per long-sequence series the trend (TF/s at a
length / TF/s at the series' shortest length) predicted beside published.

    .venv/bin/python bench/estimator_accuracy.py          # every row + the tables
`run()` returns the figures as a dict (bench/run_all.py reuses it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_spaces.calibration import Measurement, predict_tokens  # noqa: E402
from search_spaces.reference import declared_halves, published_rows  # noqa: E402
from search_spaces.calibration_file import Calibration, calibration  # noqa: E402

SHORT, LONG = 8192, 16384  # rows <= 8K, rows >= 16K


def _row(m: Measurement, half: str, cal: Calibration) -> dict | None:
    pred = predict_tokens(m, cal)
    if pred is None:
        return None
    ratio = pred / m.tokens()
    return {"source": m.source, "model": m.model, "gpu": m.gpu, "family": m.family, "num_gpus": m.num_gpus,
            "seq_len": m.seq_len, "layout": m.layout.key(), "half": half, "release": m.release,
            "published_tflops": round(m.tflops(), 1), "predicted_tflops": round(m.tflops() * ratio, 1),
            "error_pct": round(100 * (ratio - 1), 1)}


def _mape(rows: list[dict]) -> float | None:
    return round(sum(abs(r["error_pct"]) for r in rows) / len(rows), 1) if rows else None


def trends(rows: list[dict]) -> list[dict]:
    """Per long-sequence series (model on GPU): TF/s at each length over TF/s at its shortest length."""
    out = []
    for key in sorted({(r["model"], r["gpu"]) for r in rows if r["source"] == "nemo long sequence"}):
        series = sorted((r for r in rows if (r["model"], r["gpu"]) == key and r["source"] == "nemo long sequence"),
                        key=lambda r: r["seq_len"])
        first = series[0]
        for r in series:
            out.append({"model": key[0], "gpu": key[1], "seq_len": r["seq_len"], "half": r["half"],
                        "published_trend": round(r["published_tflops"] / first["published_tflops"], 3),
                        "predicted_trend": round(r["predicted_tflops"] / first["predicted_tflops"], 3),
                        "base_seq_len": first["seq_len"]})
    return out


def run(cal: Calibration | None = None) -> dict:
    cal = cal or calibration()
    rows_in = published_rows()
    fit, held = declared_halves(rows_in)
    held_ids = {id(m) for m in held}
    rows, skipped = [], 0
    for m in rows_in:
        row = _row(m, "held out" if id(m) in held_ids else "fitted", cal)
        if row is None:
            skipped += 1
        else:
            rows.append(row)
    table = {}
    for half in ("fitted", "held out"):
        for name, keep in (("<=8K", lambda r: r["seq_len"] <= SHORT), (">=16K", lambda r: r["seq_len"] >= LONG)):
            sel = [r for r in rows if r["half"] == half and keep(r)]
            table[f"{half} {name}"] = {"mape": _mape(sel), "rows": len(sel)}
    by_family = {f"{half} {fam}": _mape([r for r in rows if r["half"] == half and r["family"] == fam])
                 for half in ("fitted", "held out") for fam in sorted({r["family"] for r in rows})}
    return {"rows": rows, "mape": table, "mape_by_family": by_family, "trends": trends(rows),
            "count": len(rows), "skipped": skipped, "mape_all": _mape(rows)}


def main() -> None:
    result = run()
    print(f"{'half':8} {'source':20} {'model':20} {'gpu':6} {'n':>5} {'seq':>8} {'published':>9} "
          f"{'predicted':>9} {'err%':>6}")
    for r in result["rows"]:
        print(f"{r['half']:8} {r['source'][:20]:20} {r['model']:20} {r['gpu']:6} {r['num_gpus']:5d} {r['seq_len']:8d} "
              f"{r['published_tflops']:9.0f} {r['predicted_tflops']:9.0f} {r['error_pct']:6.1f}")
    for k, v in result["mape"].items():
        print(f"MAPE {k:18} {v['mape']}% over {v['rows']} rows")


def section(r: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    m = r["mape"]
    lines = [f"Predicted vs published TF/s/GPU on {r['count']} published rows ({r['skipped']} not expressible): the "
             "calibration (search_spaces/calibration.json) was fitted on the declared fit half only "
             "(bench/fit_calibration.py); the held-out half was never seen by the fit.", "",
             "| rows | fitted half: MAPE % (rows) | held-out half: MAPE % (rows) |", "|---|---|---|"]
    for name in ("<=8K", ">=16K"):
        lines.append(f"| {name.replace('<=', '≤ ').replace('>=', '≥ ')} | {m['fitted ' + name]['mape']} "
                     f"({m['fitted ' + name]['rows']}) | **{m['held out ' + name]['mape']}** "
                     f"({m['held out ' + name]['rows']}) |")
    lines += ["", "| GPU family | fitted MAPE % | held-out MAPE % |", "|---|---|---|"]
    for fam in sorted({k.split()[-1] for k in r["mape_by_family"]}):
        lines.append(f"| {fam} | {r['mape_by_family'].get('fitted ' + fam)} | "
                     f"{r['mape_by_family'].get('held out ' + fam)} |")
    lines += ["", "Trend per long-sequence series: TF/s at each length over TF/s at the series' shortest length "
              "(Llama2-7B: 4K, Llama3-8B: 8K; NeMo's published TF/s converted to Bridge's causal count).", "",
              "| model | GPU | length | half | published trend | predicted trend |", "|---|---|---|---|---|---|"]
    lines += [f"| {t['model']} | {t['gpu']} | {t['seq_len'] // 1024}K | {t['half']} | {t['published_trend']} | "
              f"{t['predicted_trend']} |" for t in r["trends"]]
    lines += ["", "<details><summary>every row</summary>", "",
              "| half | source | model | gpu | GPUs | seq | published | predicted | error % |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {x['half']} | {x['source']} | {x['model']} | {x['gpu']} | {x['num_gpus']} | {x['seq_len']} | "
              f"{x['published_tflops']} | {x['predicted_tflops']} | {x['error_pct']} |" for x in r["rows"]]
    return lines + ["", "</details>"]


if __name__ == "__main__":
    main()
