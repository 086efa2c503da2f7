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
# (0 runs all tests in this one process). Default: one per logical CPU for --fast and --deep (their tests keep a
# core busy); one more for the whole suite, whose end-to-end tests spend much of their time waiting on MLflow
# servers, Ray, Slurm jobs and deliberate time bounds: on 2 cores 3 workers took 21 min 19 s and 21 min 48 s,
# 2 workers 23 min 26 s (docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Python's default: each process that imports a module reuses its cached bytecode. With PYTHONDONTWRITEBYTECODE set
# (as on our CI machines) every CLI command, trainer rank and Ray worker compiled the project again, and every
# command in the wheel's clean venvs (installed --no-compile) compiled MLflow, Ray and Optuna again.
unset PYTHONDONTWRITEBYTECODE
PYTHON=${PYTHON:-.venv/bin/python}
LANE=(--hypothesis-profile=full)
WORKERS=$(($(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) + 1))  # nproc counts OMP_NUM_THREADS (1 above)
case "${1:-}" in
  --fast) shift; LANE=(-m "not slow" --hypothesis-profile=fast); WORKERS=logical ;;
  --deep) shift; LANE=(-m "not slow" --hypothesis-profile=deep); WORKERS=logical ;;
  *)
    if command -v slurmctld >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && [ -x slurm/ci-cluster.sh ]; then
      bash slurm/ci-cluster.sh start
    fi ;;
esac
# a crashed worker ends the run naming its test: pytest-xdist 3.8's loadgroup can hang after replacing one
# (pytest-xdist issues 1323, 1327, 1378), and a hung CI run says nothing until its time limit
XDIST=(-n "${TEST_WORKERS:-$WORKERS}" --dist loadgroup --max-worker-restart=0)
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
