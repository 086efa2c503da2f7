"""Run every benchmark once and write bench/RESULTS.md (machine, date, each figure).

    .venv/bin/python bench/run_all.py [--quick] [--out bench/RESULTS.md]

Each benchmark is imported and its `run()` called; one that is missing or fails is reported in the results
(with its error) instead of stopping the others.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PACKAGES = ("torch", "megatron-core", "optuna", "ray", "mlflow", "numpy", "pandas", "pydantic")


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 ** 2, 1)
    except OSError:
        pass
    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib, "os": platform.platform(),
            "python": platform.python_version(), "versions": versions}


def attempt(module: str, call: Callable[[Any], dict]) -> dict[str, Any]:
    """Import bench.<module> and run it; {'ok', 'result' | 'error', 'seconds'}."""
    start = time.monotonic()
    try:
        mod = importlib.import_module(f"bench.{module}")
        result = call(mod)
        return {"ok": True, "result": result, "seconds": round(time.monotonic() - start, 1)}
    except Exception as exc:  # a broken benchmark is a result too
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6), "seconds": round(time.monotonic() - start, 1)}


def _failed(title: str, outcome: dict) -> list[str]:
    return [f"## {title}", "", f"**Did not run:** `{outcome['error']}`", "", "```", outcome["traceback"].rstrip(),
            "```", ""]


def estimator_section(outcome: dict) -> list[str]:
    title = "Estimator accuracy (bench/estimator_accuracy.py)"
    if not outcome["ok"]:
        return _failed(title, outcome)
    r = outcome["result"]
    lines = [f"## {title}", "",
             f"Predicted vs published TF/s/GPU on {r['count']} published rows (Megatron-Bridge performance "
             f"summary and MoE skill card; {r['skipped']} rows skipped as not expressible). "
             f"**MAPE, all rows: {r['mape_all']}%**", "",
             "| GPU family | MAPE % |", "|---|---|"]
    lines += [f"| {fam} | {v} |" for fam, v in r["mape"].items()]
    lines += ["", "| GPU | MAPE % |", "|---|---|"]
    lines += [f"| {gpu} | {v} |" for gpu, v in r.get("mape_by_gpu", {}).items()]
    lines += ["", "<details><summary>every row</summary>", "",
              "| model | gpu | GPUs | seq | published | predicted | error % |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {x['model']} | {x['gpu']} | {x['num_gpus']} | {x['seq_len']} | {x['published_tflops']} | "
              f"{x['predicted_tflops']} | {x['error_pct']} |" for x in r["rows"]]
    lines += ["", "</details>", "", f"({outcome['seconds']} s)", ""]
    return lines


def search_section(outcome: dict) -> list[str]:
    title = "Search efficiency (bench/search_efficiency.py)"
    if not outcome["ok"]:
        return _failed(title, outcome)
    from bench import search_efficiency as se
    r = outcome["result"]
    e = r["errors"]
    lines = [f"## {title}", "",
             f"Trials until a measured layout is within {100 - 100 * r['target']:.0f}% of the exhaustive optimum, "
             f"over {r['seeds']} seeds{''.join(f' ({k}: {v} seeds)' for k, v in se.FEWER_SEEDS.items())}, budget {r['budget']} trials (\">{r['budget']}\" = not reached). Landscapes "
             f"from the cost model with deliberate model error (per dimension value: throughput "
             f"x exp(N(0, {e['tokens_sigma']})), memory x exp(N(0, {e['memory_sigma']}))) and "
             f"{e['noise_sigma']:.0%} measurement noise. GPU-hours = trials x num_gpus x "
             f"({r['startup_s']:.0f} s start-up + {r['steps']} steps) of the modelled step time; "
             "the exhaustive column is every layout of the case measured once. Made-up landscapes, not measurements: "
             "they compare strategies, they do not predict a cluster.", "",
             se.table(r), "", f"({outcome['seconds']} s)", ""]
    return lines


def overhead_section(outcome: dict) -> list[str]:
    title = "Orchestration overhead (bench/sweep_overhead.py)"
    if not outcome["ok"]:
        return _failed(title, outcome)
    r = outcome["result"]
    lines = [f"## {title}", "",
             f"Sweep of {r.get('trials')} trials (Optuna + Ray + MLflow around a trainer that returns at once): "
             f"**{r.get('overhead_per_trial_s')} s orchestration overhead per trial**.", "",
             "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.items()]
    lines += ["", f"({outcome['seconds']} s)", ""]
    return lines


def write_results(path: Path, info: dict, outcomes: dict[str, dict], started: str, seconds: float) -> None:
    v = ", ".join(f"{k} {ver}" for k, ver in info["versions"].items())
    lines = ["# Benchmark results", "",
             f"Written by `bench/run_all.py` on {started} (UTC), {seconds:.0f} s in all. Rerun it to refresh.", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB memory, {info['os']}; "
             f"Python {info['python']}; {v}. The machine was shared with other jobs while this ran: times are "
             "upper bounds.", ""]
    lines += estimator_section(outcomes["estimator_accuracy"])
    lines += search_section(outcomes["search_efficiency"])
    lines += overhead_section(outcomes["sweep_overhead"])
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller search-efficiency run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures as JSON")
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    start = time.monotonic()
    outcomes = {
        "estimator_accuracy": attempt("estimator_accuracy", lambda m: m.run()),
        "search_efficiency": attempt("search_efficiency", lambda m: m.run(quick=args.quick, verbose=True)),
        "sweep_overhead": attempt("sweep_overhead", lambda m: m.run()),
    }
    for name, outcome in outcomes.items():
        print(f"{name}: {'ok' if outcome['ok'] else 'FAILED ' + outcome['error']} ({outcome['seconds']} s)",
              file=sys.stderr)
    write_results(args.out, machine(), outcomes, started, time.monotonic() - start)
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=2, default=str))
    print(f"wrote {args.out}")
    return 0 if all(o["ok"] for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
