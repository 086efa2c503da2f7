"""How fast the what-if side answers, as a user sees it (the command's wall time, start-up and imports included):

- `moe-autotune space` over DeepSeek-V3 at 128K on 1,024 H100;
- `moe-autotune sweep examples/deepseek-v3-128k-h100x1024.yaml`: 200 analytic trials of the same situation with
  the default search and stores (the journal-file Optuna storage, the SQLite MLflow store); and the same sweep
  with a SQLite Optuna storage (`--storage sqlite:///...`, the default before 2026-12-05) beside it;
- `moe-autotune estimate` of one layout of it;

each in seconds and as a ratio to BASELINE (the figures of 2026-12-02, before the cost model was memoised), and
an analytic sweep of 200 trials with each of the sweep's searches (in this process, stores included).

    python bench/sweep_speed.py                 # every figure
    python bench/sweep_speed.py --no-searches   # the three commands only

Timings belong here, not in tests/ (tests assert behaviour; a shared machine makes times noisy: the figures are
one run each, the estimate's the median of three). Beside each wall time, the CPU seconds the command's processes
used (user + sys, its forked workers included), and the load average when the run began: on a loaded machine the
wall times say little, the CPU seconds more. The commands run with bytecode caching on (a warm-up run first), as
an installed package's would: PYTHONDONTWRITEBYTECODE would make every run compile the project again. They run as on
a machine that has made an MLflow store before: the MLflow schema template (orchestrator/storage/mlflow_template.py) is
made first, in a cache folder of the benchmark's own; a machine's first store pays its making once (about 1.3 s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "examples" / "deepseek-v3-128k-h100x1024.yaml"
CLI = [sys.executable, "-m", "orchestrator.commands.cli"]
SITUATION = ["--model", "deepseek-v3", "--gpu", "h100", "--num-gpus", "1024", "--seq-len", "131072"]
# the layout `space` ranks first there
LAYOUT = ["--tp", "2", "--cp", "8", "--ep", "16", "--pp", "8", "--vpp", "8", "--gbs", "128", "--precision", "fp8",
          "--dispatcher", "deepep", "--recompute", "mla_up_proj,layernorm,moe,mlp", "--cp-comm-type", "a2a+p2p",
          "--hierarchical-cp", "4,2"]
# The commands' wall times on a quiet 2-core machine on 2026-12-02 (commit e7f2161, before the cost model was
# memoised): the ratios below are to these.
BASELINE_DATE = "2026-12-02"
BASELINE_S = {"space": 31.0, "sweep": 90.0, "estimate": 1.1}
GOAL_S = {"space": 3.0, "sweep": 10.0, "estimate": 0.5}  # issue 33


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT)}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], cwd: Path | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of `moe-autotune ARGV` in a fresh process."""
    cpu = _children_cpu_s()
    start = time.perf_counter()
    done = subprocess.run([*CLI, *argv], cwd=cwd or ROOT, capture_output=True, text=True, check=False, env=_env())
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"moe-autotune {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return seconds, _children_cpu_s() - cpu, done.stdout


def commands() -> dict:
    """The three commands' wall and CPU times (and what `space` found)."""
    load = os.getloadavg()[0]
    _timed(["estimate", *SITUATION, *LAYOUT, "--json"])  # warm-up: the project's bytecode cached
    space_s, space_cpu, out = _timed(["space", *SITUATION, "--json"])
    found = json.loads(out)
    with tempfile.TemporaryDirectory(prefix="sweep-speed-") as tmp:
        sweep_s, sweep_cpu, _ = _timed(["sweep", str(SPEC), "--storage", f"journal:///{tmp}/optuna.journal",
                                        "--tracking-uri", f"sqlite:///{tmp}/mlflow.db", "--seed", "0", "--quiet"],
                                       cwd=Path(tmp))
    with tempfile.TemporaryDirectory(prefix="sweep-speed-") as tmp:
        sqlite_s, sqlite_cpu, _ = _timed(["sweep", str(SPEC), "--storage", f"sqlite:///{tmp}/optuna.db",
                                          "--tracking-uri", f"sqlite:///{tmp}/mlflow.db", "--seed", "0", "--quiet"],
                                         cwd=Path(tmp))
    runs = sorted(_timed(["estimate", *SITUATION, *LAYOUT, "--json"])[:2] for _ in range(3))
    estimate_s, estimate_cpu = runs[1]  # the median run by wall time
    return {"space": round(space_s, 2), "sweep": round(sweep_s, 2), "estimate": round(estimate_s, 2),
            "sweep_sqlite": round(sqlite_s, 2),
            "cpu": {"space": round(space_cpu, 2), "sweep": round(sweep_cpu, 2), "estimate": round(estimate_cpu, 2),
                    "sweep_sqlite": round(sqlite_cpu, 2)},
            "load_average": round(load, 2), "cores": os.cpu_count(),
            "space_total": found["total"], "space_legal": found["legal_count"], "space_cut_short": found["cut_short"]}


