#!/usr/bin/env bash
# Single-GPU check of the real trainer against the cost model (see trainers/gpu_check.py), then expert GEMM
# shapes (bench/gemm_shapes.py), the gated delta-net kernel's timing (bench/delta_net_kernel.py) and the proxy benchmark.
# Usage: scripts/gpu_check.sh [--out DIR] [--gpu NAME]   (needs torch + megatron-core; TE optional; the kernel
# timing needs fla-core + einops, pure-Python wheels carried like megatron-core's: trainers/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
out="${OUT:-gpu_check_out}"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[i]}" = "--out" ] && [ $((i + 1)) -lt ${#args[@]} ] && out="${args[i+1]}"
done
timeout 480 "$python" -m trainers.gpu_check "$@" || echo "gpu_check: the trainer check exited $?"
# expert GEMM shapes beside the cost model's shape factor (issue 31's lead)
timeout 120 "$python" bench/gemm_shapes.py --out "$out" || echo "gpu_check: the GEMM shape timing exited $?"
# one layer's chunked delta rule at Qwen3-Next's widths (skipped with one line without flash-linear-attention)
timeout 240 "$python" bench/delta_net_kernel.py --out "$out" || echo "gpu_check: the delta-net timing exited $?"
# the proxy benchmark on the layouts whose full-size run fits this machine's GPUs (skipped with one line on 1 GPU)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
gpu_name=$("$python" -c 'import torch,sys; n=torch.cuda.get_device_name().lower(); print(next((g for g in ("gb300","gb200","b300","b200","h200","h100") if g in n), "h100"))')
timeout 600 "$python" bench/proxy_accuracy.py --remeasure --gpu "$gpu_name" --max-ranks "${gpus:-1}"
