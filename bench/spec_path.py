"""How far the sweep spec travels through orchestrator/: one analytic sweep, its calls traced (issue 54).

    python bench/spec_path.py [--trials 20] [--verbose]

A *hand-off* is a distinct call site from one orchestrator module into a function of another (each counted once,
however many trials repeat it); a *room* is a subpackage of orchestrator/ (a module at its top is a room of its own).
The hand-offs that cross rooms are the stops a reader makes following the sweep from its spec to its results:
fewer stops, fewer places to open. docs/architecture.md records them before and after the rooms of issue 54.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = """name: trace
model: deepseek-v3
seq_len: 131072
gpu: h100
nodes: 128
gpus_per_node: 8
gbs: 1024
backend: analytic
seed: 0
trial_gpus: 64
budget:
  n_trials: {trials}
tracking_uri: none
storage: sqlite:///{folder}/trace.db
workdir: {folder}/runs
"""


def _module(frame) -> str:
    return frame.f_globals.get("__name__", "")


def room(module: str) -> str:
    """The room a module lives in: orchestrator's subpackage (a flat module is a room of its own)."""
    return ".".join(module.split(".")[:2])


def _hands_on_the_spec(frame) -> bool:
    """Is the SweepSpec itself an argument of this call (its own methods and properties, `self`, are no hand-off)?"""
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return any(type(frame.f_locals.get(name)).__name__ == "SweepSpec" for name in names if name != "self")


def trace_sweep(trials: int, spec_only: bool = False) -> set[tuple[str, str, str, str]]:
    """Every distinct call from one orchestrator module into another during the sweep (with `spec_only`, those
    that hand the spec on): (caller module, caller function, callee module, callee function)."""
    from orchestrator.commands import cli

    edges: set[tuple[str, str, str, str]] = set()

    def profile(frame, event, _arg):
        if event != "call" or frame.f_back is None:
            return
        callee, caller = _module(frame), _module(frame.f_back)
        if callee.startswith("orchestrator") and caller.startswith("orchestrator") and callee != caller and (
                not spec_only or _hands_on_the_spec(frame)):
            edges.add((caller, frame.f_back.f_code.co_name, callee, frame.f_code.co_name))

    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "trace.yaml"
        spec.write_text(SPEC.format(trials=trials, folder=folder))
        sys.setprofile(profile)
        try:
            code = cli.main(["sweep", str(spec), "--quiet"])
        finally:
            sys.setprofile(None)
    if code != 0:
        raise SystemExit(f"the traced sweep ended with exit code {code}")
    return edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--verbose", action="store_true", help="print every hand-off between rooms")
    parser.add_argument("--spec-only", action="store_true", help="only the calls that hand the spec itself on")
    args = parser.parse_args()
    edges = trace_sweep(args.trials, args.spec_only)
    across = {e for e in edges if room(e[0]) != room(e[2])}
    modules = {e[2] for e in edges} | {e[0] for e in edges}
    rooms = {room(m) for m in modules}
    entered = Counter(room(callee) for _, _, callee, _ in across)
    if args.verbose:
        for caller, fn, callee, name in sorted(across):
            print(f"  {caller}.{fn} -> {callee}.{name}")
    what = "of the spec " if args.spec_only else ""
    print(f"one analytic sweep ({args.trials} trials): {len(edges)} distinct hand-offs {what} between {len(modules)} "
          f"modules; {len(across)} of them cross from one room to another, over {len(rooms)} rooms")
    print("rooms entered from the most places: " + ", ".join(f"{r} {n}" for r, n in entered.most_common(8)))


if __name__ == "__main__":
    main()
