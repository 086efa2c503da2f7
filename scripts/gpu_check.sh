#!/usr/bin/env bash
# Single-GPU check of the real trainer against the cost model (see trainers/gpu_check.py).
# Usage: scripts/gpu_check.sh [--out DIR] [--gpu NAME]   (needs torch + megatron-core; TE optional)
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
exec timeout 480 "$python" -m trainers.gpu_check "$@"
