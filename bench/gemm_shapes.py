"""Expert GEMM shapes on one GPU: measured BF16 TF/s of each catalog MoE's expert projections, tokens per expert
swept, beside the cost model's shape factor (search_spaces/cost/gpu_terms.py `gemm_shape_factor`).

Why: the held-out error of the throughput model (issue 31) points at the shape factor, a roofline
1 / (1 + rate / (HBM x intensity)). It credits gpt-oss's big experts on Blackwell too much and Qwen3-30B's
768-wide experts too little. No published row times a GEMM alone, so this measures the shape dependence
directly: each model's fc1 (hidden -> 2 x expert width for a gated MLP) and fc2 (expert width -> hidden), forward,
at 128 to 8192 tokens per expert, as a fraction of a large square GEMM's rate, beside the model's factor over the
same square GEMM's factor. Measured twice: replayed from a CUDA graph (the kernel alone, what a grouped GEMM
approaches) and launched one by one (Megatron-Core's SequentialMLP without Transformer Engine).

    python3 bench/gemm_shapes.py [--out DIR]          # on a GPU
    python3 bench/gemm_shapes.py --cpu --quick        # the harness on CPU (tiny shapes, figures meaningless)

Figures go to DIR/gemm_shapes.json (DIR: --out, else $OUT, else the current directory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from search_spaces.calibration.calibration_file import calibration
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost.gpu_terms import GEMM_SHAPE_SHARPNESS
from search_spaces.cost.throughput import gemm_rate

MODELS = ("qwen3-30b-a3b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3")
TOKENS_PER_EXPERT = (128, 256, 512, 1024, 2048, 4096, 8192)
SQUARE = 8192  # the reference GEMM: compute-bound on every GPU we model


def predicted_factor(m: int, k: int, n: int, rate: float, hbm: float, element_bytes: int = 2,
                     sharpness: float = GEMM_SHAPE_SHARPNESS) -> float:
    """The cost model's roofline factor (gpu_terms.GpuTerms.gemm_shape_factor) for an m x k by k x n GEMM; the
    JSON keeps each row's m, k, n, so another `sharpness` can be fitted to a measurement (p = 1: the plain roofline)."""
    intensity = 2 * m * k * n / (element_bytes * (m * k + k * n + m * n))
    return 1.0 / (1.0 + (rate / (hbm * intensity)) ** sharpness)


def time_matmul(torch, m: int, k: int, n: int, device: str, reps: int) -> tuple[float, float]:
    """Seconds of one (m x k) @ (k x n) matmul: (kernel alone, eager). On a GPU, `reps` matmuls replayed from
    one CUDA graph give the kernel's time without launch gaps (what a grouped GEMM approaches), and the same
    matmuls launched one by one give SequentialMLP's; on CPU (BF16 there is slow: FP32) both are the wall clock."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)

    def launches():
        for _ in range(reps):
            torch.matmul(a, b, out=c)

    launches()
    if device != "cuda":
        t0 = time.perf_counter()
        launches()
        return ((time.perf_counter() - t0) / reps,) * 2
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launches()
    return _cuda_seconds(torch, graph.replay) / reps, _cuda_seconds(torch, launches) / reps


def _cuda_seconds(torch, work) -> float:
    """Median of five timed runs of `work` (CUDA events)."""
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure(torch, device: str, gpu_name: str, quick: bool) -> dict:
    gpu = load_gpu(gpu_name)
    rate, hbm = gemm_rate(gpu, "bf16", calibration()), gpu.hbm_tbps * 1e12
    reps = 3 if quick else 20
    square = SQUARE // 32 if quick else SQUARE
    square_s, _ = time_matmul(torch, square, square, square, device, reps)
    square_rate = 2 * square ** 3 / square_s
    square_factor = predicted_factor(square, square, square, rate, hbm)
    rows = []
    for name in MODELS:
        model = load_model(name)
        h, n = model.hidden_size, model.moe_ffn_hidden_size
        if quick:
            h, n = h // 32, n // 32
        glu = 2 if model.gated_mlp else 1
        for m in TOKENS_PER_EXPERT[:3] if quick else TOKENS_PER_EXPERT:
            for proj, (k, width) in (("fc1", (h, glu * n)), ("fc2", (n, h))):
                seconds, eager_seconds = time_matmul(torch, m, k, width, device, reps)
                flops = 2 * m * k * width
                rows.append(dict(model=name, proj=proj, m=m, k=k, n=width, seconds=seconds,
                                 eager_seconds=eager_seconds, tflops=flops / seconds / 1e12,
                                 measured_share=flops / seconds / square_rate,
                                 eager_share=flops / eager_seconds / square_rate,
                                 predicted_share=predicted_factor(m, k, width, rate, hbm) / square_factor))
    return dict(gpu=gpu_name, device=device, sharpness=GEMM_SHAPE_SHARPNESS, square=square,
                square_tflops=square_rate / 1e12,
                model_rate_tflops=rate / 1e12, hbm_tbps=gpu.hbm_tbps, rows=rows)


def print_table(report: dict) -> None:
    print(f"square {report['square']}^3 GEMM: {report['square_tflops']:.0f} TF/s measured "
          f"(the model's BF16 rate {report['model_rate_tflops']:.0f})")
    print(f"{'model':18} {'proj':4} {'m':>5} {'k':>5} {'n':>5} {'TF/s':>7} {'measured':>9} {'eager':>6} "
          f"{'predicted':>9}")
    for r in report["rows"]:
        print(f"{r['model']:18} {r['proj']:4} {r['m']:5d} {r['k']:5d} {r['n']:5d} {r['tflops']:7.1f} "
              f"{r['measured_share']:9.3f} {r['eager_share']:6.3f} {r['predicted_share']:9.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--gpu", default="h200", help="catalog GPU the prediction uses (default h200)")
    parser.add_argument("--cpu", action="store_true", help="run the harness on CPU (figures meaningless)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few repetitions")
    args = parser.parse_args(argv)
    import torch
    if not args.cpu and not torch.cuda.is_available():
        print("gemm_shapes: no CUDA device; skipped (use --cpu for the harness)")
        return 0
    report = measure(torch, "cpu" if args.cpu else "cuda", args.gpu, args.quick)
    print_table(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_shapes.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
