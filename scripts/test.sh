#!/usr/bin/env bash
# The test command (README and .ci/run use this same line).
#   scripts/test.sh          the whole suite, slow end-to-end tests included (CI): starts the emulated Slurm
#                            cluster when Slurm is installed, and prints the 15 slowest tests
#   scripts/test.sh --fast   the inner loop: no Slurm, Ray or real trainer (the tests not marked slow), the
#                            property tests on fewer examples (tests/conftest.py)
# Further arguments go to pytest. PYTHON names the interpreter (default: the repository's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PYTHON=${PYTHON:-.venv/bin/python}
if [ "${1:-}" = "--fast" ]; then
  shift
  exec "$PYTHON" -m pytest -m "not slow" --hypothesis-profile=fast --durations=15 "$@"
fi
if command -v slurmctld >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && [ -x slurm/ci-cluster.sh ]; then
  bash slurm/ci-cluster.sh start
fi
exec "$PYTHON" -m pytest --durations=15 "$@"
