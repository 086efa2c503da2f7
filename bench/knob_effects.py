"""How much each searched knob moves: published same-layout A/B pairs against the cost model's prediction.

Pairs: search_spaces/calibration/reference/knob_effects.csv (search_spaces.calibration.knob_pairs), each one knob
switched at a fixed layout -- MoE dispatcher (alltoall / DeepEP / HybridEP), CUDA-graph scope, precision (BF16,
per-tensor FP8, MXFP8, also on Qwen3-30B-A3B's small experts), recompute, EP overlap, and two memory levers' costs
(dropless routing against forced balance at EP16; the whole optimizer offloaded to the host) -- with its source
(repository, commit, what was compared). Half are declared fit (bench/fit_calibration.py may fit on them), half held
out; a pair found after the last refit joins the held half. Per pair: the
published ratio (B's throughput over A's) and the predicted one. A published ratio is itself two runs, and the same
layout run twice moves too: the performance summary lists 77 layouts in a release and in its patch release (26.04
and 26.04.01, ...), whose TF/s differ by a median 1.1%, and by up to NOISE = their 95th percentile (6.2%; derived
from the file, search_spaces.calibration.knob_pairs.noise_band): a published change within NOISE is not told apart from
none at the 5% level. A direction is right when published and predicted ratios fall in the same class (slower beyond
NOISE, within it, faster beyond it) or the prediction is within NOISE of the published ratio. Last line:
`knob effects: N pairs, direction right X/N, ratio error MAPE Y% (held-out half)` (goal: X = N, Y <= 10).

    .venv/bin/python bench/knob_effects.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from search_spaces.calibration.calibration_file import Calibration, calibration
from search_spaces.calibration.knob_pairs import KnobPair, load_knob_pairs, noise_band, predicted_ratio

# a published ratio within NOISE of 1 is "no change" (a two-sided 5% test against the same layout's run-to-run
# changes between a release and its patch release); a prediction within NOISE of the published ratio is right
NOISE_QUANTILE = 0.95
NOISE = noise_band(NOISE_QUANTILE)


def _direction(ratio: float, band: float = NOISE) -> int:
    return 0 if abs(ratio - 1) < band else (1 if ratio > 1 else -1)


def direction_right(published: float, predicted: float, band: float = NOISE) -> bool:
    return _direction(published, band) == _direction(predicted, band) or abs(predicted - published) < band


def _row(pair: KnobPair, cal: Calibration) -> dict:
    pred = predicted_ratio(pair, cal)
    return {"pair": pair.name, "knob": pair.knob, "model": pair.model, "gpu": pair.gpu, "half": pair.half,
            "changed": pair.changed, "published": round(pair.ratio, 3),
            "predicted": round(pred, 3) if pred else None,
            "error_pct": round(100 * (pred / pair.ratio - 1), 1) if pred else None,
            "direction_right": bool(pred and direction_right(pair.ratio, pred)), "source": pair.source}


# the seed's Qwen3-Next shape (notes/long-context-moe.md): `space` on 32 GB200 at these lengths
QWEN3_NEXT_LENGTHS = (8192, 32768, 65536)


def qwen3_next_space(cal: Calibration) -> list[dict]:
    """The best fitting layout `space` finds for Qwen3-Next on 32 GB200 at 8K, 32K and 64K."""
    from search_spaces.layouts.space import explore
    out = []
    for seq in QWEN3_NEXT_LENGTHS:
        best = explore("qwen3-next-80b-a3b", "gb200", 32, seq, top=1, cal=cal).top[0]
        p = best["prediction"]
        out.append({"seq_len": seq, "tflops": round(p["tflops_per_gpu"], 1), "peak_gib": round(p["peak_memory_gib"], 1),
                    "layout": best["key"]})
    return out


def run(cal: Calibration | None = None, with_space: bool = False) -> dict:
    cal = cal or calibration()
    rows = [_row(p, cal) for p in load_knob_pairs()]
    held = [r for r in rows if r["half"] == "held" and r["error_pct"] is not None]
    fit = [r for r in rows if r["half"] == "fit" and r["error_pct"] is not None]
    return {"rows": rows, "pairs": len(rows), "direction_right": sum(r["direction_right"] for r in rows),
            "mape_held": round(sum(abs(r["error_pct"]) for r in held) / len(held), 1) if held else None,
            "mape_fit": round(sum(abs(r["error_pct"]) for r in fit) / len(fit), 1) if fit else None,
            "knobs": sorted({r["knob"] for r in rows}), "noise_pct": round(100 * NOISE, 1),
            "qwen3_next_space": qwen3_next_space(cal) if with_space else [], "accuracy": accuracy(cal)}


def accuracy(cal: Calibration) -> dict:
    """estimator_accuracy's MAPEs under `cal` (the published rows and the long-context MoE rows)."""
    from bench.estimator_accuracy import run as accuracy_run
    acc = accuracy_run(cal)
    out = {k: v["mape"] for k, v in acc["mape"].items()}
    out.update({f"long-context MoE {k}": v for k, v in acc["long_context_moe"]["mape"].items()})
    return out


