"""Gated delta-net kernel on one GPU: flash-linear-attention's `chunk_gated_delta_rule` (what Megatron-Core's
GatedDeltaNet calls in training) timed at Qwen3-Next's head widths, beside search_spaces/cost/delta_net.py.

Why: Qwen3-Next's cost at length rests on two calibration constants that no published timing pins down and the
fit sets from three published rows (CALIBRATION.md): `linear_attention_efficiency`, the chunk-parallel kernels'
share of the BF16 peak (the fit leaves it at its lower bound), and `delta_net_state_step_s`, one chunk step of the
sequential state pass. The model's explanation of the published CP scaling (~270 TF/s at 8K/CP1, ~100 at
64K/CP16) is that the state pass is latency-bound: its time depends on the sequence's chunk count, not on the
heads a rank runs, so CP (which leaves a rank fewer heads of the whole sequence) does not shorten it. This
benchmark measures exactly that, one layer's kernel at a time:

- per case (sequence length T, heads per rank H -- 32 at CP1, 8 at CP4, 2 at CP16 -- and microbatch B), the
  forward and forward+backward time and the peak memory above the inputs, beside the model's prediction;
- a least-squares split of the forward+backward times into a part per (token x head) and a part per chunk step
  (x state-pass waves), which gives the two constants as measured: compare them with the calibration's.

    python3 bench/delta_net_kernel.py [--out DIR]      # on a GPU with fla-core (flash-linear-attention) and triton
    python3 bench/delta_net_kernel.py --reference      # the harness on CPU, trainers/cpu_compat.py's reference kernel

On a GPU without flash-linear-attention it prints one line saying so and exits 0 (the GPU check goes on).
Figures go to DIR/delta_net_kernel.json (DIR: --out, else $OUT, else the current directory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_spaces.calibration.calibration_file import calibration  # noqa: E402
from search_spaces.catalog.hardware import load_gpu  # noqa: E402
from search_spaces.catalog.models import load_model  # noqa: E402
from search_spaces.cost import delta_net  # noqa: E402
from search_spaces.cost.throughput import linear_attention_rate  # noqa: E402
from search_spaces.layouts.layout import Layout  # noqa: E402

MODEL = "qwen3-next-80b-a3b"
# (sequence length, value heads per rank, microbatch): Qwen3-Next's 32 value heads at CP 1, 4 and 16, at the
# published lengths 8K and 64K, and a batch of 4 (more state-pass blocks in flight)
GPU_CASES = [(8192, 32, 1), (8192, 8, 1), (8192, 2, 1), (8192, 32, 4),
             (65536, 32, 1), (65536, 8, 1), (65536, 2, 1)]
REFERENCE_CASES = [(256, 2, 1), (256, 4, 1), (512, 2, 1), (512, 4, 1)]  # the CPU harness: small and quick
REPEATS = 5


def _inputs(torch, seq_len: int, heads: int, batch: int, dim: int, device: str, dtype):
    """q, k (l2-normalised, as GatedDeltaNet passes them), v, the log decay g (fp32, <= 0) and beta in (0, 1)."""
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (batch, seq_len, heads, dim)
    q = torch.nn.functional.normalize(torch.randn(shape, generator=gen, device=device), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(shape, generator=gen, device=device), dim=-1).to(dtype)
    v = torch.randn(shape, generator=gen, device=device).to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(shape[:3], generator=gen, device=device))
    beta = torch.sigmoid(torch.randn(shape[:3], generator=gen, device=device)).to(dtype)
    return [t.requires_grad_() for t in (q, k, v, g, beta)]


class _Clock:
    """Wall time of a callable: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda

    def seconds(self, fn) -> float:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        begin, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        self.torch.cuda.synchronize()
        return begin.elapsed_time(end) / 1e3


