"""The accelerators' own step-time terms (Hopper, Blackwell): what a GPU step has that the CPU host's does not.

- attention at length and head width: flash attention reaches L / (L + ATTENTION_HALF_RATE_TOKENS) of its rate
  over L query tokens, and its rate goes with the head widths (64, 128, MLA 192/128);
- GEMM shapes: the operand traffic over HBM at a GEMM's m x k x n (small experts, few tokens per expert and narrow
  TP slices lose more);
- element-wise work: passes over the activations, over the routed token copies (permute, activation,
  un-permute), and fp8 recipes' casts of every GEMM input;
- the dispatchers' own all-to-all efficiencies (NCCL, DeepEP, HybridEP);
- host launch overhead per layer, removed by the CUDA-graph scopes that cover it;
- no gloo latency and no host contention: each rank has its GPU.
"""

from __future__ import annotations

from search_spaces.pipeline import Unit
from search_spaces.step_job import (FP8_BYTES, Job, RankCompute, activation_passes_time, attention_peak, moe_layers,
                                    precision_class)

# Per score element flash attention also runs the softmax (exp, max, rescale) besides its 2 (d_qk + d_v) tensor-core
# FLOPs; in tensor-FLOP equivalents it costs about this much: the value that reproduces FlashAttention-3's relative
# forward rates on H100 for head widths 64 : 128 : 256 (~0.75 : 1 : 1.2; Shah et al. 2024, fig. 5)
ATTENTION_SOFTMAX_FLOPS_PER_SCORE = 128.0
# the head width the attention efficiencies of the calibration are stated for (d_qk = d_v = 128)
ATTENTION_REFERENCE_DIMS = (128, 128)
# the backward of heads wider than 128 (MLA's d_qk = 192) keeps wider dQ/dK accumulators, so its tiles shrink:
# FlashAttention-4 on B200, causal 8K, runs the 192/128 backward at 971 TF/s against 1118-1209 for 128/128
# (Dao-AILab/flash-attention PRs #2270 and #2280, 2026) -- 0.83, i.e. this much below the softmax share's 1.07
WIDE_HEAD_BACKWARD_FACTOR = 0.78
WIDE_HEAD_DIM = 128
# a causal kernel over L query tokens reaches L / (L + this) of its long-sequence rate (the diagonal blocks' waste,
# tile and wave quantisation): FlashAttention-4's causal head-128 forward on B200 at 1K, 2K and 4K tokens (829, 1172,
# 1431 TF/s, PR #2605) follows L / (L + 1300) of its non-causal rate (1882) within 2%
ATTENTION_HALF_RATE_TOKENS = 1300
# every GEMM input is cast to fp8 twice: the activation in the forward, the output gradient in the backward
FP8_CASTS_PER_GEMM_INPUT = 2
# share of a layer's host launches each CUDA-graph scope captures (assumed from the share of the layer's kernels
# it holds; not fitted); full_iteration captures all of them
GRAPH_COVERAGE = {"attn": 0.35, "mlp": 0.3, "moe": 0.4, "moe_router": 0.1, "moe_preprocess": 0.1,
                  "full_iteration": 1.0}


def shard_length_factor(length: float) -> float:
    """A kernel over `length` query tokens runs at length / (length + ATTENTION_HALF_RATE_TOKENS) of its rate."""
    return length / (length + ATTENTION_HALF_RATE_TOKENS)


def head_width_factor(d_qk: int, d_v: int, backward: bool = False) -> float:
    """Efficiency of these head widths relative to 128/128: the tensor-core share of the work per score element,
    2 (d_qk + d_v) FLOPs beside the softmax's fixed ATTENTION_SOFTMAX_FLOPS_PER_SCORE (64: 0.75, MLA: 1.07);
    the backward of heads wider than 128 loses WIDE_HEAD_BACKWARD_FACTOR more (MLA backward: 0.83)."""
    def share(width: float) -> float:
        return width / (width + ATTENTION_SOFTMAX_FLOPS_PER_SCORE)
    factor = share(d_qk + d_v) / share(sum(ATTENTION_REFERENCE_DIMS))
    return factor * (WIDE_HEAD_BACKWARD_FACTOR if backward and d_qk > WIDE_HEAD_DIM else 1.0)


def element_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else (FP8_BYTES if precision_class(precision) == "fp8" else 2)


