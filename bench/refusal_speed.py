"""Time to refuse bad input: `moe-autotune` started as a user starts it, on a spec it must refuse, and `--help`.

    python bench/refusal_speed.py [--runs N]

Each case runs N times in a fresh process; the figures are the median wall time and the median CPU time of the
process (user + system: less at the mercy of a shared machine's load than the wall clock). Each case also lists
the heavy libraries the process loaded (Ray, MLflow, pandas, torch, Optuna, plotly, scipy, SQLAlchemy): a refusal
should load none of them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEAVY = ("ray", "mlflow", "pandas", "torch", "optuna", "plotly", "scipy", "sqlalchemy")
# runs the CLI's main(), then says which heavy libraries ended up loaded (on stdout's last line)
_PROBE = ("import sys, json\n"
          "from orchestrator.commands.cli import main\n"
          "try:\n"
          "    code = main(sys.argv[1:])\n"
          "except SystemExit as exc:\n"
          "    code = exc.code\n"
          f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
          "sys.exit(code)\n")

SPECS = {
    "an unknown model": "name: refused\nmodel: no-such-model\ngpu: h100\nseq_len: 4096\ngbs: 64\n",
    "a misspelt field": "name: refused\nmodel: tiny-moe\ngpu: h100\nseq_len: 4096\ngbs: 64\nnodez: 2\n",
    "a spec that is not YAML": "name: [unclosed\n",
}


def _one(argv: list[str]) -> tuple[float, float, int, list[str]]:
    """(wall s, CPU s, exit code, heavy modules loaded) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "[]"
    try:
        loaded = json.loads(last)
    except ValueError:
        loaded = ["?"]
    return wall, cpu, done.returncode, loaded


def run(runs: int = 5) -> dict:
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="refusal-speed-") as tmp:
        cases = {"--help": ["--help"]}
        for name, text in SPECS.items():
            path = Path(tmp) / f"{name.replace(' ', '-')}.yaml"
            path.write_text(text)
            cases[f"sweep with {name}"] = ["sweep", str(path)]
        cases["status with a name that is not plain"] = ["status", "a b"]
        for name, argv in cases.items():
            samples = [_one(argv) for _ in range(runs)]
            out[name] = {"median_wall_s": round(statistics.median(s[0] for s in samples), 2),
                         "median_cpu_s": round(statistics.median(s[1] for s in samples), 2),
                         "exit_code": samples[0][2], "heavy_modules_loaded": samples[0][3], "runs": runs}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    result = run(parser.parse_args().runs)
    print(json.dumps(result, indent=2))
    for name, r in result.items():
        print(f"{name}: {r['median_wall_s']:.2f} s wall, {r['median_cpu_s']:.2f} s CPU (exit {r['exit_code']}; "
              f"heavy libraries loaded: {', '.join(r['heavy_modules_loaded']) or 'none'})")


def section(r: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    lines = ["Refusing bad input costs the CLI's start-up, not the sweep's libraries: each case in a fresh process, "
             "median of the runs (wall time on a shared machine is an upper bound; CPU time is the steadier figure).",
             "", "| case | wall s | CPU s | exit | heavy libraries loaded |", "|---|---|---|---|---|"]
    return lines + [f"| {k} | {v['median_wall_s']} | {v['median_cpu_s']} | {v['exit_code']} | "
                    f"{', '.join(v['heavy_modules_loaded']) or 'none'} |" for k, v in r.items()]


if __name__ == "__main__":
    main()
