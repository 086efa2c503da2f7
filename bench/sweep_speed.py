"""How fast the what-if side answers: `space` over DeepSeek-V3 at 128K on 1024 H100, and an analytic sweep of
200 trials of the same situation with each of the sweep's samplers (storage, MLflow and all).

    python bench/sweep_speed.py

Timings belong here, not in tests/ (tests assert behaviour; a shared CI machine makes times noisy).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "examples" / "deepseek-v3-128k-h100x1024.yaml"


def run(searches: tuple[str, ...] = ("calibrated", "tpe", "random", "grid")) -> dict:
    from orchestrator.spec import load_spec
    from orchestrator.sweep import run_sweep
    from search_spaces.space import explore

    start = time.perf_counter()
    found = explore("deepseek-v3", "h100", 1024, 131072, top=10)
    out: dict = {"space_seconds": round(time.perf_counter() - start, 2), "space_legal": found.legal_count,
                 "space_total": found.total, "sweeps": {}}
    for search in searches:
        with tempfile.TemporaryDirectory(prefix="sweep-speed-") as tmp:
            spec = load_spec(SPEC, {"storage": f"sqlite:///{tmp}/optuna.db", "tracking_uri": f"sqlite:///{tmp}/mlflow.db",
                                    "search": search, "seed": 0})
            spec = spec.model_copy(update={"workdir": f"{tmp}/runs"})
            start = time.perf_counter()
            result = run_sweep(spec, show_progress=False)
            out["sweeps"][search] = {"seconds": round(time.perf_counter() - start, 1), "trials": result.n_measured,
                                     "rejected": result.n_infeasible,
                                     "best_tokens_per_sec_per_gpu": round(result.best.values[0], 1) if result.best else None}
    return out


def section(result: dict) -> list[str]:
    lines = [f"`space` DeepSeek-V3 131072 tokens on 1024 H100: {result['space_total']:,} combinations, "
             f"{result['space_legal']:,} legal, **{result['space_seconds']} s**. An analytic sweep of the same situation "
             f"(examples/deepseek-v3-128k-h100x1024.yaml, SQLite storage and MLflow store, seed 0):", "",
             "| search | trials | rejected by the cost model | seconds | best tokens/s/GPU |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {s['trials']} | {s['rejected']} | {s['seconds']} | {s['best_tokens_per_sec_per_gpu']} |"
              for name, s in result["sweeps"].items()]
    return lines


def main() -> None:
    print("\n".join(section(run())))


if __name__ == "__main__":
    main()
