"""The accelerators' own step-time terms (Hopper, Blackwell): what a GPU step has that the CPU host's does not.

- attention at length and head width: flash attention reaches L / (L + ATTENTION_HALF_RATE_TOKENS) of its rate
  over L query tokens, and its rate goes with the head widths (64, 128, MLA 192/128);
- GEMM shapes: the operand traffic over HBM at a GEMM's m x k x n (small experts, few tokens per expert and narrow
  TP slices lose more);
- element-wise work: passes over the activations, over the routed token copies (permute, activation,
  un-permute), and fp8 recipes' casts of every GEMM input at each recipe's bytes (search_spaces/cost/quantisation.py);
  a recomputed module's forward repeats its share of them;
- gated delta-net as Megatron-Core runs it at length: the chunked delta rule and its sequential state passes
  (search_spaces/cost/delta_net.py);
- the dispatchers' all-to-all per backend and domain size, its fixed costs per call, NCCL's global permute and the
  SMs the dispatcher holds (search_spaces/cost/dispatcher_comm.py);
- host launches kernel by kernel, what each CUDA-graph scope removes, the dropless MoE sync
  (search_spaces/cost/launch_overhead.py);
- no gloo latency and no host contention: each rank has its GPU.
"""

from __future__ import annotations

from collections import Counter

from search_spaces.cost import delta_net, dispatcher_comm, launch_overhead, quantisation
from search_spaces.cost.memo import Memo
from search_spaces.cost.pipeline import Unit
from search_spaces.cost.step_job import (
    FP8_BYTES,
    FWD_AND_BWD,
    Job,
    RankCompute,
    activation_passes_time,
    attention_peak,
    census,
    moe_layers,
    passes_key,
    precision_class,
)

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
# 256-wide heads on Blackwell do not follow the softmax-share law (FA3 on Hopper): FlashAttention-4's first SM100
# hdim-256 kernel runs the causal 8K forward at 1,059 TF/s (Dao-AILab/flash-attention PR #2432, B200), 0.65 of what
# its 128-wide kernel reaches there (1882 x 8192 / (8192 + 1300) = 1,624), against the law's 1.2: this factor
# (0.65 / 1.2) corrects both directions (the backward assumed alike)
WIDEST_HEAD_DIM = 256
BLACKWELL_WIDEST_HEAD_FACTOR = 0.54
# A GEMM's shape factor is 1 / (1 + x^p), x = rate / (HBM x intensity): measured expert GEMMs turn compute-bound
# more sharply than the plain roofline's p = 1. Fitted to the catalog MoEs' expert fc1/fc2 on an H200 at 512-8192
# tokens per expert, as shares of an 8192^3 GEMM's rate (bench/gemm_shapes_h200.json, CUDA-graph replay): the optimum
# is flat from 1.5 to 2 (RMS error of the share 0.103 at 1.5, 0.100 at 1.73, 0.123 at p = 1); 1.5 validates best by
# source. Below 512 tokens a lone small matmul leaves SMs idle, which a grouped GEMM over many experts does not.
GEMM_SHAPE_SHARPNESS = 1.5
# per units object (a rank's): the widths fp8 casts, the layers by kind
_WIDTHS, _KINDS, _ELEMENTWISE = Memo("gemm input widths"), Memo("layer kinds"), Memo("elementwise")


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


def gemm_input_width(job: Job, units: tuple[Unit, ...]) -> float:
    """Sum over the rank's layers of the widths of every GEMM input per token (what fp8 casts); once per units
    object (a rank's: Placement.rank_units)."""
    return _WIDTHS.get_for((job.model,), units, lambda: _gemm_input_width(job.model, units))


def _gemm_input_width(model, units: tuple[Unit, ...]) -> float:
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


