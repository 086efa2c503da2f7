"""Orchestration overhead per trial: Optuna + Ray + MLflow around a trainer that returns at once.

    python bench/sweep_overhead.py [--trials N]

Overhead per trial = (span from the first trial's start to the last trial's end, minus the time the
trainer processes ran) / trials. Ray start-up and MLflow table creation are reported apart (paid once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from optuna.trial import FrozenTrial

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _times(trial: FrozenTrial) -> tuple[datetime, datetime]:
    """A finished trial's start and end (Optuna leaves them None only before the trial starts / ends)."""
    if trial.datetime_start is None or trial.datetime_complete is None:
        raise ValueError(f"trial {trial.number} has not finished")
    return trial.datetime_start, trial.datetime_complete


def run(trials: int = 12) -> dict:
    from orchestrator.records import TrialRecord, queries
    from orchestrator.spec.schema import parse_spec
    from orchestrator.sweep import run_sweep

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.pop("MOE_AUTOTUNE_TRAINER_MODULE", None)
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as tmp:
        spec = parse_spec({
            "name": "overhead", "model": "tiny-moe", "gpu": "cpu", "gpus_per_node": 4, "seq_len": 128, "gbs": 8,
            "backend": "local", "launcher": "python", "trainer_module": "tests.fake_trainer",
            "budget": {"n_trials": trials, "max_concurrent": 1}, "seed": 0, "steps": 2, "warmup": 1,
            "storage": f"sqlite:///{tmp}/optuna.db", "tracking_uri": f"sqlite:///{tmp}/mlflow.db",
            "workdir": f"{tmp}/runs", "free": ["tp", "cp", "ep", "pp", "mbs", "recompute"],
            "fixed": {"precision": "fp32"}})
        cwd = os.getcwd()
        os.chdir(ROOT)  # the test trainer module is importable from the checkout
        try:
            start = time.monotonic()
            out = run_sweep(spec, show_progress=False)
            total = time.monotonic() - start
        finally:
            os.chdir(cwd)
        ran = sorted(queries.measured_trials(out.study), key=lambda t: _times(t)[0])
        span = (max(_times(t)[1] for t in ran) - _times(ran[0])[0]).total_seconds()
        trainer = sum(TrialRecord.of(t).launch_wall_s for t in ran)
        n = len(ran)
        return {
            "trials": n,
            "proposals_rejected_by_model": out.n_infeasible,
            "overhead_per_trial_s": round((span - trainer) / n, 3),
            "trainer_process_s_per_trial": round(trainer / n, 3),
            "wall_per_trial_s": round(span / n, 3),
            "one_time_setup_s": round(total - span, 1),
            "total_s": round(total, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    args = parser.parse_args()
    result = run(args.trials)
    print(json.dumps(result, indent=2))
    print(f"orchestration overhead per trial: {result['overhead_per_trial_s']:.3f} s "
          f"(Optuna + Ray + MLflow; trainer process itself {result['trainer_process_s_per_trial']:.3f} s)")



def section(r: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    lines = [f"Sweep of {r.get('trials')} trials (Optuna + Ray + MLflow around a trainer that returns at once): "
             f"**{r.get('overhead_per_trial_s')} s orchestration overhead per trial**.", "",
             "| figure | value |", "|---|---|"]
    return lines + [f"| {k} | {v} |" for k, v in r.items()]


if __name__ == "__main__":
    main()
