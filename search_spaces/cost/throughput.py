"""Throughput model: step time of the most loaded pipeline rank, with a breakdown.

step = m x (compute + recompute + tp_comm + cp_comm + ep_comm + dispatcher + launch + pp_comm + host_contention)
       + bubble + dp_comm + optimizer + optimizer_offload                                   once per step
       of the pipeline rank slowest with all of them (up to ALL_RANKS_UP_TO_PP ranks timed)

compute     = GEMM FLOPs (Bridge accounting) / (peak(precision) x GEMM efficiency x shape factor)
              (shape factor: the GEMM's operand traffic over HBM at its m x k x n -- small experts, few tokens
              per expert and narrow TP slices lose more; grouped expert GEMMs have their own efficiency)
            + attention: the causal FLOPs of the rank's shard, forward and backward apart, each at the BF16 peak x
              its efficiency x a head-width factor (64, 128, MLA 192/128) x a kernel-length factor (the whole
              sequence, the CP shard, or the a2a level's longer shard); packed documents (THD): each document's
              own causal attention at its own length (search_spaces/cost/packing.py); gated delta-net kernels at
              their own rate
            + element-wise passes over the activations / HBM bandwidth
            + passes over the routed token copies (permute, activation, un-permute) / HBM bandwidth
            + fp8 only: casting every GEMM input to fp8 (and its transposed copy) at the recipe's bytes / HBM
              bandwidth; the recipe's scaling costs the GEMM rate (MXFP8, blockwise on Hopper: quantisation.py)
            Blackwell Ultra (B300, GB300) runs these at a measured `sustained_rate` over B200/GB200
recompute   = the forward FLOPs the recompute choice repeats (GEMMs at the dense rate, attention at its own, the
              delta-net's kernels and a state pass), and on GPUs the element-wise work of what it repeats
tp_comm     = sequence-parallel all-gather/reduce-scatter, 8 per layer per microbatch, partly overlapped
cp_comm     = per cp_comm_type, as Transformer Engine runs it (one function each, CP_COMM_TIME): p2p = a ring whose
              every step's K/V (and dK/dV) transfer hides behind that step's attention, fwd and bwd; a2a = Ulysses
              all-to-alls on the critical path; allgather = gather, re-gather and reduce-scatter, not hidden;
              a2a+p2p = a2a inside `hierarchical_cp`'s first level, a ring of a2a-times-longer steps across;
              plus the all-to-alls of the linear-attention (gated delta-net) layers
ep_comm     = dispatch + combine all-to-all, fwd and bwd, split into NVLink-domain and scale-out traffic at each
              dispatcher's reach of each link (dispatcher_comm.py), repeated by whole-MoE and full recompute
dispatcher  = the dispatcher's fixed cost per call, NCCL's global permute, the SMs it holds (GPUs)
launch      = host time the GPU waits for per microbatch: each layer's kernel launches beyond the GPU work that
              hides them, less what CUDA-graph scopes capture, the dropless MoE sync (launch_overhead.py);
              on cpu the eager overhead per layer and the fixed cost of every gloo exchange
host_contention = cpu only: ranks beyond the host's cores wait for one
pp_comm     = activations sent between stages; bubble = (PP-1)/(VPP*m) of the time per microbatch
dp_comm     = gradient reduce-scatter + parameter all-gather over DP*CP (dense) and EDP (experts), overlapped
optimizer   = Adam step over the local shard (HBM bound); offload = offloaded share over the host link + CPU Adam
activation_offload = per microbatch, the offloaded inputs (memory.py's bytes) to the host in the forward and back in
              the backward over the GPU's host link (hardware.py: PCIe Gen5 on x86 hosts, NVLink-C2C on Grace), on
              copy streams beside the compute: exposed only where a pass's copies outlast that pass's compute
Where the hardware families differ (attention at length and head width, GEMM shapes, the element-wise passes,
the dispatcher's all-to-all, launch overhead, gloo latency, host contention), the terms are the family's own:
search_spaces/cost/gpu_terms.py (Hopper, Blackwell) and search_spaces/cost/host_terms.py (the CPU host), chosen once per
job by the accelerator's declared family (`TERMS`, `job_for`). Everything in this module is shared by all.
The few efficiency constants are fitted on ../shared/reference (search_spaces/calibration/calibration.json,
CALIBRATION.md); the physical and assumed ones are the named constants below and in the terms' modules, each with its
source.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from search_spaces.calibration.calibration_file import Calibration, calibration
from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost import dispatcher_comm, quantisation
from search_spaces.cost.breakdown import StepTime
from search_spaces.cost.flops import (
    _attention_core_per_token,
    _attention_proj_per_token,
    linear_attention_core_per_token,
    padded_vocab_size,
)
from search_spaces.cost.gpu_terms import GPU_TERMS
from search_spaces.cost.host_terms import HOST_TERMS
from search_spaces.cost.launch_overhead import LayerBusy
from search_spaces.cost.memo import Memo, fields
from search_spaces.cost.memory import RankParams, chunk_offloaded_bytes, grad_bytes, rank_params, weight_bytes
from search_spaces.cost.packing import LengthHistogram, statistics_for
from search_spaces.cost.pipeline import EMBEDDING, LOSS, Unit, model_units
from search_spaces.cost.step_job import (
    FWD_AND_BWD,
    FWD_BWD_FLOPS_PER_MAC,
    SP_COLLECTIVES_PER_LAYER,
    Job,
    RankCompute,
    StepTimeTerms,
    census,
    precision_class,
    split_traffic_time,
)
from search_spaces.layouts.layout import Layout, fields_read_by

# the cost terms of each accelerator family (hardware.FAMILIES)
TERMS: dict[str, StepTimeTerms] = {family: terms for terms in (GPU_TERMS, HOST_TERMS) for family in terms.families}

# GPUs whose GEMM efficiencies are another's (the same chip)
CALIBRATION_ALIASES = {"h200": "h100"}

# the layout fields memoised terms read (their keys: search_spaces/cost/memo.py; a rank's FLOPs read `recompute`), as
# the dimensions declare them (Dimension.read_by): the GEMM rates, a rank's attention (softmax and gated delta-net;
# sequence_parallel: packed documents are padded to 2*CP*TP with it, search_spaces/cost/packing.py), the CP and the
# EP communication
GEMM_RATE_FIELDS = fields_read_by("gemm rates")
ATTENTION_FIELDS = fields_read_by("attention")
CP_COMM_FIELDS = fields_read_by("cp comm")
EP_COMM_FIELDS = fields_read_by("ep comm")
_gemm_rate_fields, _attention_fields = fields(*GEMM_RATE_FIELDS), fields(*ATTENTION_FIELDS)
_cp_comm_fields, _ep_comm_fields = fields(*CP_COMM_FIELDS), fields(*EP_COMM_FIELDS)
_GEMM_RATES, _RANK_FLOPS, _ATTENTION = Memo("gemm rates"), Memo("rank flops"), Memo("rank attention")
_CP_COMM, _EP_COMM, _EP_DISPATCH = Memo("cp comm"), Memo("ep comm"), Memo("ep comm and dispatcher")

# ---- physical, derived and assumed constants (not fitted) -----------------------------------------------------
FWD_FLOPS_PER_MAC = 2.0  # the forward alone
GEMMS_PER_FWD_BWD = 3  # recomputing the forward repeats one GEMM of the three
# the rate used for a precision class the calibration has no entry for
UNCALIBRATED_GEMM_EFFICIENCY = 0.5
# beyond 4 pipeline ranks only the first (embedding, most in flight), second, middle, last two (output head) are
# timed: the slowest of them sets the pace
ALL_RANKS_UP_TO_PP = 4
# ---- context parallelism (the attention terms of CALIBRATION.md) ----------------------------------------------------
# fixed cost of one ring transfer (send/recv launch and handshake, ~20 us; assumed)
RING_TRANSFER_LATENCY_S = 2e-5
# per virtual stage and microbatch: the activation sent forward and its gradient sent back
PP_TRANSFERS_PER_MICROBATCH = 2
# share of the pipeline send/recv not hidden behind the other chunks' compute (assumed)
PP_EXPOSED = 0.5
# Adam's HBM traffic per parameter: read the gradient, the weight, 2 states and the fp32 master; write the last
# four back (9 accesses counted at 4 B)
ADAM_HBM_BYTES_PER_PARAM = 36
# host-link traffic per offloaded parameter: the gradient down and the updated weights up (counted as 4 + 2 B)
OFFLOAD_HOST_BYTES_PER_PARAM = 6
# CPU Adam throughput of the host (parameters/s): the x86 hosts of DGX Hopper/Blackwell, Grace (GB200/GB300) and
# the local cpu runs; order-of-magnitude assumptions, not measured in this repository
CPU_ADAM_PARAMS_PER_S = {"hopper": 0.6e9, "blackwell": 1.0e9, "grace": 2.5e9, "cpu": 0.2e9}


def terms_for(gpu: GPUSpec) -> StepTimeTerms:
    """The cost terms of the accelerator's family."""
    return TERMS[gpu.family]


