"""Single-GPU check of the trainer against the cost model: `scripts/gpu_check.sh [--out DIR]`.

Runs a scaled-down qwen3-30b-a3b (2 layers, full width, all 128 experts) through a handful of layouts on
one GPU -- recompute variants, fp8 when Transformer Engine is installed -- each as a real
`torchrun -m trainers.megatron_moe` trial, then prints measured vs predicted (tokens/s, TF/s, peak memory,
activations per microbatch) and writes every result plus summary.json under --out. Budget: < 8 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from search_spaces.catalog.models import load_model
from search_spaces.cost.costmodel import estimate
from search_spaces.layouts.layout import Layout
from search_spaces.result import TrialResult

MODEL = "qwen3-30b-a3b"
NUM_LAYERS = 2
SEQ_LEN = 4096
BASE = dict(mbs=1, gbs=2, precision="bf16")
LAYOUTS = {
    "bf16": dict(BASE),
    "recompute-moe_act,layernorm": dict(BASE, recompute="moe_act,layernorm"),
    "recompute-core_attn": dict(BASE, recompute="core_attn"),
    "recompute-full": dict(BASE, recompute="full"),
}
# No CUDA-graph layout: per-layer scopes of MoE layers are a gap of this trainer (config.capability_gaps; the H200
# check of 2026-12-04 showed Megatron-Core's local graphs capturing the whole MoE layer and failing).
FP8_LAYOUTS = {"fp8-tensorwise": dict(BASE, precision="fp8-tensorwise")}
TIMEOUT_S = 150  # per trial; the whole check stays under 8 minutes


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
        return True
    except ImportError:
        return False


def run_trial(name: str, layout: Layout, out: Path, gpu: str) -> TrialResult:
    result_path = out / f"{name}.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "1",
            "-m", "trainers.megatron_moe", "--model", MODEL,
            "--num-layers", str(NUM_LAYERS), "--seq-len", str(SEQ_LEN), "--warmup", "2", "--steps", "3",
            "--gpu", gpu, *layout.to_flags(), "--result", str(result_path)]
    with open(out / f"{name}.log", "w") as log:
        try:
            subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return TrialResult(status="timeout", error=f"over {TIMEOUT_S} s", layout=layout.to_dict())
    if not result_path.exists():
        return TrialResult(status="error", error=f"no result; see {name}.log", layout=layout.to_dict())
    return TrialResult.read(result_path)


def _fmt(value, digits=1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    parser.add_argument("--gpu", default=None, help="catalog GPU name (default: detected)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device", file=sys.stderr)
        return 2
    from trainers.megatron_moe import _gpu_name

    gpu = args.gpu or _gpu_name("auto", on_cpu=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    layouts = dict(LAYOUTS, **(FP8_LAYOUTS if have_transformer_engine() else {}))
    model = load_model(MODEL).with_overrides(num_layers=NUM_LAYERS)
    print(f"gpu_check: {MODEL} with {NUM_LAYERS} layers, seq {SEQ_LEN}, on {torch.cuda.get_device_name()} ({gpu}); "
          f"Transformer Engine: {have_transformer_engine()}", flush=True)

    rows, start = [], time.time()
    header = (f"{'layout':30} {'status':8} {'tok/s meas':>10} {'pred':>9} {'TF/s meas':>9} {'pred':>7} "
              f"{'peak GiB meas':>13} {'pred':>7} {'act/mb GiB meas':>15} {'pred':>7}")
    print(header, flush=True)
    for name, fields in layouts.items():
        layout = Layout.from_dict(fields)
        result = run_trial(name, layout, out, gpu)
        try:
            pred = estimate(model, gpu, 1, SEQ_LEN, layout).to_dict()
        except Exception as exc:  # noqa: BLE001 -- an unknown GPU name must not hide the measurements
            pred = {"error": str(exc), "breakdown": {"memory_gib": {}}}
        pmem = pred.get("breakdown", {}).get("memory_gib", {})
        row = {"layout": name, "status": result.status, "error": result.error,
               "measured": {"tokens_per_sec_per_gpu": result.tokens_per_sec_per_gpu,
                            "tflops_per_gpu": result.tflops_per_gpu, "peak_memory_gib": result.peak_memory_gib,
                            "memory_gib": result.memory_gib, "applied": result.applied},
               "predicted": pred}
        rows.append(row)
        print(f"{name:30} {result.status:8} {_fmt(result.tokens_per_sec_per_gpu, 0):>10} "
              f"{_fmt(pred.get('tokens_per_sec_per_gpu'), 0):>9} {_fmt(result.tflops_per_gpu):>9} "
              f"{_fmt(pred.get('tflops_per_gpu')):>7} {_fmt(result.peak_memory_gib, 2):>13} "
              f"{_fmt(pred.get('peak_memory_gib'), 2):>7} "
              f"{_fmt(result.memory_gib.get('activations_per_microbatch'), 3):>15} "
              f"{_fmt(pmem.get('activations_per_microbatch'), 3):>7}", flush=True)
        if result.status != "ok" and result.error:
            print(f"    {result.error.splitlines()[0][:200]}", flush=True)
    (out / "summary.json").write_text(json.dumps({"gpu": gpu, "model": MODEL, "num_layers": NUM_LAYERS,
                                                  "seq_len": SEQ_LEN, "rows": rows}, indent=2, default=str))
    print(f"gpu_check: {len(rows)} layouts in {time.time() - start:.0f} s; results in {out}/", flush=True)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
