"""The kernel tables against the cost model's current terms: a cross-check, not a refit (issue 57, item 2).

For every published kernel figure in search_spaces/catalog/kernel_tables.json (GEMM TFLOP/s by shape, attention
TFLOP/s by length and head widths, DeepEP dispatch/combine GB/s by EP span and link), the figure the cost model's
term gives at the same shape on the same catalog GPU with the packaged calibration (search_spaces/cost/
kernel_check.py), and model / kernel: above 1 the term assumes a faster kernel than the published one. Per table and
GPU, the median and the range of the ratio. Nothing here changes a term or a constant.

    python3 bench/kernel_tables.py               # one line per entry, then the summary per table and GPU
    python3 bench/kernel_tables.py --summary     # the summary alone
    python3 bench/kernel_tables.py --json        # the rows as one JSON object
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from typing import Any

from search_spaces.cost.kernel_check import cross_check

# the shape field the summary splits each table by: dense vs grouped GEMMs, causal vs unmasked attention, the link
SPLIT = {"gemm": "kind", "attention": "mask", "ep_alltoall": "link"}
# the shape fields a line shows, per term (the rest: the source's fixed settings)
SHOWN = {"gemm": ("kind", "groups", "m", "n", "k"), "attention": ("seq_len", "d_qk", "d_v", "mask", "direction"),
         "ep_alltoall": ("ep", "link", "direction", "sms")}


def _shape(term: str, shape: dict[str, Any]) -> str:
    return " ".join(f"{k}={shape[k]}" for k in SHOWN[term] if shape.get(k) is not None)


def rows() -> list[dict[str, Any]]:
    """One plain row per entry: what it is, the published figure, the model's, the ratio, the source."""
    out = []
    for r in cross_check():
        e = r["entry"]
        out.append({"term": e.term, "gpu": e.gpu, "precision": e.precision, "split": e.shape[SPLIT[e.term]],
                    "kernel": e.kernel,
                    "shape": _shape(e.term, e.shape), "unit": e.unit, "kernel_figure": e.value,
                    "model_figure": round(r["model"], 1), "ratio": round(r["ratio"], 3),
                    "share_of_ceiling": round(e.share_of_ceiling(), 3), "how": r["how"], "source": e.source.cite()})
    return out


def summary(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (term, GPU, precision, SPLIT): entries, the median ratio and its range."""
    groups: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    for row in table:
        groups[(row["term"], row["gpu"], row["precision"], row["split"])].append(row["ratio"])
    return [{"term": t, "gpu": g, "precision": p, "split": x, "entries": len(r),
             "median_ratio": round(statistics.median(r), 3), "min_ratio": min(r), "max_ratio": max(r)}
            for (t, g, p, x), r in groups.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", action="store_true", help="the summary per table and GPU alone")
    parser.add_argument("--json", action="store_true", help="one JSON object: rows and summary")
    args = parser.parse_args(argv)
    table = rows()
    if args.json:
        print(json.dumps({"rows": table, "summary": summary(table)}, indent=1))
        return 0
    if not args.summary:
        print(f"{'term':<12}{'gpu':<7}{'precision':<15}{'shape':<52}{'kernel':>9}{'model':>9}{'ratio':>7}  unit")
        for r in table:
            print(f"{r['term']:<12}{r['gpu']:<7}{r['precision']:<15}{r['shape']:<52}{r['kernel_figure']:>9.1f}"
                  f"{r['model_figure']:>9.1f}{r['ratio']:>7.2f}  {r['unit']}")
        print()
    print(f"{'term':<12}{'gpu':<7}{'precision':<15}{'of':<9}{'entries':>8}{'median':>8}{'min':>7}{'max':>7}"
          "  (model / kernel)")
    for s in summary(table):
        print(f"{s['term']:<12}{s['gpu']:<7}{s['precision']:<15}{s['split']:<9}{s['entries']:>8}"
              f"{s['median_ratio']:>8.2f}{s['min_ratio']:>7.2f}{s['max_ratio']:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