def job_for(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
            cal: Calibration | None = None, packing: LengthHistogram | None = None) -> Job:
    """The step-time question, with the family's terms (and the packaged calibration unless one is given);
    `packing`: the documents packed into each sequence (None: one of seq_len tokens)."""
    return Job(model, gpu, num_gpus, seq_len, layout, cal or calibration(), terms_for(gpu), packing)


def gemm_rate(gpu: GPUSpec, precision: str, cal: Calibration) -> float:
    table = cal.gemm_efficiency
    per = table.get(CALIBRATION_ALIASES.get(gpu.name, gpu.name)) or table[gpu.family]
    eff = per.get(precision_class(precision), UNCALIBRATED_GEMM_EFFICIENCY)
    # the recipe's scaling factors cost the GEMM itself (MXFP8's block scales, blockwise FP8 on Hopper)
    return gpu.peak(precision) * 1e12 * eff * cal.sustained_factor(gpu) * quantisation.gemm_factor(gpu, precision, cal)


def attention_dims(model: ModelSpec) -> tuple[int, int]:
    """(d_qk, d_v) of the softmax attention: MLA 192/128 for DeepSeek-V3, else the head width twice."""
    return (model.q_head_dim, model.v_head_dim) if model.is_mla else (model.head_dim, model.head_dim)


def attention_backward_ratio(d_qk: int, d_v: int) -> float:
    """Backward over forward FLOPs of flash attention: S = QK^T recomputed, dP = dO V^T, dV = P^T dO, dQ = dS K,
    dK = dS^T Q (3 GEMMs of width d_qk, 2 of width d_v) against QK^T and PV: 2.5 for equal widths, 2.6 for MLA."""
    return (3 * d_qk + 2 * d_v) / (d_qk + d_v)


def _bw(gpu: GPUSpec, span: int, cal: Calibration) -> float:
    """Bytes/s per GPU for a group of `span` consecutive ranks: NVLink inside a domain, else scale-out."""
    gbps = gpu.nvlink_gbps if span <= gpu.nvlink_domain else gpu.scaleout_gbps
    return gbps * 1e9 * cal.comm_efficiency


def _nvlink_bw(gpu: GPUSpec, cal: Calibration) -> float:
    return _bw(gpu, 1, cal)


def _scaleout_bw(gpu: GPUSpec, cal: Calibration) -> float:
    return _bw(gpu, gpu.nvlink_domain + 1, cal)


# ---- FLOPs per token of one pipeline unit ----------------------------------------------------------------------
class UnitFlops(NamedTuple):
    """Forward+backward FLOPs per token: dense GEMMs, expert GEMMs, core attention, and what recompute repeats."""
    dense: float
    expert: float
    core: float
    recompute: float


