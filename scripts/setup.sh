#!/usr/bin/env bash
# One-command setup: system packages (when root and apt is there), a Python 3.12 venv at .venv,
# and the project with the trainer (torch, megatron-core), test, team (PostgreSQL driver), docs (MkDocs) and dashboard
# (optuna-dashboard) extras. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  # megatron-core >= 0.17 needs Python >= 3.12. The pyenv shim for python3.12 fails unless
  # PYENV_VERSION is set, so look for real interpreters and check each one runs.
  local candidates=()
  if command -v pyenv >/dev/null 2>&1; then
    local root; root=$(pyenv root)
    candidates+=("$root"/versions/3.12*/bin/python "$root"/versions/3.13*/bin/python)
  fi
  candidates+=("$HOME"/.pyenv/versions/3.12*/bin/python /usr/bin/python3.12 /usr/local/bin/python3.12
               python3.12 python3.13 python3)
  for py in "${candidates[@]}"; do
    if "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; then
      echo "$py"; return 0
    fi
  done
  echo "error: no Python >= 3.12 found (megatron-core needs it); install one or put it on PATH" >&2
  return 2
}

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ "${MOE_AUTOTUNE_SKIP_APT:-0}" != 1 ]; then
  # Real Slurm for the Slurm tests, Chromium for the report test, PostgreSQL for the team-stack test.
  missing=()
  for pkg in slurmctld slurmd slurm-client munge chromium postgresql; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

PY=$(find_python)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[train,dev,team,docs,dashboard]"
# Megatron-Bridge's config layer, for tests/orchestrator/test_consumers.py: without its runtime requirements (GPU-only
# packages); the light ones its config modules import are in the dev extra.
.venv/bin/python -m pip install -q --no-deps megatron-bridge==0.6.2
echo "setup done: $(.venv/bin/python --version) in .venv"