def measure_case(torch, kernel, clock: _Clock, case: tuple[int, int, int], dim: int, device: str, dtype) -> dict:
    """Forward and forward+backward seconds (median of REPEATS after a warm-up that also autotunes) and the peak
    bytes above the inputs of one layer's kernel."""
    seq_len, heads, batch = case
    q, k, v, g, beta = _inputs(torch, seq_len, heads, batch, dim, device, dtype)
    grad_out = torch.randn_like(v)

    def forward():
        with torch.no_grad():
            kernel(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False)

    def forward_backward():
        out, _ = kernel(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False)
        out.backward(grad_out)
        for t in (q, k, v, g, beta):
            t.grad = None

    for _ in range(2):
        forward_backward()
    fwd = statistics.median(clock.seconds(forward) for _ in range(REPEATS))
    total = statistics.median(clock.seconds(forward_backward) for _ in range(REPEATS))
    peak = None
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        forward_backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    return {"seq_len": seq_len, "heads": heads, "batch": batch, "fwd_s": fwd, "fwd_bwd_s": total,
            "peak_extra_bytes": peak}


def predict_case(case: tuple[int, int, int], gpu_name: str, precision: str) -> dict:
    """The model's seconds for the same kernel call: delta_net's parallel kernels and state passes of one layer
    and microbatch, at the layout whose CP leaves `heads` value heads per rank (the conv and projections are
    not in this kernel, so the parallel part counts the chunked rule alone)."""
    seq_len, heads, batch = case
    model = load_model(MODEL)
    cp = model.linear_num_value_heads // heads
    layout = Layout(cp=cp, mbs=batch, gbs=batch, precision=precision)
    gpu, cal = load_gpu(gpu_name), calibration()
    rate = linear_attention_rate(gpu, precision, cal)
    flops = delta_net.rule_flops_per_token_head(model) * (1 + delta_net.BACKWARD_FLOPS_RATIO) * batch * seq_len * heads
    state = delta_net.state_pass_time(model, layout, gpu, seq_len, False, cal.delta_net_state_step_s)
    return {"parallel_s": flops / rate, "state_pass_s": state, "fwd_bwd_s": flops / rate + state,
            "chunk_states_bytes": delta_net.chunk_state_bytes(model, layout, seq_len, 2),
            "waves": delta_net.state_waves(model, layout, gpu)}


def split_constants(rows: list[dict], gpu_name: str, precision: str) -> dict:
    """Least squares of t = a x (B T H) + c x (chunk steps x waves) over the forward+backward times: a gives the
    parallel kernels' rate (as a share of the peak: `linear_attention_efficiency`), c / the passes one forward
    and backward make gives one chunk step (`delta_net_state_step_s`)."""
    model, gpu, cal = load_model(MODEL), load_gpu(gpu_name), calibration()
    import numpy as np

    xs = np.array([(r["batch"] * r["seq_len"] * r["heads"],
                    math.ceil(r["seq_len"] / delta_net.CHUNK) * r["predicted"]["waves"]) for r in rows], dtype=float)
    ts = np.array([r["measured"]["fwd_bwd_s"] for r in rows])
    if np.linalg.matrix_rank(xs) < 2:
        return {}
    a, c = (float(v) for v in np.linalg.lstsq(xs, ts, rcond=None)[0])
    full_rate = linear_attention_rate(gpu, precision, cal) / cal.linear_attention_efficiency
    flops = delta_net.rule_flops_per_token_head(model) * (1 + delta_net.BACKWARD_FLOPS_RATIO)
    return {"seconds_per_token_head": a, "seconds_per_chunk_step_and_wave": c,
            "linear_attention_efficiency": flops / a / full_rate if a > 0 else None,
            "delta_net_state_step_s": c / (delta_net.STATE_PASSES_FWD + delta_net.STATE_PASSES_BWD),
            "calibration": {"linear_attention_efficiency": cal.linear_attention_efficiency,
                            "delta_net_state_step_s": cal.delta_net_state_step_s}}


def _kernel(reference: bool):
    """The kernel to time and the device, or (None, reason)."""
    import torch

    if reference:
        from trainers.cpu_compat import reference_chunk_gated_delta_rule
        return torch, reference_chunk_gated_delta_rule, "cpu", None
    if not torch.cuda.is_available():
        return torch, None, None, "no CUDA device (use --reference for the CPU harness)"
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as exc:
        return torch, None, None, f"flash-linear-attention is not importable ({exc}); carry fla-core and einops"
    _time_despite_hopper_guard()
    return torch, chunk_gated_delta_rule, "cuda", None