def _layer_flops(model: ModelSpec, seq_len: int, unit: Unit) -> tuple[float, float, float, float]:
    """Per-token fwd+bwd FLOPs of a decoder or MTP layer: (attention projections, core attention, experts,
    dense MLP incl. shared experts and MTP's projection)."""
    h = model.hidden_size
    glu = 3 if model.gated_mlp else 2
    kind = model.attention_kind(unit.layer)
    proj = FWD_BWD_FLOPS_PER_MAC * (_attention_proj_per_token(model, kind) - linear_attention_core_per_token(model,
                                                                                                             kind))
    core = FWD_BWD_FLOPS_PER_MAC * _attention_core_per_token(model, kind, seq_len)
    if model.layer_is_moe(unit.layer):
        expert = FWD_BWD_FLOPS_PER_MAC * h * model.moe_ffn_hidden_size * model.topk * glu
        mlp = FWD_BWD_FLOPS_PER_MAC * h * model.shared_expert_ffn_hidden_size * glu
    else:
        expert, mlp = 0.0, FWD_BWD_FLOPS_PER_MAC * h * model.ffn_hidden_size * glu
    if unit.is_mtp:
        mlp += FWD_BWD_FLOPS_PER_MAC * (3 * h + 2 * h * h)  # MTP's eh-projection (2h -> h) and norms, Bridge's term
    return proj, core, expert, mlp


def linear_attention_rate(gpu: GPUSpec, precision: str, cal: Calibration) -> float:
    """FLOP/s of the chunked delta rule's parallel kernels: `linear_attention_efficiency` of the BF16 peak (the
    kernels run in the activations' 16-bit dtype whatever the GEMM precision; fp32 runs at the fp32 peak)."""
    base = "fp32" if precision == "fp32" else "bf16"
    return gpu.peak(base) * 1e12 * cal.linear_attention_efficiency * cal.sustained_factor(gpu)


def linear_attention_time(job: Job, units: tuple[Unit, ...]) -> tuple[float, float]:
    """(fwd+bwd seconds, of which recomputed forward) of the rank's gated delta-net layers per microbatch, their
    kernels at `linear_attention_efficiency` of the BF16 peak (chunked recurrences, far from GEMM rates), as the
    family's terms run them (GPUs: the chunked delta rule and its sequential state passes, delta_net.py)."""
    layers = census(job.model, units).kinds.count("linear")
    if not layers:
        return 0.0, 0.0
    total, again = job.terms.linear_attention_layer_time(job, linear_attention_rate(job.gpu, job.layout.precision,
                                                                                    job.cal))
    return layers * total, layers * again


def _recompute_flops(model: ModelSpec, unit: Unit, layout: Layout, proj: float, expert: float, mlp: float) -> float:
    """Per-token GEMM FLOPs the recompute choice adds to a layer: the repeated forward of what it recomputes (a
    recomputed core attention runs at the attention rate: `rank_compute`)."""
    if layout.recompute_granularity == "full":
        return (proj + expert + mlp) / GEMMS_PER_FWD_BWD  # the attention's own forward: recomputed_attention
    if layout.recompute_granularity != "selective":
        return 0.0
    rc = 0.0
    mods = set(layout.recompute_modules)
    moe = model.layer_is_moe(unit.layer)
    if "mla_up_proj" in mods and model.is_mla:
        n = model.num_attention_heads
        rc += FWD_FLOPS_PER_MAC * (model.q_lora_rank * n * model.q_head_dim
                                   + model.kv_lora_rank * n * (model.qk_nope_head_dim + model.v_head_dim))
    if "mlp" in mods and not moe:
        rc += mlp / GEMMS_PER_FWD_BWD
    if "moe" in mods and moe:
        rc += expert / GEMMS_PER_FWD_BWD
    if "shared_experts" in mods and moe:
        rc += mlp / GEMMS_PER_FWD_BWD
    return rc


def _unit_flops(model: ModelSpec, seq_len: int, unit: Unit, layout: Layout, expert_load: float = 1.0) -> UnitFlops:
    """Per-token forward+backward FLOPs of one pipeline unit; `expert_load` scales the experts' (a rank's routed
    copies over the balanced share: search_spaces.cost.routing)."""
    if unit == EMBEDDING:
        return UnitFlops(0.0, 0.0, 0.0, 0.0)
    if unit == LOSS:
        logits = FWD_BWD_FLOPS_PER_MAC * model.hidden_size * padded_vocab_size(model.vocab_size)
        return UnitFlops(logits * (1 + model.mtp_layers), 0.0, 0.0, 0.0)
    proj, core, expert, mlp = _layer_flops(model, seq_len, unit)
    expert *= expert_load
    return UnitFlops(proj + mlp, expert, core, _recompute_flops(model, unit, layout, proj, expert, mlp))


def _rank_flops(model: ModelSpec, seq_len: int, units: tuple[Unit, ...], layout: Layout, expert_load: float = 1.0
                ) -> UnitFlops:
    dense = expert = core = rc = 0.0
    by_kind: dict[Any, UnitFlops] = {}  # a unit's FLOPs depend on its kind alone (added unit by unit, as always)
    for u in units:
        kind = u.kind if u.layer < 0 else (model.attention_kind(u.layer), model.layer_is_moe(u.layer), u.is_mtp)
        f = by_kind.get(kind)
        if f is None:
            f = by_kind[kind] = _unit_flops(model, seq_len, u, layout, expert_load)
        dense, expert, core, rc = dense + f.dense, expert + f.expert, core + f.core, rc + f.recompute
    return UnitFlops(dense, expert, core, rc)


# ---- compute per microbatch on one pipeline rank --------------------------------------------------------------
class GemmRates(NamedTuple):
    dense: float  # FLOP/s of the rank's dense GEMMs at their shape
    grouped: float  # the expert grouped GEMMs' rate relative to `dense` (1 without experts)