def routed_passes_time(job: Job, units: tuple[Unit, ...], per_gpu: float) -> float:
    """Every routed copy of a token is permuted, scattered, put through the activation and the probability
    scaling and un-permuted (fwd and bwd): passes over topk x (hidden + intermediate)."""
    model, L = job.model, job.layout
    n_moe = moe_layers(model, units)
    if not n_moe:
        return 0.0
    glu = 2 if model.gated_mlp else 1
    routed = model.topk * (2 * model.hidden_size + (glu + 1) * model.moe_ffn_hidden_size / L.etp) * job.expert_load
    return job.cal.routed_passes * n_moe * per_gpu * routed * job.act_bytes / job.hbm


def fp8_cast_time(job: Job, units: tuple[Unit, ...], per_gpu: float) -> float:
    """fp8 recipes cast every GEMM input to fp8 first (plus a transposed copy for the weight gradient), at each
    recipe's bytes per element (quantisation.py)."""
    if precision_class(job.layout.precision) != "fp8":
        return 0.0
    return quantisation.cast_time(job.layout, per_gpu, gemm_input_width(job, units), job.hbm)


def ep_exposure(job: Job) -> float:
    """The exposed share of the EP all-to-all: `ep_serial_exposed` without the EP overlap; with it, `ep_exposed`
    on the microbatches the split 1F1B schedule pairs (each forward beside the previous one's backward: all but
    one of a step's GA microbatches) and `ep_serial_exposed` on the one it cannot pair."""
    cal = job.cal
    if not job.layout.ep_overlap:
        return cal.ep_serial_exposed
    ga = max(job.layout.grad_accum(job.num_gpus), 1)
    paired = (ga - 1) / ga
    return paired * cal.ep_exposed + (1 - paired) * cal.ep_serial_exposed