def _time_despite_hopper_guard() -> None:
    """fla 0.6 refuses the gated backward on Hopper under Triton 3.4-3.7.0 (its results are wrong there, fla
    #640). This benchmark times the kernels and never reads their values, so it lifts the guard, and says so."""
    from fla.ops.common import chunk_o

    if getattr(chunk_o, "IS_NVIDIA_HOPPER", False) and not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        print("delta_net_kernel: Triton < 3.7.1 on Hopper: fla's gated backward gives wrong values here (fla #640); "
              "timed anyway (times only, values unused)", flush=True)


def _gpu_name(device: str) -> str:
    """The catalog GPU to predict for: the device's, as the trainer names it; the CPU harness predicts for h100
    (its times are not comparable)."""
    if device != "cuda":
        return "h100"
    from trainers.megatron_moe import _gpu_name as trainer_gpu_name
    return trainer_gpu_name("auto", on_cpu=False)


def run(reference: bool = False, cases: list[tuple[int, int, int]] | None = None) -> dict:
    torch, kernel, device, why = _kernel(reference)
    if kernel is None:
        return {"skipped": why}
    gpu_name = _gpu_name(device)
    precision = "fp32" if device == "cpu" else "bf16"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    dim = load_model(MODEL).linear_value_head_dim if device == "cuda" else 16
    clock = _Clock(torch, device == "cuda")
    rows = []
    for case in cases or (REFERENCE_CASES if reference else GPU_CASES):
        row = {**measure_case(torch, kernel, clock, case, dim, device, dtype)}
        rows.append({"seq_len": row.pop("seq_len"), "heads": row.pop("heads"), "batch": row.pop("batch"),
                     "measured": row, "predicted": predict_case(case, gpu_name, precision)})
        print(_row_line(rows[-1]), flush=True)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (reference kernel)"
    return {"device": device_name, "gpu": gpu_name, "head_dim": dim, "torch": torch.__version__,
            "fla": _fla_version(), "rows": rows, "constants": split_constants(rows, gpu_name, precision)}


def _fla_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("fla-core")
    except Exception:  # noqa: BLE001 -- only a label in the output
        return None


def _row_line(row: dict) -> str:
    m, p = row["measured"], row["predicted"]
    peak = "-" if m["peak_extra_bytes"] is None else f"{m['peak_extra_bytes'] / 2**20:.0f}"
    return (f"T {row['seq_len']:>6} H {row['heads']:>3} B {row['batch']}  fwd {m['fwd_s'] * 1e3:8.2f} ms  "
            f"fwd+bwd {m['fwd_bwd_s'] * 1e3:8.2f} ms (model {p['fwd_bwd_s'] * 1e3:8.2f}: parallel "
            f"{p['parallel_s'] * 1e3:.2f} + state {p['state_pass_s'] * 1e3:.2f})  peak +{peak} MiB "
            f"(model chunk states {p['chunk_states_bytes'] / 2**20:.0f})")


def summary_line(result: dict) -> str:
    if "skipped" in result:
        return f"delta-net kernel: skipped: {result['skipped']}"
    c = result["constants"]
    by = {(r["seq_len"], r["heads"], r["batch"]): r["measured"]["fwd_bwd_s"] for r in result["rows"]}
    longest = max(r["seq_len"] for r in result["rows"])
    heads = sorted({h for (t, h, b) in by if t == longest and b == 1})
    ratio = by[(longest, heads[-1], 1)] / by[(longest, heads[0], 1)] if len(heads) > 1 else float("nan")
    eff = c.get("linear_attention_efficiency")
    return (f"delta-net kernel on {result['device']}: state step {c['delta_net_state_step_s'] * 1e6:.2f} us "
            f"(calibration {c['calibration']['delta_net_state_step_s'] * 1e6:.2f}), chunk kernels "
            f"{'-' if eff is None else f'{100 * eff:.1f}%'} of the peak (calibration "
            f"{100 * c['calibration']['linear_attention_efficiency']:.1f}%); at {longest} tokens {heads[-1]} heads "
            f"take {ratio:.2f}x the time of {heads[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for delta_net_kernel.json")
    parser.add_argument("--reference", action="store_true",
                        help="time trainers/cpu_compat.py's reference kernel on CPU (the harness, small cases)")
    args = parser.parse_args(argv)
    result = run(reference=args.reference)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "delta_net_kernel.json").write_text(json.dumps(result, indent=1))
    print(summary_line(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
