"""Predicted vs published TF/s/GPU for every published row the cost model can express, fitted and held out.

Rows: search_spaces.calibration.reference.published_rows() -- the Megatron-Bridge performance summary (newest release of
each configuration) and MoE skill card, moe_4k_more.csv (Megatron-MoE-ModelZoo / skill cards, 4K MoE), and
long_sequence_dense_cp.csv (NeMo: Llama2-7B on H100 from 4K to 1M, Llama3-8B on B200 from 8K to 1M, with CP;
their TF/s converted from NeMo's whole-square attention count to Bridge's causal one). Rows are split by
`declared_halves` (every other row of each source; every other length of each long-sequence series):
search_spaces/calibration/calibration.json was fitted on the first half only (bench/fit_calibration.py), so the second
half is held out. MAPE is reported for rows <= 8K and >= 16K apart, and per long-sequence series the trend (TF/s at a
length / TF/s at the series' shortest length) predicted beside published. Apart from them (so those figures stay
comparable): the long-context MoE rows (search_spaces/calibration/reference/moe_long_context.csv: Qwen3-235B on H100
16K-128K, DeepSeek-V3 on H100 4K-256K, Qwen3-Next on GB200 8K-64K, Qwen3-235B on GB200/GB300 at 128K), each predicted
with its best CP communication type (none is published), every other row of each series held out.

Validation by source (bench/leave_one_out.py), the figure that counts: each publisher's rows (Megatron-Bridge
performance summary, skill cards, Megatron-MoE-ModelZoo, NeMo's long-sequence tables; long-context MoE rows with their
publisher) left out in turn, the constants refitted on every row of the others, the left-out rows predicted; the same
per GPU and for the Blackwell family (Hopper has one GPU), and per MoE model class. MAPE per fold and the mean over
folds; beside each, the packaged calibration's MAPE on the same rows (fitted on half of them).

Generalisation columns (issue 57), from those folds: leave-one-generation-out (Blackwell rows left out, the refit on
Hopper's predicting them; Hopper's = H100's rows left out, the refit on Blackwell's predicting them) and
leave-one-model-class-out (fine-grained-expert rows left out, the refit on the coarse-expert and dense rows predicting
them, and the reverse). The class rule (bench/leave_one_out.py MODEL_CLASS_RULE): routed experts at most half the
hidden size wide (moe_ffn_hidden_size <= 0.5 x hidden_size) are fine-grained, wider ones coarse; dense models are in
neither class and stay in both fits. Per direction: the held-out rows' mean and max absolute % error. Beside them,
the number of constants fitted to end-to-end rows, counted from bench/fit_calibration.py's parameter vector
(the product variant's parameters, then STATE_STEP).

Fits side by side (issue 57, item 2; bench/variant_comparison.py): each of bench/fit_calibration.py's variants --
every GEMM term fitted to the rows (`all-fitted`), Hopper's GEMM terms read from the kernel tables (`table-pinned`,
search_spaces/calibration/kernel_pins.py) -- fitted on the fit half and folded alike, every figure above and the
constants count beside each other; the product's calibration.json is PRODUCT's fit.

    .venv/bin/python bench/estimator_accuracy.py              # every row + the tables + the folds (~20 CPU-minutes)
    .venv/bin/python bench/estimator_accuracy.py --no-folds   # without the refits
    .venv/bin/python bench/estimator_accuracy.py --no-compare # the product's variant alone (~10 CPU-minutes)
`run()` returns the figures as a dict (bench/run_all.py reuses it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_spaces.calibration.calibration_file import Calibration, calibration  # noqa: E402
from search_spaces.calibration.fit import Measurement, predict_tokens, predict_tokens_best_cp  # noqa: E402
from search_spaces.calibration.reference import declared_halves, long_context_moe_rows, published_rows  # noqa: E402

from bench import variant_comparison  # noqa: E402
from bench.fit_calibration import PRODUCT, VARIANTS, Variant, fit_variant  # noqa: E402
from bench.leave_one_out import MODEL_CLASS_RULE, folds, predict, run_fold  # noqa: E402

SHORT, LONG = 8192, 16384  # rows <= 8K, rows >= 16K
# the generalisation columns (issue 57): (column, held out, what its refit is fitted on, the fold that leaves it out);
# Hopper has one GPU, so its generation fold is H100's (tests/bench/test_generalisation_columns.py checks the sets)
COLUMNS = (("generation", "blackwell", "hopper rows", "family blackwell"),
           ("generation", "hopper", "blackwell rows", "gpu h100"),
           ("model class", "fine-grained", "coarse-expert and dense rows", "class fine-grained"),
           ("model class", "coarse", "fine-grained-expert and dense rows", "class coarse"))


def _row(m: Measurement, half: str, cal: Calibration, best_cp: bool = False) -> dict | None:
    pred, layout = predict_tokens_best_cp(m, cal) if best_cp else (predict_tokens(m, cal), m.layout)
    if pred is None:
        return None
    ratio = pred / m.tokens()
    return {"cp_comm_type": layout.cp_comm_type + (f" {list(layout.hierarchical_cp)}" if layout.hierarchical_cp
                                                   else ""), "source": m.source, "origin": m.origin, "model": m.model,
            "gpu": m.gpu, "family": m.family, "num_gpus": m.num_gpus,
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


def run(cal: Calibration | None = None, with_folds: bool = True, variant: Variant = PRODUCT,
        compare: bool = True) -> dict:
    """The figures of `cal` (the packaged calibration: PRODUCT's fit), its folds refitted as `variant` fits;
    `compare`: the other variant's too, fitted on the fit half here, and both side by side."""
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
    out = {"rows": rows, "mape": table, "mape_by_family": by_family, "trends": trends(rows),
           "count": len(rows), "skipped": skipped, "mape_all": _mape(rows), "long_context_moe": long_context(cal),
           "leave_one_out": leave_one_out(cal, variant) if with_folds else None,
           "fitted_constants": fitted_constants(variant), "variant": variant.key}
    if compare:
        out["variants"] = compare_variants(out, cal, variant, with_folds)
    return out


def compare_variants(result: dict, cal: Calibration, variant: Variant, with_folds: bool) -> dict:
    """`result` (of `variant`) beside every other variant's, each fitted on the fit half and folded alike
    (bench/variant_comparison.py)."""
    pairs = [(variant, variant_comparison.figures(result, cal))]
    for other in VARIANTS.values():
        if other is not variant:
            other_cal = fit_variant(other, verbose=False)
            other_result = run(other_cal, with_folds, other, compare=False)
            pairs.append((other, variant_comparison.figures(other_result, other_cal)))
    return variant_comparison.side_by_side(sorted(pairs, key=lambda p: p[0].key))


def _pct(errs: list[float]) -> float | None:
    return round(100 * sum(abs(e) for e in errs) / len(errs), 1) if errs else None


def leave_one_out(cal: Calibration, variant: Variant = PRODUCT) -> dict:
    """Each fold's left-out MAPE, `cal`'s on the same rows, rows, refit CPU seconds (the refits: `variant`'s);
    the mean over the folds of each kind; and every left-out row's error (bench/leave_one_out.py)."""
    rows, long_rows = published_rows(), long_context_moe_rows()
    out: dict = {"folds": [], "rows": [], "variant": variant.key}
    for fold in folds():
        result = run_fold(fold, rows, long_rows, variant=variant)
        errs = [e for _, e in result["errors"]]
        packaged = [e for m, _ in result["errors"] for e in [predict(m, cal)] if e is not None]
        out["folds"].append({k: result[k] for k in ("kind", "name", "refused", "refit_cpu_s", "evaluations",
                                                    "fitted")}
                            | {"rows": len(errs), "mape": _pct(errs), "packaged_mape": _pct(packaged),
                               "max": round(100 * max(map(abs, errs)), 1) if errs else None})
        print(f"{variant.key} fold {fold.kind} {fold.name}: {len(errs)} rows, MAPE {_pct(errs)}% "
              f"(packaged {_pct(packaged)}%), refit {result['refit_cpu_s']} CPU s", file=sys.stderr, flush=True)
        out["rows"] += [{"fold": f"{fold.kind} {fold.name}", "model": m.model, "gpu": m.gpu, "seq_len": m.seq_len,
                         "layout": m.layout.key(), "published_tflops": round(m.tflops(), 1),
                         "error_pct": round(100 * e, 1)} for m, e in result["errors"]]
    gpu_folds = [f for f in out["folds"] if f["kind"] == "gpu"]
    out["families"] = [next(f for f in gpu_folds if f["name"] == "h100") | {"kind": "family", "name": "hopper"}] \
        + [f for f in out["folds"] if f["kind"] == "family"]
    out["mean"] = {kind: round(sum(f["mape"] for f in fs) / len(fs), 1)
                   for kind, fs in (("source", [f for f in out["folds"] if f["kind"] == "source"]),
                                    ("gpu", gpu_folds), ("family", out["families"]))}
    out["refit_cpu_s"] = round(sum(f["refit_cpu_s"] for f in out["folds"]), 0)
    out["generalisation"] = generalisation(out["rows"], variant)
    return out


def fitted_constants(variant: Variant = PRODUCT) -> dict:
    """The constants bench/fit_calibration.py fits to the end-to-end rows, counted from the variant's parameter
    vector (then STATE_STEP alone): how many, and their names."""
    vector = variant.fitted_constants()
    return {"count": len(vector), "names": [p.name for p in vector]}


def generalisation(loo_rows: list[dict], variant: Variant = PRODUCT) -> dict:
    """Leave-one-generation-out and leave-one-model-class-out (COLUMNS), each direction from its fold's left-out
    rows: rows, mean and max absolute % error, the three rows that miss most; the class rule; the constants count."""
    columns = []
    for column, held, fitted_on, fold in COLUMNS:
        rows = [r for r in loo_rows if r["fold"] == fold]
        worst = sorted(rows, key=lambda r: -abs(r["error_pct"]))[:3]
        columns.append({"column": column, "held_out": held, "fitted_on": fitted_on, "fold": fold, "rows": len(rows),
                        "mean": _mape(rows), "max": max((abs(r["error_pct"]) for r in rows), default=None),
                        "worst": [f"{r['model']} {r['gpu']} {r['seq_len'] // 1024}K {r['error_pct']:+.1f}%"
                                  for r in worst]})
    return {"columns": columns, "class_rule": MODEL_CLASS_RULE, "fitted_constants": fitted_constants(variant)}


def long_context(cal: Calibration) -> dict:
    """The long-context MoE rows, each at its best CP communication type, by declared half."""
    fit, held = declared_halves(long_context_moe_rows())
    rows = [r for half, ms in (("fitted", fit), ("held out", held)) for m in ms
            for r in [_row(m, half, cal, best_cp=True)] if r]
    return {"rows": sorted(rows, key=lambda r: (r["release"], r["seq_len"])),
            "mape": {h: _mape([r for r in rows if r["half"] == h]) for h in ("fitted", "held out")}}


def main() -> None:
    result = run(with_folds="--no-folds" not in sys.argv[1:], compare="--no-compare" not in sys.argv[1:])
    print(f"{'half':8} {'source':20} {'model':20} {'gpu':6} {'n':>5} {'seq':>8} {'published':>9} "
          f"{'predicted':>9} {'err%':>6}")
    for r in result["rows"]:
        print(f"{r['half']:8} {r['source'][:20]:20} {r['model']:20} {r['gpu']:6} {r['num_gpus']:5d} {r['seq_len']:8d} "
              f"{r['published_tflops']:9.0f} {r['predicted_tflops']:9.0f} {r['error_pct']:6.1f}")
    for k, v in result["mape"].items():
        print(f"MAPE {k:18} {v['mape']}% over {v['rows']} rows")
    lc = result["long_context_moe"]
    for r in lc["rows"]:
        print(f"{r['half']:8} {r['release']:18} {r['seq_len']:7d} cp{r['layout'].split('/cp')[1].split('/')[0]:>3} "
              f"{r['cp_comm_type']:14} {r['published_tflops']:7.0f} {r['predicted_tflops']:7.0f} {r['error_pct']:6.1f}")
    for k, v in lc["mape"].items():
        print(f"MAPE long-context MoE {k:9} {v}% (best CP type per row)")
    loo = result["leave_one_out"]
    if loo:
        for f in loo["folds"] + loo["families"][:1]:
            print(f"left out {f['kind']:6} {f['name']:36} {f['rows']:3d} rows  MAPE {f['mape']:5.1f}%  "
                  f"(packaged {f['packaged_mape']}%)  refit {f['refit_cpu_s']} CPU s, {f['evaluations']} evaluations")
        for kind, v in loo["mean"].items():
            print(f"mean leave-one-{kind}-out MAPE {v}%")
        gen = loo["generalisation"]
        for c in gen["columns"]:
            print(f"leave-one-{c['column'].replace(' ', '-')}-out: {c['held_out']} held out, fitted on "
                  f"{c['fitted_on']}: {c['rows']} rows, mean |error| {c['mean']}%, max {c['max']}% "
                  f"(worst: {'; '.join(c['worst'])})")
        print(f"model classes: {gen['class_rule']}")
    fitted = result["fitted_constants"]
    print(f"constants fitted to end-to-end rows: {fitted['count']} ({', '.join(fitted['names'])})")
    if result.get("variants"):
        print("\n".join(variant_comparison.lines(result["variants"])))


def section(r: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    m = r["mape"]
    lines = [f"Predicted vs published TF/s/GPU on {r['count']} published rows ({r['skipped']} not expressible): the "
             "calibration (search_spaces/calibration/calibration.json) was fitted on the declared fit half only "
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
    lines += loo_section(r["leave_one_out"]) + variant_comparison.markdown(r.get("variants"))
    lc = r["long_context_moe"]
    lines += ["", "Long-context MoE rows (search_spaces/calibration/reference/moe_long_context.csv), scored apart "
              "from the table above, each at its best CP communication type (none is published): MAPE fitted "
              f"{lc['mape']['fitted']}%, held out **{lc['mape']['held out']}%**.", "",
              "| series | half | length | layout | best CP type | published TF/s | predicted | error % |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {x['release']} | {x['half']} | {x['seq_len'] // 1024}K | {x['layout']} | {x['cp_comm_type']} | "
              f"{x['published_tflops']} | {x['predicted_tflops']} | {x['error_pct']} |" for x in lc["rows"]]
    lines += ["", "<details><summary>every row</summary>", "",
              "| half | source | model | gpu | GPUs | seq | published | predicted | error % |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {x['half']} | {x['source']} | {x['model']} | {x['gpu']} | {x['num_gpus']} | {x['seq_len']} | "
              f"{x['published_tflops']} | {x['predicted_tflops']} | {x['error_pct']} |" for x in r["rows"]]
    return lines + ["", "</details>"]


def loo_section(loo: dict | None) -> list[str]:
    """The validation-by-source tables (the figure that counts: no left-out row was seen by its refit)."""
    if not loo:
        return []
    lines = ["", "**Validation by source** (bench/leave_one_out.py): each source left out in turn, the constants "
             "refitted on every row of the others (bench/fit_calibration.py's objective, warm-started from the "
             "packaged constants; a GPU family, release or Ultra pair no kept row measures gets the defaults, the "
             "release factor of its kernels' published benchmarks, a re-measured rate), the left-out rows "
             "(long-context MoE rows with their publisher, "
             f"at their best CP type) predicted. All refits: {loo['refit_cpu_s']:.0f} CPU s. Beside each, the "
             "packaged calibration's MAPE on the same rows (it was fitted on half of them).", "",
             "| left out | rows | MAPE % (refit without them) | packaged calibration MAPE % | refit CPU s |",
             "|---|---|---|---|---|"]
    for f in loo["folds"] + loo["families"][:1]:
        lines.append(f"| {f['kind']} {f['name']} | {f['rows']} | **{f['mape']}** | {f['packaged_mape']} | "
                     f"{f['refit_cpu_s']} |")
    means = loo["mean"]
    lines += ["", f"Mean over folds: leave-one-source-out **{means['source']}%**, leave-one-GPU-out {means['gpu']}%, "
              f"leave-one-family-out {means['family']}% (Hopper's fold is H100's).", "",
              "<details><summary>every left-out row</summary>", "",
              "| fold | model | GPU | seq | layout | published TF/s | error % |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {x['fold']} | {x['model']} | {x['gpu']} | {x['seq_len']} | {x['layout']} | "
              f"{x['published_tflops']} | {x['error_pct']} |" for x in loo["rows"]]
    return lines + ["", "</details>"] + generalisation_section(loo.get("generalisation"))


def generalisation_section(gen: dict | None) -> list[str]:
    """Issue 57's columns: leave-one-generation-out and leave-one-model-class-out, and the constants count."""
    if not gen:
        return []
    fitted = gen["fitted_constants"]
    lines = ["", "**Generalisation** (issue 57; the aim: at most 15% each; `.venv/bin/python "
             "bench/estimator_accuracy.py` prints them): the same refits, the held-out rows being a GPU generation "
             "or a model class. Model classes: " + gen["class_rule"] + ". Hopper's generation fold is H100's (its "
             "one GPU).", "",
             "| column | held out | refit on | rows | mean abs error % | max abs error % | largest misses |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| leave-one-{c['column'].replace(' ', '-')}-out | {c['held_out']} | {c['fitted_on']} | {c['rows']} | "
              f"**{c['mean']}** | {c['max']} | {'; '.join(c['worst'])} |" for c in gen["columns"]]
    return lines + ["", f"Constants fitted to end-to-end rows: **{fitted['count']}** (bench/fit_calibration.py's "
                    f"parameter vector: {', '.join(fitted['names'])})."]


if __name__ == "__main__":
    main()