def gemm_rates(job: Job) -> GemmRates:
    """Dense GEMMs see this rank's tokens of the microbatch and a TP-split width; each local expert sees its share
    of the tokens of all EP ranks and an ETP-split width (memoised on GEMM_RATE_FIELDS)."""
    return _GEMM_RATES.get((job.model, job.gpu, job.cal), (_gemm_rate_fields(job.layout), job.seq_len),
                           lambda: _gemm_rates(job))


def _gemm_rates(job: Job) -> GemmRates:
    model, L, gpu, h = job.model, job.layout, job.gpu, job.model.hidden_size
    peak_rate = gemm_rate(gpu, L.precision, job.cal)
    t_rank = job.tokens_rank
    n_dense = (model.ffn_hidden_size if not model.is_moe else
               model.num_attention_heads * (model.q_head_dim if model.is_mla else model.head_dim)) / L.tp
    dense_shape = job.terms.gemm_shape_factor(job, t_rank, h, n_dense, peak_rate)
    if not model.is_moe:
        return GemmRates(peak_rate * dense_shape, 1.0)
    m_expert = t_rank / (L.tp if L.sp else 1) * L.ep * model.topk / model.num_experts
    expert_shape = job.terms.gemm_shape_factor(job, m_expert, h, model.moe_ffn_hidden_size / L.etp, peak_rate)
    grouped = job.cal.grouped_gemm_efficiency[gpu.family] * expert_shape / dense_shape
    return GemmRates(peak_rate * dense_shape, grouped)


class AttentionTime(NamedTuple):
    """Seconds of one softmax-attention layer's core attention for one microbatch on one rank."""
    fwd: float
    bwd: float


def attention_kernel_length(job: Job, kind: str) -> float:
    """Query tokens of one sequence a flash-attention call sees: the whole sequence without CP, the rank's shard
    under p2p and allgather, a2a x the shard under a2a (all of it) and a2a+p2p; at most the sliding window."""
    shard = job.seq_len / job.layout.cp
    a2a, _ = cp_levels(job.layout) if job.layout.cp > 1 else (1, 1)
    length = shard * a2a
    return min(length, job.model.sliding_window + 1) if kind == "sliding" else length


def attention_layer_time(job: Job, kind: str) -> AttentionTime:
    """Causal attention of the rank's share (its CP shard of the sequence, its TP share of the heads): forward
    FLOPs as Bridge counts them, backward = forward x attention_backward_ratio, each at its own rate."""
    model, L = job.model, job.layout
    if kind == "linear":
        return AttentionTime(0.0, 0.0)
    if job.packing is not None and not job.gpu.is_cpu:  # causal within each packed document
        return packed_attention_layer_time(job, kind)
    # (the CPU trainer's attention is dense: every row's [S/CP, S] scores, the other documents masked out; so a
    # packed row costs what a full-length one does there, trainers/cp_attention.py)
    dims = attention_dims(model)
    flops = 2 * _attention_core_per_token(model, kind, job.seq_len) * job.tokens_mb / (L.tp * L.cp)
    fwd_rate, bwd_rate = job.terms.attention_rates(job, dims, attention_kernel_length(job, kind))
    return AttentionTime(flops / fwd_rate, flops * attention_backward_ratio(*dims) / bwd_rate)


def packed_attention_layer_time(job: Job, kind: str) -> AttentionTime:
    """attention_layer_time of packed sequences (search_spaces/cost/packing.py): each padded document's causal attention
    (its FLOPs as Bridge counts them at its own length) at the kernel's rate for that document's query tokens on
    a rank (a 1/CP share: its two of 2*CP chunks; a2a x that under the a2a levels; at most the sliding window),
    summed over the expected documents of a sequence. One document of seq_len tokens is attention_layer_time's
    figure to the last digit (tests/search_spaces/test_packing.py)."""
    model, L = job.model, job.layout
    stats = statistics_for(job.packing, job.seq_len, L.cp, L.tp, L.sp)
    if stats is None:  # attention_layer_time calls it for packed documents only
        raise ValueError("packed_attention_layer_time needs packed documents (job.packing)")
    dims = attention_dims(model)
    ratio = attention_backward_ratio(*dims)
    a2a = cp_levels(L)[0] if L.cp > 1 else 1
    fwd = bwd = 0.0
    for p, n in stats.pieces:
        flops = 2 * _attention_core_per_token(model, kind, p) * (L.mbs * p * n) / (L.tp * L.cp)
        length = p / L.cp * a2a
        if kind == "sliding":
            length = min(length, model.sliding_window + 1)
        fwd_rate, bwd_rate = job.terms.attention_rates(job, dims, length)
        fwd += flops / fwd_rate
        bwd += flops * ratio / bwd_rate
    return AttentionTime(fwd, bwd)


def _rank_attention(job: Job, units: tuple[Unit, ...]) -> tuple[float, float]:
    """(attention fwd+bwd, recomputed attention forward) seconds of the rank's layers per microbatch."""
    kinds = census(job.model, units).kinds
    mods = job.layout.recompute_modules
    recomputed = job.layout.recompute_granularity == "full" or "core_attn" in mods
    total = again = 0.0
    for kind in set(kinds):
        t = attention_layer_time(job, kind)
        total += kinds.count(kind) * (t.fwd + t.bwd)
        again += kinds.count(kind) * t.fwd if recomputed else 0.0
    return total, again