def searches(names: tuple[str, ...] = ("calibrated", "tpe", "random", "grid")) -> dict:
    """An analytic sweep of 200 trials of the example with each search, in this process (stores included)."""
    from orchestrator.spec.schema import load_spec
    from orchestrator.sweep import run_sweep

    out = {}
    for search in names:
        with tempfile.TemporaryDirectory(prefix="sweep-speed-") as tmp:
            spec = load_spec(SPEC, {"storage": f"journal:///{tmp}/optuna.journal",
                                    "tracking_uri": f"sqlite:///{tmp}/mlflow.db", "search": search, "seed": 0})
            spec = spec.model_copy(update={"workdir": f"{tmp}/runs"})
            start = time.perf_counter()
            result = run_sweep(spec, show_progress=False)
            out[search] = {"seconds": round(time.perf_counter() - start, 1), "trials": result.n_measured,
                           "rejected": result.n_infeasible,
                           "best_tokens_per_sec_per_gpu": round(result.best.values[0], 1) if result.best else None}
    return out


def run(with_searches: bool = True) -> dict:
    from orchestrator.storage import mlflow_template, open_mlflow

    with tempfile.TemporaryDirectory(prefix="sweep-speed-cache-") as cache:
        os.environ[mlflow_template.CACHE_ENV] = cache  # the commands' processes and the searches use it
        try:
            open_mlflow(f"sqlite:///{cache}/warm-up.db", create=True)  # the template made, as after a sweep
            return {"commands": commands(), "sweeps": searches() if with_searches else {}}
        finally:
            del os.environ[mlflow_template.CACHE_ENV]


def section(result: dict) -> list[str]:
    if "commands" not in result:  # a result stored before the commands were timed (bench/results.json)
        return ["Stored before this benchmark timed the commands: rerun `python bench/run_all.py --only sweep_speed`."]
    c = result["commands"]
    what = {"space": f"`space` DeepSeek-V3 131072 tokens on 1024 H100 ({c['space_total']:,} combinations, "
                     f"{c['space_legal']:,} legal{', cut short by --budget' if c['space_cut_short'] else ''})",
            "sweep": "`sweep` examples/deepseek-v3-128k-h100x1024.yaml: 200 analytic trials, the default stores "
                     "(a journal-file Optuna storage, a SQLite MLflow store)",
            "estimate": "`estimate` of one layout of it (median of 3)"}
    lines = [f"Each command's wall time, start-up and imports included; ratio to the figures of {BASELINE_DATE} "
             f"(a quiet 2-core machine, before the cost model was memoised). This run: {c['cores']} cores, load "
             f"average {c['load_average']} when it began; CPU s is user + sys of the command's processes:", "",
             "| command | seconds | CPU s | ratio to baseline | baseline s | goal s |", "|---|---|---|---|---|---|"]
    lines += [f"| {what[k]} | **{c[k]}** | {c['cpu'][k]} | {c[k] / BASELINE_S[k]:.2f} | {BASELINE_S[k]} | "
              f"{GOAL_S[k]} |" for k in BASELINE_S]
    if "sweep_sqlite" in c:
        lines += [f"| the same sweep with a SQLite Optuna storage (`--storage sqlite:///...`) | {c['sweep_sqlite']} | "
                  f"{c['cpu']['sweep_sqlite']} | {c['sweep_sqlite'] / BASELINE_S['sweep']:.2f} | {BASELINE_S['sweep']} "
                  f"| {GOAL_S['sweep']} |"]
    if result["sweeps"]:
        lines += ["", "An analytic sweep of the same situation with each search (in one process, seed 0):", "",
                  "| search | trials | rejected by the cost model | seconds | best tokens/s/GPU |",
                  "|---|---|---|---|---|"]
        lines += [f"| {name} | {s['trials']} | {s['rejected']} | {s['seconds']} | {s['best_tokens_per_sec_per_gpu']} |"
                  for name, s in result["sweeps"].items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-searches", action="store_true", help="the three commands only")
    args = parser.parse_args()
    print("\n".join(section(run(with_searches=not args.no_searches))))


if __name__ == "__main__":
    main()
