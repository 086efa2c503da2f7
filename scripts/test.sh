#!/usr/bin/env bash
# The test command (README and .ci/run use this same line).
#   scripts/test.sh          the whole suite, slow end-to-end tests included (CI): starts the emulated Slurm
#                            cluster when Slurm is installed
#   scripts/test.sh --fast   the inner loop: no Slurm, Ray or real trainer (the tests not marked slow), the
#                            property tests on few examples (Hypothesis profile "fast", tests/conftest.py)
#   scripts/test.sh --deep   the fast lane's tests with the property tests on thousands of examples each
#                            (profile "deep": a nightly-size run)
# Every lane runs on pytest-xdist workers (--dist loadgroup: tests marked xdist_group share one worker) and
# prints the 15 slowest tests, its wall time and its processes' CPU time. Further arguments go to pytest.
# Settings (env): PYTHON, the interpreter (default: the repository's .venv); TEST_WORKERS, the xdist workers
# (default logical: one per logical CPU; 0 runs all tests in this one process). TEST_WORKERS=3 on 2 cores ran the
# whole suite no faster on a quiet machine (25 min 48 s against 26 min 1 s) and its extra load has broken
# timing-sensitive end-to-end tests on a shared one (docs/development.md): not the default.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PYTHON=${PYTHON:-.venv/bin/python}
LANE=(--hypothesis-profile=full)
case "${1:-}" in
  --fast) shift; LANE=(-m "not slow" --hypothesis-profile=fast) ;;
  --deep) shift; LANE=(-m "not slow" --hypothesis-profile=deep) ;;
  *)
    if command -v slurmctld >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && [ -x slurm/ci-cluster.sh ]; then
      bash slurm/ci-cluster.sh start
    fi ;;
esac
XDIST=(-n "${TEST_WORKERS:-logical}" --dist loadgroup)
start=$(date +%s)
rc=0
"$PYTHON" -m pytest "${LANE[@]}" "${XDIST[@]}" --durations=15 "$@" || rc=$?
elapsed=$(($(date +%s) - start))
# the CPU time of the tests' processes as well: on a busy machine the wall time says little, the CPU time holds
cpu_file=$(mktemp)
times > "$cpu_file"  # in this shell (a subshell's children are not the tests); line 2: children's user and sys
read -r cpu_user cpu_sys < <(sed -n 2p "$cpu_file")
rm -f "$cpu_file"
printf 'scripts/test.sh %s: wall time %dm %02ds, CPU time %s user + %s sys (exit %d)\n' "${LANE[*]}" \
  $((elapsed / 60)) $((elapsed % 60)) "$cpu_user" "$cpu_sys" "$rc"
exit "$rc"