def rank_compute(job: Job, rates: GemmRates, rank: int) -> RankCompute:
    L = job.layout
    units = job.place.rank_units(rank)  # a rank's units: named by (PP, VPP, rank) in the memos' keys
    load = job.expert_load
    flops = _RANK_FLOPS.get((job.model,), (L.recompute, load, job.seq_len, L.pp, L.vpp, rank),
                            lambda: _rank_flops(job.model, job.seq_len, units, L, load))
    per_gpu = job.tokens_mb / (L.tp * L.cp)  # tokens of the microbatch per GPU sharing its dense work
    # recomputed forwards run at the dense GEMM rate (recomputed experts too), in one pass with the model's GEMMs
    expert_gemm = per_gpu * flops.expert / (rates.dense * rates.grouped)
    gemm_all = per_gpu * (flops.dense + flops.recompute) / rates.dense + expert_gemm
    # of the recompute choice attention reads only whether it repeats the attention forward (and a delta-net's)
    repeats = (L.recompute_granularity == "full", "core_attn" in L.recompute_modules)
    attention, attention_again, linear, linear_again = _ATTENTION.get(
        (job.model, job.gpu, job.cal, job.packing), (_attention_fields(L), repeats, job.seq_len, L.pp, L.vpp, rank),
        lambda: (*_rank_attention(job, units), *linear_attention_time(job, units)))
    attention += linear - linear_again
    recompute = per_gpu * flops.recompute / rates.dense + attention_again + linear_again
    elementwise = job.terms.elementwise_time(job, rank, units, per_gpu)
    gemm_flops = flops.dense + flops.expert
    again = job.terms.recomputed_elementwise_time(job, elementwise, flops.recompute / gemm_flops) if gemm_flops \
        else 0.0
    recompute += again
    total = gemm_all + attention_again + linear_again + attention + elementwise + again
    return RankCompute(rank, units, total, gemm_all - per_gpu * flops.recompute / rates.dense, recompute, attention,
                       elementwise, expert_gemm)


