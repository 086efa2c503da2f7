"""FP8 / MXFP8 quantisation: what casting every GEMM input costs per element, what the recipe's scaling factors
cost the GEMM itself, and why FP8 pays off only where the GEMMs are large.

Per element of a GEMM input, cast twice per microbatch (the activation in the forward, the output gradient in the
backward), HBM bytes by recipe (Transformer Engine's quantizers):
- fp8-tensorwise (current scaling): an amax pass over the tensor (read 2 B) before the cast (read 2 B, write the
  row-wise 1 B and the transposed column-wise copy 1 B for the weight-gradient GEMM): 6 B;
- fp8-delayed: the amax of earlier steps scales the cast, whose own amax is fused in: 4 B;
- fp8-blockwise (1x128 activations, 128x128 weights, DeepSeek-V3's recipe) and mxfp8 (1x32 blocks, E8M0 scales):
  block-local amax in the casting kernel, row- and column-wise outputs and their scales: 4 B + 2 scales per block.
The GEMM: blockwise FP8 on Hopper multiplies each tile's partial result by its scales "with the CUDA Core" (the
Tensor Core cannot), MXFP8 on Blackwell dequantises inside the Tensor Core (NVIDIA/Megatron-LM
docs/discussions/deepseek-v3-gb200-optimization @1d9edcf8, 1.); `gemm_factor` is the rate the recipe keeps of a
per-tensor FP8 GEMM's (fitted for MXFP8 from the fit half of the published FP8-vs-MXFP8 pairs, knob_effects.csv).
Why small experts gain nothing: the cast costs ~bytes/HBM per input element whatever the GEMM, the GEMM 2n FLOPs per
input element at the FP8 rate: for Qwen3-30B-A3B's experts (hidden 2048, FFN 768) the casts cost about as much
time as FP8 saves in the GEMM; the quantisation kernels also add host launches (launch_overhead.QUANTISE_KERNELS)
and MXFP8 tokens are dispatched in BF16 ("EP Dispatch (which are not yet supported)" in MXFP8, the same blog
2.1.3), so only the blockwise and per-tensor recipes halve the dispatch volume.
Pure functions of (model, layout, tokens); gpu_terms.fp8_cast_time, throughput._ep_traffic and gemm_rate call them.
"""

from __future__ import annotations

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.hardware import GPUSpec
from search_spaces.layouts.layout import Layout

CAST_BYTES_PER_ELEMENT = {"fp8-tensorwise": 6.0, "fp8-delayed": 4.0, "fp8-blockwise": 4.0 + 2 * 4 / 128,
                          "mxfp8": 4.0 + 2 * 1 / 32}
# every GEMM input is cast twice per microbatch: the activation in the forward, the output gradient in the backward
CASTS_PER_GEMM_INPUT = 2
# the recipes whose quantised tokens the DeepEP/HybridEP dispatch sends in FP8 (1 B) instead of BF16
FP8_DISPATCH_RECIPES = ("fp8-tensorwise", "fp8-delayed", "fp8-blockwise")
# blockwise on Hopper: the per-tile scale multiply on CUDA cores (assumed 10% of the GEMM rate)
BLOCKWISE_HOPPER_GEMM_FACTOR = 0.9


def is_fp8(precision: str) -> bool:
    return precision.startswith("fp8") or precision == "mxfp8"


def cast_bytes(precision: str) -> float:
    """HBM bytes per GEMM-input element of one cast (0 for bf16/fp32)."""
    return CAST_BYTES_PER_ELEMENT.get(precision, 0.0)


def cast_time(layout: Layout, tokens: float, input_width: float, hbm_bytes_per_s: float) -> float:
    """Seconds one rank spends casting GEMM inputs per microbatch: `tokens` x `input_width` elements per cast."""
    return tokens * input_width * CASTS_PER_GEMM_INPUT * cast_bytes(layout.precision) / hbm_bytes_per_s


def gemm_factor(gpu: GPUSpec, precision: str, cal: Calibration) -> float:
    """The rate a recipe's GEMMs keep of per-tensor FP8's on this GPU (1 for bf16 and the per-tensor recipes)."""
    if precision == "mxfp8":
        return cal.mxfp8_gemm_factor
    if precision == "fp8-blockwise" and gpu.family == "hopper":
        return BLOCKWISE_HOPPER_GEMM_FACTOR
    return 1.0


def dispatch_bytes_per_element(precision: str, act_bytes: int) -> float:
    """Bytes per element of the tokens a DeepEP/HybridEP dispatch sends."""
    return 1.0 if precision in FP8_DISPATCH_RECIPES else float(act_bytes)


__all__ = ["is_fp8", "cast_bytes", "cast_time", "gemm_factor", "dispatch_bytes_per_element"]
