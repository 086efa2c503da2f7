#!/usr/bin/env bash
# The test command (README and .ci/run use this same line): starts the emulated Slurm cluster when
# Slurm is installed, then runs the whole suite, slow end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if command -v slurmctld >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && [ -x slurm/ci-cluster.sh ]; then
  bash slurm/ci-cluster.sh start
fi
exec .venv/bin/python -m pytest "$@"