def rank_computes(job: Job) -> list[RankCompute]:
    """The compute per microbatch of the pipeline ranks that can set the pace (all up to ALL_RANKS_UP_TO_PP)."""
    pp = job.layout.pp
    ranks = range(pp) if pp <= ALL_RANKS_UP_TO_PP else sorted({0, 1, pp // 2, pp - 2, pp - 1})
    rates = gemm_rates(job)
    return [rank_compute(job, rates, rank) for rank in ranks]


# ---- communication per microbatch -----------------------------------------------------------------------------
def tp_comm_time(job: Job, layers: int) -> float:
    """Sequence-parallel all-gathers and reduce-scatters of the rank's layers, partly overlapped."""
    L = job.layout
    if L.tp <= 1:
        return 0.0
    vol = SP_COLLECTIVES_PER_LAYER * layers * job.tokens_rank * job.model.hidden_size * job.act_bytes \
        * (L.tp - 1) / L.tp
    return job.cal.tp_exposed * vol / _bw(job.gpu, L.tp, job.cal)


class CpGeometry(NamedTuple):
    """What a cp_comm_type's cost is made of, for one softmax-attention layer and microbatch on one rank.

    The CP group is TP-strided: its CP ranks span TP*CP consecutive GPUs. a2a+p2p splits it in two levels
    (Megatron's hierarchical_context_parallel_sizes): `a2a` consecutive CP ranks exchange heads for sequence, and
    the ring passes K/V between the `ring` groups. p2p is a ring of all CP ranks (a2a = 1); a2a is Ulysses over all
    of them (ring = 1); allgather gathers K/V from all (a2a = ring = 1, `cp` ranks).
    """
    cp: int
    a2a: int  # ranks of the all-to-all level
    ring: int  # ranks of the ring level
    kv: float  # bytes of this rank's K and V (after the a2a level: a2a x the tokens, 1/a2a of the heads)
    qkvo: float  # bytes of this rank's q, k, v and o before the all-to-all (the same after it)
    a2a_outside: float  # share of the a2a level's peers outside this GPU's NVLink domain
    ring_bw: float  # bytes/s of the slowest ring hop: NVLink when the TP*CP GPUs share a domain, else scale-out
    gather_bw: float  # bytes/s of an all-gather over the CP group (the same links as the ring)
    nvlink_bw: float
    scaleout_bw: float


class RingStep(NamedTuple):
    """Attention compute of one ring step of one layer, forward and backward (seconds): what hides the step's
    transfer. A layer's attention is split evenly over its ring steps (2*CP load-balanced chunks)."""
    fwd: float
    bwd: float


def cp_levels(layout: Layout) -> tuple[int, int]:
    """(a2a ranks, ring ranks) of the layout's cp_comm_type."""
    cp, kind = layout.cp, layout.cp_comm_type
    if kind == "a2a":
        return cp, 1
    if kind == "a2a+p2p":
        sizes = layout.hierarchical_cp or (cp, 1)
        return sizes[0], sizes[-1] if len(sizes) > 1 else 1
    return 1, cp


def _cp_ranks_per_nvlink_domain(job: Job) -> int:
    return max(1, min(job.layout.cp, job.gpu.nvlink_domain // job.layout.tp))


def cp_geometry(job: Job) -> CpGeometry:
    model, L, e = job.model, job.layout, job.act_bytes
    d_qk, d_v = attention_dims(model)
    heads = model.num_attention_heads / L.tp
    kv_heads = heads if model.is_mla else model.num_kv_heads / L.tp
    t_local = job.tokens_rank
    a2a, ring = cp_levels(L)
    domain = max(1, job.gpu.nvlink_domain // L.tp)  # CP ranks per NVLink domain
    within = L.tp * L.cp <= job.gpu.nvlink_domain
    nvlink, scaleout = _nvlink_bw(job.gpu, job.cal), _scaleout_bw(job.gpu, job.cal)
    return CpGeometry(
        cp=L.cp, a2a=a2a, ring=ring, kv=t_local * kv_heads * (d_qk + d_v) * e,
        qkvo=t_local * (heads * (d_qk + d_v) + kv_heads * (d_qk + d_v)) * e,
        a2a_outside=max(0.0, 1.0 - domain / a2a), ring_bw=nvlink if within else scaleout,
        gather_bw=nvlink if within else scaleout, nvlink_bw=nvlink, scaleout_bw=scaleout)


def ring_exposed_time(ranks: int, transfer: float, step: RingStep) -> float:
    """Seconds of a ring's transfers that its attention steps do not hide (Transformer Engine's
    AttnFuncWithCPAndKVP2P). Forward: ranks-1 steps each send K/V (`transfer` seconds) while the step's attention
    runs. Backward: the first step sends K/V, the middle ones K/V and the accumulated dK/dV, the last dK/dV alone;
    each overlapped with that step's backward."""
    if ranks <= 1:
        return 0.0
    fwd = (ranks - 1) * max(0.0, transfer - step.fwd)
    bwd = 2 * max(0.0, transfer - step.bwd) + (ranks - 2) * max(0.0, 2 * transfer - step.bwd)
    return fwd + bwd + 2 * (ranks - 1) * RING_TRANSFER_LATENCY_S


def a2a_exchange_time(g: CpGeometry) -> float:
    """Ulysses all-to-alls of one layer, fwd and bwd (q, k, v in and o out; dO in and dQ, dK, dV out), on the
    critical path: each rank keeps 1/a2a of its tensors; NVLink and scale-out peers are served concurrently."""
    if g.a2a <= 1:
        return 0.0
    volume = FWD_AND_BWD * g.qkvo * (g.a2a - 1) / g.a2a
    return max(volume * (1 - g.a2a_outside) / g.nvlink_bw, volume * g.a2a_outside / g.scaleout_bw)


def cp_p2p_time(g: CpGeometry, step: RingStep) -> float:
    """p2p: a ring over all CP ranks; each step's K/V send hides behind that step's attention block."""
    return ring_exposed_time(g.ring, g.kv / g.ring_bw, step)


def cp_allgather_time(g: CpGeometry, step: RingStep) -> float:  # noqa: ARG001 -- a CP_COMM_TIME
    """allgather: K/V gathered before the forward's attention, gathered again for the backward and dK/dV
    reduce-scattered after it (AttnFuncWithCPAndKVAllGather): three collectives of (CP-1) shards, not hidden."""
    return 3 * (g.cp - 1) * g.kv / g.gather_bw if g.cp > 1 else 0.0


def cp_a2a_time(g: CpGeometry, step: RingStep) -> float:  # noqa: ARG001 -- a CP_COMM_TIME
    """a2a (Ulysses): heads exchanged for sequence before attention and back after it; nothing to hide behind."""
    return a2a_exchange_time(g)


def cp_a2a_p2p_time(g: CpGeometry, step: RingStep) -> float:
    """a2a+p2p: the a2a level (inside the NVLink domain when a2a*TP fits) makes each ring step a2a x longer with
    1/a2a of the heads: the same K/V bytes per step against a2a x more attention to hide them behind."""
    return a2a_exchange_time(g) + ring_exposed_time(g.ring, g.kv / g.ring_bw, step)


CP_COMM_TIME = {"p2p": cp_p2p_time, "allgather": cp_allgather_time, "a2a": cp_a2a_time, "a2a+p2p": cp_a2a_p2p_time}


def linear_attention_cp_time(job: Job, layers: int) -> float:
    """Gated delta-net is sequential along the sequence: under CP its inputs are re-sharded from sequence to heads
    and back with all-to-alls (q, k, v, gates in; output out), fwd and bwd, not overlapped."""
    model, L = job.model, job.layout
    if L.cp <= 1 or not layers:
        return 0.0
    qk = model.linear_key_head_dim * model.linear_num_key_heads
    v = model.linear_value_head_dim * model.linear_num_value_heads
    gates = 2 * model.linear_num_value_heads  # beta and the decay, one each per value head
    vol = FWD_AND_BWD * job.tokens_rank * (2 * qk + 2 * v + gates) * job.act_bytes / L.tp * (L.cp - 1) / L.cp
    scaleout_share = max(0.0, 1.0 - _cp_ranks_per_nvlink_domain(job) / L.cp)
    return split_traffic_time(layers * vol, scaleout_share, _nvlink_bw(job.gpu, job.cal),
                               _scaleout_bw(job.gpu, job.cal))


def cp_step_report(job: Job) -> dict[str, Any]:
    """One full-attention layer's CP communication for one microbatch on one rank, in the units a reader checks
    (MB, ms): levels, the link the ring crosses, the bytes and time of one ring transfer, the attention of one
    ring step (fwd, bwd) that hides it, the all-to-all time and what stays exposed."""
    g = cp_geometry(job)
    t = attention_layer_time(job, "full")
    step = RingStep(t.fwd / g.ring, t.bwd / g.ring)
    transfer = g.kv / g.ring_bw
    return {"cp_comm_type": job.layout.cp_comm_type, "a2a": g.a2a, "ring": g.ring,
            "ring_link": "NVLink" if g.ring_bw == g.nvlink_bw else "scale-out",
            "kv_mb_per_transfer": g.kv / 1e6, "transfer_ms": 1e3 * transfer,
            "attention_fwd_step_ms": 1e3 * step.fwd, "attention_bwd_step_ms": 1e3 * step.bwd,
            "attention_layer_ms": 1e3 * (t.fwd + t.bwd), "a2a_ms": 1e3 * a2a_exchange_time(g),
            "exposed_ms": 1e3 * CP_COMM_TIME[job.layout.cp_comm_type](g, step) if g.cp > 1 else 0.0}


def cp_comm_time(job: Job, rank: RankCompute) -> float:
    """Context parallel: the layout's cp_comm_type over the softmax-attention layers, plus the linear ones
    (memoised on CP_COMM_FIELDS)."""
    L = job.layout
    return _CP_COMM.get((job.model, job.gpu, job.cal, job.packing), (_cp_comm_fields(L), job.seq_len, L.pp, L.vpp,
                                                                     rank.rank),
                        lambda: _cp_comm_time(job, rank))


def _cp_comm_time(job: Job, rank: RankCompute) -> float:
    kinds = census(job.model, rank.units).kinds
    linear = kinds.count("linear")
    softmax_time = 0.0
    if job.layout.cp > 1 and len(kinds) > linear:
        g = cp_geometry(job)
        part = CP_COMM_TIME[job.layout.cp_comm_type]
        for kind in set(kinds) - {"linear"}:
            t = attention_layer_time(job, kind)
            softmax_time += kinds.count(kind) * part(g, RingStep(t.fwd / g.ring, t.bwd / g.ring))
    return softmax_time + linear_attention_cp_time(job, linear)


def _ep_traffic(job: Job) -> tuple[float, float]:
    """(bytes, scale-out share) one rank sends per MoE layer per microbatch: dispatch + combine, fwd and bwd; the
    busiest rank receives `expert_load` x the balanced share (the all-gather dispatcher gathers every token
    whatever the routing). The flex dispatchers send a token once per distinct rank and, across NVLink domains,
    once per distinct domain (dispatcher_comm.flex_token_copies); NCCL's all-to-all every (token, expert) copy.
    DeepEP/HybridEP dispatch FP8 tokens in FP8 except MXFP8's, sent in BF16 (quantisation.py)."""
    model, L, e, gpu = job.model, job.layout, job.act_bytes, job.gpu
    h = model.hidden_size
    tsp = job.tokens_rank / L.tp if L.sp else job.tokens_rank
    span = dispatcher_comm.ep_span(L)
    scaleout_share = max(0.0, 1.0 - gpu.nvlink_domain / span)
    if L.dispatcher == "allgather":
        # all-gather of the tokens and reduce-scatter of the outputs, fwd and bwd
        return FWD_AND_BWD * tsp * h * e * (L.ep - 1) * 2, scaleout_share
    flex = L.dispatcher in ("deepep", "hybridep")
    if flex:
        domains = max(1, math.ceil(span / gpu.nvlink_domain))
        nvl, out = dispatcher_comm.flex_token_copies(L.ep, domains, model.topk)
    else:
        nvl, out = dispatcher_comm.alltoall_token_copies(L.ep, model.topk, scaleout_share)
    dispatch = quantisation.dispatch_bytes_per_element(L.precision, e) if flex else e
    copies = nvl + out
    volume = FWD_AND_BWD * tsp * copies * h * job.expert_load * (dispatch + e)
    return volume, (out / copies if copies else 0.0)


def ep_comm_time(job: Job, moe: int) -> float:
    """Expert-parallel all-to-all, split into NVLink-domain and scale-out traffic (at the family's reach of each
    link), partly overlapped."""
    model, L = job.model, job.layout
    if not (model.is_moe and L.ep > 1 and moe):
        return 0.0

    def compute() -> float:
        volume, scaleout_share = _ep_traffic(job)
        return job.terms.ep_alltoall_time(job, volume, scaleout_share) * moe
    return _EP_COMM.get((model, job.gpu, job.cal), (_ep_comm_fields(L), job.seq_len, job.num_gpus, moe), compute)


def layer_busy(rank: RankCompute, comm: float, ep: float, moe: int, layers: int | None = None) -> LayerBusy:
    """One layer's GPU time per microbatch on the rank, forward (a third of the compute, half the communication)
    and backward (the rest and the recompute), and an MoE layer's forward after its sync (the experts' share of
    the forward GEMMs, half of the all-to-all): what the host's launches can hide behind. `layers`: the rank's
    layers, when counted already."""
    layers = max(1, sum(1 for u in rank.units if u.is_layer) if layers is None else layers)
    work = rank.total - rank.recompute
    fwd = (work / 3 + comm / 2) / layers
    bwd = (2 * work / 3 + rank.recompute + comm / 2) / layers
    post = (rank.expert_gemm / 3 + ep / 2) / moe if moe else 0.0
    return LayerBusy(fwd, bwd, post)


class MicrobatchTerms(NamedTuple):
    """Seconds of one microbatch on a pipeline rank beside its own compute."""
    tp: float
    cp: float
    ep: float
    dispatcher: float
    launch: float
    pp: float
    contention: float


def microbatch_terms(job: Job, rank: RankCompute) -> MicrobatchTerms:
    """The communication, dispatcher, launch and contention terms of one microbatch on `rank`."""
    counted = census(job.model, rank.units)
    layers = counted.layers
    tp = tp_comm_time(job, layers)
    cp = cp_comm_time(job, rank)
    moe = counted.moe
    # the dispatcher's overhead reads what the EP all-to-all reads (EP_COMM_FIELDS): one memo for both
    ep, dispatch = _EP_DISPATCH.get((job.model, job.gpu, job.cal), (_ep_comm_fields(job.layout), job.seq_len,
                                                                    job.num_gpus, moe), lambda: _ep_dispatch(job, moe))
    launch = job.terms.launch_overhead_time(job, rank.units, layer_busy(rank, tp + cp + ep + dispatch, ep, moe,
                                                                        layers))
    return MicrobatchTerms(tp, cp, ep, dispatch, launch, pp_comm_time(job), job.terms.host_contention_time(job, rank))


def _ep_dispatch(job: Job, moe: int) -> tuple[float, float]:
    ep = ep_comm_time(job, moe)
    return ep, job.terms.dispatcher_overhead_time(job, moe, ep)


def pp_comm_time(job: Job) -> float:
    """Activations sent to the next stage and gradients back, per virtual stage, partly hidden."""
    L = job.layout
    if L.pp <= 1:
        return 0.0
    act = job.tokens_rank * job.model.hidden_size * job.act_bytes / (L.tp if L.sp else 1)
    span = L.pp * L.tp * L.cp * job.dp
    return PP_EXPOSED * PP_TRANSFERS_PER_MICROBATCH * L.vpp * act / _bw(job.gpu, span, job.cal)


def pipeline_bubble_time(layout: Layout, per_microbatch: float, microbatches: int) -> float:
    """Warm-up and drain of the (interleaved) 1F1B schedule: (PP-1)/(VPP*m) of the time of the m microbatches,
    i.e. (PP-1)/VPP microbatch times whatever m is (Megatron's bubble; the step is t_mb * (m + (PP-1)/VPP))."""
    if layout.pp <= 1:
        return 0.0
    return per_microbatch * microbatches * (layout.pp - 1) / (layout.vpp * microbatches)


# ---- once per step --------------------------------------------------------------------------------------------
def dp_comm_time(job: Job, params: RankParams) -> float:
    """Gradient reduce-scatter + parameter all-gather: dense over DP*CP, experts over EDP; mostly overlapped."""
    L, edp = job.layout, job.edp
    dpcp = job.dp * L.cp
    if dpcp <= 1 and edp <= 1:
        return 0.0
    per_param = grad_bytes(L) + weight_bytes(L)
    vol = params.dense * per_param * (dpcp - 1) / dpcp + params.expert * per_param * (edp - 1) / edp
    return job.cal.dp_exposed * vol / _bw(job.gpu, job.num_gpus if dpcp > 1 else 1, job.cal) \
        + job.terms.dp_latency(job, max(dpcp, edp))


def _optimizer_shard(job: Job, params: RankParams) -> float:
    """Parameters whose Adam step this rank runs (its distributed-optimizer shard)."""
    if not job.layout.distributed_optimizer:
        return params.dense + params.expert
    return params.dense / (job.dp * job.layout.cp) + params.expert / job.edp


def optimizer_time(job: Job, params: RankParams) -> float:
    """Adam over the part of the shard kept on the GPU: HBM bound."""
    on_gpu = _optimizer_shard(job, params) * (1 - job.layout.optimizer_offload)
    return on_gpu * ADAM_HBM_BYTES_PER_PARAM / job.hbm


def optimizer_offload_time(job: Job, params: RankParams) -> float:
    """The offloaded share: over the host link and back, and the host's CPU Adam."""
    if job.layout.optimizer_offload <= 0:
        return 0.0
    gpu = job.gpu
    # an x86 host's CPU Adam rate goes with the generation of the DGX it sits in (Hopper or Blackwell)
    host = gpu.family if gpu.host == "x86" else gpu.host
    off = _optimizer_shard(job, params) * job.layout.optimizer_offload
    return off * OFFLOAD_HOST_BYTES_PER_PARAM / (gpu.host_link_gbps * 1e9) + off / CPU_ADAM_PARAMS_PER_S[host]


def activation_offload_time(job: Job, rank: RankCompute) -> float:
    """Seconds per microbatch the activation offload's copies add on `rank`: what the rank's microbatch offloads
    (summed over its chunks) goes down over the host link during the forward and comes back during the backward,
    each hidden behind that pass's compute (a layer's copy overlaps the next layers' work: Megatron-Core's offload
    runs on its own streams and waits for a copy only when the backward needs it), exposed where it is longer. The
    optimizer offload's transfers run after the backward, so the two do not share the copy engines in time."""
    L = job.layout
    if not L.activation_offload or job.gpu.is_cpu:
        return 0.0
    host = sum(chunk_offloaded_bytes(job.model, L, job.seq_len, chunk, False)[0]
               for chunk in job.place.rank_stages(rank.rank))
    copy = host / (job.gpu.host_link_gbps * 1e9)
    work = rank.total - rank.recompute
    forward, backward = work / 3, 2 * work / 3 + rank.recompute  # as layer_busy splits a layer's work
    return max(0.0, copy - forward) + max(0.0, copy - backward)


def step_time(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
              cal: Calibration | None = None, packing: LengthHistogram | None = None) -> StepTime:
    """Seconds per optimizer step, by component (the module docstring's formula); `step` is the total.

    Per step: `compute` (= gemm + attention + elementwise) and `recompute` are apart; the components sum to `step`.
    `packing`: documents packed into each sequence (search_spaces/cost/packing.py; None: one of seq_len tokens).
    """
    job = job_for(model, gpu, num_gpus, seq_len, layout, cal, packing)
    m = layout.grad_accum(num_gpus) or 1
    # the pace is the rank slowest with its launches and communication (the host's launches can outweigh a
    # rank's compute: the first and last ranks hold fewer layers but the embedding and the output head)
    rank, t, copies = max(((rc, microbatch_terms(job, rc), activation_offload_time(job, rc))
                           for rc in rank_computes(job)), key=lambda x: x[0].total + sum(x[1]) + x[2])
    per_mb = rank.total + sum(t) + copies  # rank.total: compute + recompute
    bubble = pipeline_bubble_time(layout, per_mb, m)
    params = rank_params(model, layout, rank.units)
    dp = dp_comm_time(job, params)
    optimizer = optimizer_time(job, params)
    offload = optimizer_offload_time(job, params)
    return StepTime(
        compute=(rank.total - rank.recompute) * m, gemm=rank.gemm * m, attention=rank.attention * m,
        elementwise=rank.elementwise * m, recompute=rank.recompute * m, tp_comm=t.tp * m, cp_comm=t.cp * m,
        ep_comm=t.ep * m, dispatcher_overhead=t.dispatcher * m, pp_comm=t.pp * m, launch_overhead=t.launch * m,
        pipeline_bubble=bubble, dp_comm=dp, optimizer=optimizer, optimizer_offload=offload,
        host_contention=t.contention * m, step=per_mb * m + bubble + dp + optimizer + offload,
        activation_offload=copies * m)


def recompute_flops_per_step(model: ModelSpec, seq_len: int, layout: Layout) -> float:
    """Extra FLOPs the recompute choice adds over a whole step (for hardware-FLOP figures)."""
    units = model_units(model.num_layers, model.mtp_layers)
    return sum(_unit_flops(model, seq_len, u, layout).recompute for u in units) * seq_len * layout.gbs
