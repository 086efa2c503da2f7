"""Run a sweep from a JSON spec in a separate process (for tests that SIGKILL the orchestrator).

python -m tests.sweep_runner SPEC.json [--resume]; uses the stand-in prior until search_spaces is complete.
"""

from __future__ import annotations

import json
import sys

from orchestrator.spec.schema import parse_spec
from orchestrator.sweep import run_sweep
from tests.sweep_helpers import prior_for


def main(argv: list[str]) -> int:
    spec = parse_spec(json.loads(open(argv[0]).read()))
    outcome = run_sweep(spec, resume="--resume" in argv, prior=prior_for(spec), show_progress=False)
    print(json.dumps({"n_measured": outcome.n_measured, "best": outcome.best.number if outcome.best else None}))
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