def summary_line(r: dict) -> str:
    return (f"knob effects: {r['pairs']} pairs, direction right {r['direction_right']}/{r['pairs']} (noise band "
            f"{r['noise_pct']}%), ratio error MAPE {r['mape_held']}% (held-out half)")


BEFORE = Path(__file__).with_name("knob_effects_before.json")


def before_after(r: dict) -> list[str]:
    """Issue 23's before/after table: the figures measured before its terms (knob_effects_before.json) beside
    this run's (the pairs, estimator_accuracy's MAPEs, and `space` for Qwen3-Next when run with it)."""
    before = json.loads(BEFORE.read_text())
    now = dict(r.get("accuracy") or {})
    b = before["estimator_accuracy"]
    rows = [("knob pairs: direction right",
             f"{before['knob_effects']['direction_right']}/{before['knob_effects']['pairs']}",
             f"{r['direction_right']}/{r['pairs']}"),
            ("knob pairs: ratio MAPE, held-out half", f"{before['knob_effects']['mape_held']}%", f"{r['mape_held']}%")]
    rows += [(f"published rows {k}: TF/s MAPE", f"{b[k]}%", f"{now.get(k, '-')}%") for k in
             ("held out <=8K", "held out >=16K")]
    rows += [(f"long-context MoE rows {k} (best CP type)", f"{before['long_context_moe'][k]}%",
              f"{now.get('long-context MoE ' + k, '-')}%") for k in ("fitted", "held out")]
    for q in r.get("qwen3_next_space") or []:
        k = f"{q['seq_len'] // 1024}K"
        was = before["qwen3_next_space_gb200_32"][k]
        rows.append((f"space, Qwen3-Next on 32 GB200, {k}: best TF/s (peak GiB)",
                     f"{was['tflops']} ({was['peak_gib']})",
                     f"{q['tflops']} ({q['peak_gib']}) {q['layout']}"))
    lines = [f"Before: {before['measured_on']}.", "", "| figure | before | after |", "|---|---|---|"]
    return lines + [f"| {a} | {x} | {y} |" for a, x, y in rows] + [""]


def section(r: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    lines = before_after(r) + ["Published same-layout A/B pairs (search_spaces/calibration/reference/knob_effects.csv, "
             "each with its source): the published throughput ratio B/A beside the cost model's. Knobs covered: "
             f"{', '.join(r['knobs'])}. Fit-half MAPE {r['mape_fit']}%, held-out-half MAPE **{r['mape_held']}%**.",
             "", "| pair | knob | half | change | published B/A | predicted B/A | error % | direction |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {x['pair']} | {x['knob']} | {x['half']} | {x['changed']} | {x['published']} | {x['predicted']} | "
              f"{x['error_pct']} | {'right' if x['direction_right'] else 'WRONG'} |" for x in r["rows"]]
    return lines + ["", summary_line(r)]


def table(result: dict) -> list[str]:
    """The per-pair lines the command prints."""
    out = [f"{'pair':38} {'knob':12} {'half':5} {'published':>9} {'predicted':>9} {'err%':>6}  direction"]
    for x in result["rows"]:
        pred = x["predicted"] if x["predicted"] is not None else float("nan")
        err = x["error_pct"] if x["error_pct"] is not None else float("nan")
        out.append(f"{x['pair']:38} {x['knob']:12} {x['half']:5} {x['published']:9.3f} {pred:9.3f} {err:6.1f}  "
                   f"{'right' if x['direction_right'] else 'WRONG'}")
    return out + [summary_line(result)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--space", action="store_true", help="also run `space` for Qwen3-Next on 32 GB200")
    args = parser.parse_args()
    result = run(with_space=args.space)
    print(json.dumps(result) if args.json else "\n".join(table(result)))


if __name__ == "__main__":
    main()