class GpuTerms:
    """The step-time terms of an accelerator (StepTimeTerms for the GPU families)."""
    families: tuple[str, ...] = ("hopper", "blackwell")

    def attention_rates(self, job: Job, dims: tuple[int, int], length: float) -> tuple[float, float]:
        """Flash attention's calibrated rates at this kernel length and these head widths."""
        scale = attention_peak(job) * shard_length_factor(length)
        fwd, bwd = head_width_factor(*dims), head_width_factor(*dims, backward=True)
        family = job.gpu.family
        if family == "blackwell" and dims[0] >= WIDEST_HEAD_DIM:  # 256-wide heads (Qwen3-Next) on Blackwell
            fwd, bwd = fwd * BLACKWELL_WIDEST_HEAD_FACTOR, bwd * BLACKWELL_WIDEST_HEAD_FACTOR
        return (scale * fwd * job.cal.attention_fwd_efficiency[family],
                scale * bwd * job.cal.attention_bwd_efficiency[family])

    def gemm_shape_factor(self, job: Job, m: float, k: float, n: float, rate: float) -> float:
        """1 / (1 + (rate / (HBM x intensity))^GEMM_SHAPE_SHARPNESS), intensity = 2mkn / (bytes x (mk + kn + mn)):
        small experts (Qwen3-30B's 768-wide FFN), few tokens per expert or a narrow TP slice make a GEMM
        memory-bound; big square GEMMs lose a per cent or two."""
        if min(m, k, n) <= 0:
            return 1.0
        b = element_bytes(job.layout.precision)
        intensity = 2 * m * k * n / (b * (m * k + k * n + m * n))
        return 1.0 / (1.0 + (rate / (job.hbm * intensity)) ** GEMM_SHAPE_SHARPNESS)

    def elementwise_time(self, job: Job, rank: int, units: tuple[Unit, ...], per_gpu: float) -> float:
        """Passes over the activations and the routed token copies, and fp8 casts, over HBM (memoised on
        step_job.PASSES_FIELDS: the routed passes and the casts read a subset)."""
        return _ELEMENTWISE.get((job.model, job.gpu, job.cal), (passes_key(job.layout), job.seq_len, rank, per_gpu),
                                lambda: activation_passes_time(job, rank, cpu_trainer=False,
                                                               passes=job.cal.elementwise_passes)
                                + routed_passes_time(job, units, per_gpu) + fp8_cast_time(job, units, per_gpu))

    def linear_attention_layer_time(self, job: Job, rate: float) -> tuple[float, float]:
        """The chunked delta rule's parallel kernels at `rate` and its sequential state passes (delta_net.py)."""
        return delta_net.layer_time(job.model, job.layout, job.gpu, job.seq_len, rate, job.cal.delta_net_state_step_s)

    def recomputed_elementwise_time(self, job: Job, elementwise: float, share: float) -> float:
        """A recomputed module's forward repeats its norms, activations, permutes and casts too, in proportion to
        the GEMM forward it repeats."""
        return elementwise * share

    def ep_alltoall_time(self, job: Job, volume: float, scaleout_share: float) -> float:
        """Each dispatcher's reach of NVLink and of the scale-out link at the EP group's span
        (dispatcher_comm.link_efficiency); the two parts run at once (NCCL posts every peer's transfer together,
        DeepEP forwards over NVLink what RDMA delivers), so the slower one counts; `ep_exposure` of it not hidden;
        whole-MoE and full recompute run the forward's dispatch and combine again."""
        L, gpu = job.layout, job.gpu
        span = dispatcher_comm.ep_span(L)
        nvl, out = dispatcher_comm.link_efficiency(gpu, L.dispatcher, span, job.cal.dispatcher_efficiency["alltoall"])
        t = max(volume * (1 - scaleout_share) / (gpu.nvlink_gbps * 1e9 * nvl),
                volume * scaleout_share / (gpu.scaleout_gbps * 1e9 * out))
        t *= ep_exposure(job)
        return t * (1 + 1 / FWD_AND_BWD) if dispatcher_comm.recompute_repeats_dispatch(L) else t

    def dispatcher_overhead_time(self, job: Job, moe: int, ep_time: float) -> float:
        """Each call's fixed cost, the NCCL path's global permute over HBM, and the SMs the dispatcher holds while
        its overlapped all-to-all runs beside compute (dispatcher_comm.py)."""
        L = job.layout
        if not (job.model.is_moe and L.ep > 1 and moe):
            return 0.0
        tsp = job.tokens_rank / L.tp if L.sp else job.tokens_rank
        permute = dispatcher_comm.global_permute_bytes(job.model, L, tsp, job.act_bytes) * moe / job.hbm
        exposure = ep_exposure(job)
        overlapped = ep_time * (1 - exposure) / exposure if exposure < 1 else 0.0
        return dispatcher_comm.latency_time(L, moe) + permute + overlapped * dispatcher_comm.sm_share(job.gpu,
                                                                                                      L.dispatcher)

    def launch_overhead_time(self, job: Job, units: tuple[Unit, ...], busy: launch_overhead.LayerBusy) -> float:
        """The kernels each layer launches beyond what its GPU work hides, the dropless MoE sync, and the graph
        replays' static-buffer copies (launch_overhead.py)."""
        L, model = job.layout, job.model
        # a layer's host time depends on its kind alone: once per kind, times its count
        kinds, first = _KINDS.get_for((model,), units, lambda: _layer_kinds(model, units))
        host = sum(n * launch_overhead.layer_host_time(model, L, first[k], busy, job.cal, job.gpu.host)
                   for k, n in kinds.items())
        tsp = job.tokens_rank / L.tp if L.sp else job.tokens_rank
        layers = census(model, units).layers
        return host + launch_overhead.graph_copy_bytes(job.model, L, tsp, job.act_bytes) * layers / job.hbm

    def dp_latency(self, job: Job, ranks: int) -> float:
        """NCCL's fixed costs hide behind the bytes: none counted."""
        return 0.0

    def host_contention_time(self, job: Job, rank: RankCompute) -> float:
        """Every rank has its GPU: none."""
        return 0.0


GPU_TERMS = GpuTerms()


def _layer_kinds(model, units) -> tuple[Counter, dict[tuple[str, bool], int]]:
    """The rank's layers counted by (attention kind, MoE), and the first layer of each kind."""
    kinds: Counter = Counter()
    first: dict[tuple[str, bool], int] = {}
    for u in units:
        if u.is_layer:
            kind = (model.attention_kind(u.layer), model.layer_is_moe(u.layer))
            kinds[kind] += 1
            first.setdefault(kind, u.layer)
    return kinds, first
