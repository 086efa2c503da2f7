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


def attempt(module: str, call: Callable[[Any, argparse.Namespace], dict], args: argparse.Namespace) -> dict[str, Any]:
    """Import bench.<module> and run it (`call(module, args)`); {'ok', 'result' | 'error', 'seconds'}."""
    start = time.monotonic()
    try:
        mod = importlib.import_module(f"bench.{module}")
        result = call(mod, args)
        return {"ok": True, "result": result, "seconds": round(time.monotonic() - start, 1)}
    except Exception as exc:  # noqa: BLE001 -- a broken benchmark is a result too
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6), "seconds": round(time.monotonic() - start, 1)}


def _failed(title: str, outcome: dict) -> list[str]:
    return [f"## {title}", "", f"**Did not run:** `{outcome['error']}`", "", "```", outcome["traceback"].rstrip(),
            "```", ""]


# (module, title, how run_all calls its run()); each module's section(result) writes its figures
BENCHMARKS: list[tuple[str, str, Callable[[Any, argparse.Namespace], dict]]] = [
    ("estimator_accuracy", "Estimator accuracy", lambda m, a: m.run()),
    ("knob_effects", "Knob effects: published same-layout A/B pairs", lambda m, a: m.run(with_space=True)),
    # measured runs come from bench/memory_measurements.json (bench/memory_accuracy.py --remeasure refreshes it)
    ("memory_accuracy", "Memory accuracy", lambda m, a: m.run()),
    # cached trainer runs in bench/proxy_accuracy.json (bench/proxy_accuracy.py --remeasure refreshes them)
    ("proxy_accuracy", "Proxy accuracy (proxy trial composed vs the full layout, real trainer)", lambda m, a: m.run()),
    ("long_context", "Long context: DeepSeek-V3 from 4K to 128K, CP communication per length", lambda m, a: m.run()),
    ("cpu_calibration", "CPU calibration (real trainer vs estimate --gpu cpu)", lambda m, a: m.run()),
    ("transfer_check", "Transfer: calibrate at one length, rank at twice that length", lambda m, a: m.run()),
    ("search_efficiency", "Search efficiency", lambda m, a: m.run(quick=a.quick, verbose=True)),
    ("gpu_hours", "GPU-hours per answer", lambda m, a: m.run(quick=a.quick, verbose=True)),
    # stored figures of the last single-GPU check (scripts/gpu_check.sh on a lent GPU)
    ("gpu_results", "Single-GPU check (scripts/gpu_check.sh)", lambda m, a: m.run()),
    ("sweep_speed", "What-if speed", lambda m, a: m.run()),
    ("sweep_overhead", "Orchestration overhead", lambda m, a: m.run()),
    ("refusal_speed", "Time to refuse bad input (and --help)", lambda m, a: m.run(runs=3 if a.quick else 5)),
]


def section(module: str, title: str, outcome: dict) -> list[str]:
    lines = [f"## {title} (bench/{module}.py)", ""]
    if not outcome["ok"]:
        return lines + [f"**Did not run:** `{outcome['error']}`", "", "```", outcome["traceback"].rstrip(), "```", ""]
    body = importlib.import_module(f"bench.{module}").section(outcome["result"])
    return lines + body + ["", f"({outcome['seconds']} s)", ""]


def write_results(path: Path, info: dict, outcomes: dict[str, dict], started: str, seconds: float,
                  only: list[str] | None = None) -> None:
    v = ", ".join(f"{k} {ver}" for k, ver in info["versions"].items())
    ran = (f"{', '.join(only)} rerun ({seconds:.0f} s), the others' figures kept from bench/results.json" if only
           else f"{seconds:.0f} s in all")
    lines = ["# Benchmark results", "",
             f"Written by `bench/run_all.py` on {started} (UTC), {ran}. Rerun it to refresh.", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB memory, {info['os']}; "
             f"Python {info['python']}; {v}. The machine was shared with other jobs while this ran: times are "
             "upper bounds.", ""]
    for module, title, _ in BENCHMARKS:
        lines += section(module, title, outcomes[module])
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller search-efficiency run")
    parser.add_argument("--only", nargs="+", default=None, metavar="MODULE",
                        help="run these benchmarks only; the others keep their last figures (from --json)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results.json",
                        help="the raw figures of every benchmark (read back by --only)")
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    start = time.monotonic()
    outcomes = json.loads(args.json.read_text()) if args.only and args.json.is_file() else {}
    for module, _, call in BENCHMARKS:
        if not args.only or module in args.only or module not in outcomes:
            outcomes[module] = attempt(module, call, args)
    for name, outcome in outcomes.items():
        print(f"{name}: {'ok' if outcome['ok'] else 'FAILED ' + outcome['error']} ({outcome['seconds']} s)",
              file=sys.stderr)
    write_results(args.out, machine(), outcomes, started, time.monotonic() - start, args.only)
    args.json.write_text(json.dumps(outcomes, indent=2, default=str))
    print(f"wrote {args.out}")
    return 0 if all(o["ok"] for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