def gemm_input_width(job: Job, units: list[Unit]) -> float:
    """Sum over the rank's layers of the widths of every GEMM input per token (what fp8 casts)."""
    model = job.model
    h = model.hidden_size
    total = 0.0
    for u in units:
        if not u.is_layer:
            continue
        q = model.num_attention_heads * (model.value_head_dim if model.is_mla else model.head_dim)
        total += h + q  # QKV projection and output projection inputs
        if model.layer_is_moe(u.layer):
            total += model.topk * (h + model.moe_ffn_hidden_size)
            if model.shared_expert_ffn_hidden_size:
                total += h + model.shared_expert_ffn_hidden_size
        else:
            total += h + model.ffn_hidden_size
    return total


def routed_passes_time(job: Job, units: list[Unit], per_gpu: float) -> float:
    """Every routed copy of a token is permuted, scattered, put through the activation and the probability
    scaling and un-permuted (fwd and bwd): passes over topk x (hidden + intermediate)."""
    model, L = job.model, job.layout
    n_moe = moe_layers(model, units)
    if not n_moe:
        return 0.0
    glu = 2 if model.gated_mlp else 1
    routed = model.topk * (2 * model.hidden_size + (glu + 1) * model.moe_ffn_hidden_size / L.etp) * job.expert_load
    return job.cal.routed_passes * n_moe * per_gpu * routed * job.act_bytes / job.hbm


def fp8_cast_time(job: Job, units: list[Unit], per_gpu: float) -> float:
    """fp8 recipes cast every GEMM input to fp8 first (plus a transposed copy for the weight gradient)."""
    if precision_class(job.layout.precision) != "fp8":
        return 0.0
    width = gemm_input_width(job, units)
    return per_gpu * width * FP8_CASTS_PER_GEMM_INPUT * job.cal.fp8_cast_bytes / job.hbm


class GpuTerms:
    """The step-time terms of an accelerator (StepTimeTerms for the GPU families)."""
    families = ("hopper", "blackwell")

    def attention_rates(self, job: Job, dims: tuple[int, int], length: float) -> tuple[float, float]:
        """Flash attention's calibrated rates at this kernel length and these head widths."""
        scale = attention_peak(job) * shard_length_factor(length)
        fwd, bwd = head_width_factor(*dims), head_width_factor(*dims, backward=True)
        family = job.gpu.family
        return (scale * fwd * job.cal.attention_fwd_efficiency[family],
                scale * bwd * job.cal.attention_bwd_efficiency[family])

    def gemm_shape_factor(self, job: Job, m: float, k: float, n: float, rate: float) -> float:
        """1 / (1 + rate / (HBM x intensity)), intensity = 2mkn / (bytes x (mk + kn + mn)): small experts
        (Qwen3-30B's 768-wide FFN), few tokens per expert or a narrow TP slice make a GEMM memory-bound; big square
        GEMMs lose a few per cent."""
        if min(m, k, n) <= 0:
            return 1.0
        b = element_bytes(job.layout.precision)
        intensity = 2 * m * k * n / (b * (m * k + k * n + m * n))
        return 1.0 / (1.0 + rate / (job.hbm * intensity))

    def elementwise_time(self, job: Job, rank: int, units: list[Unit], per_gpu: float) -> float:
        """Passes over the activations and the routed token copies, and fp8 casts, over HBM."""
        return (activation_passes_time(job, rank, cpu_trainer=False) + routed_passes_time(job, units, per_gpu)
                + fp8_cast_time(job, units, per_gpu))

    def dispatcher_efficiency(self, job: Job) -> float:
        return job.cal.dispatcher_efficiency[job.layout.dispatcher]

    def launch_overhead_time(self, job: Job, units: list[Unit]) -> float:
        """Host launch/sync time per layer (MoE layers wait for the token counts), less what CUDA graphs cover."""
        layers = sum(1 for u in units if u.is_layer)
        coverage = min(1.0, sum(GRAPH_COVERAGE.get(s, 0.0) for s in job.layout.cuda_graphs))
        moe = moe_layers(job.model, units)
        return (job.cal.launch_overhead_s * moe + job.cal.dense_launch_overhead_s * (layers - moe)) * (1 - coverage)

    def dp_latency(self, job: Job, ranks: int) -> float:
        """NCCL's fixed costs hide behind the bytes: none counted."""
        return 0.0

    def host_contention_time(self, job: Job, rank: RankCompute) -> float:
        """Every rank has its GPU: none."""
        return 0.0


GPU_TERMS = GpuTerms()
