"""Transfer check: measurements at one sequence length, given to `moe-autotune calibrate`, improve the cost model's
ranking at twice that length.

    .venv/bin/python bench/transfer_check.py

The 16 CPU layouts of bench/cpu_measurements.py measured by the real trainer at 128 tokens (cached) are written
as a replay table (the CSV `moe-autotune status --csv` writes) and handed to `moe-autotune calibrate --table ...
--no-published --holdout 0`, starting from the hand-set CPU constants. The same layouts measured at 256 tokens are
the test: the Spearman rank correlation between predicted and measured tokens/s at 256, with the hand-set constants
(before) and with the calibration learnt at 128 (after). No 256-token measurement is seen by the calibration.
"""

from __future__ import annotations

import csv
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_spaces.calibration.fit import load_calibration  # noqa: E402

from bench.cpu_calibration import measurements, predicted_tokens, uncalibrated  # noqa: E402
from bench.cpu_measurements import LAYOUTS, ensure, find  # noqa: E402
from orchestrator.commands.cli import main as cli  # noqa: E402
from orchestrator.dispatch.replay import LAYOUT_COLUMNS, TABLE_COLUMNS  # noqa: E402

SHORT, LONG = 128, 256


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks on ties)."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def write_table(cache: dict, path: Path) -> int:
    """The 128-token measurements as a replay table; returns the rows measured ok."""
    rows = 0
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS)
        writer.writeheader()
        for layout in LAYOUTS:
            run = find(cache, layout, SHORT)
            if run is None:
                continue
            writer.writerow({"model": run["model"], "gpu": "cpu", "num_gpus": run["num_gpus"], "seq_len": SHORT,
                             **layout.params(LAYOUT_COLUMNS),
                             "status": run["status"], "tokens_per_sec_per_gpu": run["tokens_per_sec_per_gpu"],
                             "tflops_per_gpu": "", "peak_memory_gib": run["peak_memory_gib"]})
            rows += run["status"] == "ok"
    return rows


def run() -> dict:
    cache = ensure([LONG, SHORT])
    test, _ = measurements(cache, LAYOUTS, LONG)
    with tempfile.TemporaryDirectory() as tmp:
        table, start, out = Path(tmp) / "seq128.csv", Path(tmp) / "start.json", Path(tmp) / "learnt.json"
        rows = write_table(cache, table)
        start.write_text(json.dumps(uncalibrated().model_dump()))
        code = cli(["calibrate", "--table", str(table), "--calibration", str(start), "--no-published",
                    "--holdout", "0", "--out", str(out)])
        if code != 0:
            raise RuntimeError(f"moe-autotune calibrate exited {code}")
        learnt = load_calibration(out)
        before_cal = load_calibration(start)
    measured = [m.tokens() for m in test]
    before = [predicted_tokens(m, before_cal) for m in test]
    after = [predicted_tokens(m, learnt) for m in test]
    def mape(pred: list[float]) -> float:
        return round(100 * sum(abs(p / x - 1) for p, x in zip(pred, measured)) / len(measured), 1)

    return {"calibrated_on": rows, "tested_on": len(test), "spearman_before": round(spearman(before, measured), 3),
            "spearman_after": round(spearman(after, measured), 3), "mape_before": mape(before),
            "mape_after": mape(after),
            "rows": [{"layout": m.layout.key(), "measured": round(x, 1), "before": round(b, 1), "after": round(a, 1)}
                     for m, x, b, a in zip(test, measured, before, after)]}


def section(r: dict) -> list[str]:
    lines = [f"`moe-autotune calibrate --table` on {r['calibrated_on']} CPU layouts measured at {SHORT} tokens "
             f"(real trainer, tiny-moe, 4 ranks); ranking tested on {r['tested_on']} layouts measured at {LONG} "
             "tokens, which the calibration never saw.", "",
             f"| Spearman (predicted vs measured tokens/s at {LONG}) | value |", "|---|---|",
             f"| hand-set CPU constants (before) | {r['spearman_before']} |",
             f"| calibrated on the {SHORT}-token measurements (after) | **{r['spearman_after']}** |", "",
             f"Tokens/s MAPE at {LONG} tokens: {r['mape_before']}% before, {r['mape_after']}% after.", "",
             "| layout | measured | before | after |", "|---|---|---|---|"]
    lines += [f"| {x['layout']} | {x['measured']} | {x['before']} | {x['after']} |" for x in r["rows"]]
    return lines


def main() -> None:
    for line in section(run()):
        print(line)


if __name__ == "__main__":
    main()
