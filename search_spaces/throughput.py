"""Throughput model: step time of the most loaded pipeline rank, with a breakdown.

step = m x (compute + recompute + tp_comm + cp_comm + ep_comm + launch + pp_comm)    per microbatch, m microbatches
       + bubble + dp_comm + optimizer + optimizer_offload                          once per step

compute     = GEMM FLOPs (Bridge accounting) / (peak(precision) x GEMM efficiency x shape factor)
              (shape factor: the GEMM's operand traffic over HBM at its m x k x n -- small experts, few tokens
              per expert and narrow TP slices lose more; grouped expert GEMMs have their own efficiency)
            + core-attention FLOPs / (BF16 peak x attention efficiency)   # flash attention runs in bf16
            + element-wise passes over the activations / HBM bandwidth
            + passes over the routed token copies (permute, activation, un-permute) / HBM bandwidth
            + fp8 only: casting every GEMM input to fp8 (and its transposed copy) / HBM bandwidth
            Blackwell Ultra (B300, GB300) runs these at a measured `sustained_rate` over B200/GB200
recompute   = the forward FLOPs the recompute choice repeats, at the dense GEMM rate
tp_comm     = sequence-parallel all-gather/reduce-scatter, 8 per layer per microbatch, partly overlapped
cp_comm     = per cp_comm_type: ring p2p of K/V (3(CP-1) chunk transfers per layer) overlapped with the layer's
              attention, all-gather, all-to-all, or all-to-all inside the NVLink domain + ring across it;
              plus the all-to-alls of the linear-attention (gated delta-net) layers
ep_comm     = dispatch + combine all-to-all, fwd and bwd, split into NVLink-domain and scale-out traffic
launch      = host launch overhead per layer per microbatch, removed by the CUDA graph scopes that cover it
pp_comm     = activations sent between stages; bubble = (PP-1)/(VPP*m) of the time per microbatch
dp_comm     = gradient reduce-scatter + parameter all-gather over DP*CP (dense) and EDP (experts), overlapped
optimizer   = Adam step over the local shard (HBM bound); offload = offloaded share over the host link + CPU Adam
The few efficiency constants are fitted on ../shared/reference (search_spaces/calibration.json, CALIBRATION.md);
the physical and assumed ones are the named constants below, each with where it comes from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from search_spaces.flops import _attention_core_per_token, _attention_proj_per_token, padded_vocab_size
from search_spaces.hardware import GPUSpec
from search_spaces.layout import Layout
from search_spaces.memory import RankParams, act_bytes, chunk_activations, grad_bytes, rank_params, weight_bytes
from search_spaces.models import ModelSpec
from search_spaces.pipeline import EMBEDDING, LOSS, Placement, Unit, model_units, placement

# ---- fitted or hand-set constants (re-fit with bench/fit_calibration.py; see CALIBRATION.md) ----------------
# eager PyTorch/autograd time per layer per microbatch on cpu (fwd+bwd): set by hand so tiny-moe matches its
# measured 0.2-1.3 s steps on 2 shared cores
CPU_OVERHEAD_PER_LAYER_S = 0.01

CALIBRATION_PATH = Path(__file__).parent / "calibration.json"
DEFAULT_CALIBRATION = {
    # per GPU (h200 uses h100's: same chip) and precision class; per family as the fallback
    "gemm_efficiency": {"hopper": {"bf16": 0.62, "fp8": 0.45}, "blackwell": {"bf16": 0.60, "fp8": 0.45},
                        "cpu": {"fp32": 0.5, "bf16": 0.5}},
    "grouped_gemm_efficiency": {"hopper": 0.8, "blackwell": 0.8, "cpu": 0.8},  # relative to dense GEMMs
    "attention_efficiency": {"hopper": 0.45, "blackwell": 0.5, "cpu": 0.3},
    "elementwise_passes": 8.0,  # reads+writes of the saved activations, fwd+bwd
    "sustained_rate": {},  # per GPU: achieved rate relative to the family's (Blackwell Ultra > 1)
    "routed_passes": 2.0,  # HBM passes over each routed token copy (permute, activation, unpermute), fwd+bwd
    "fp8_cast_bytes": 4.0,  # HBM bytes per GEMM-input element to cast it to fp8 (read 2, write 1, transposed copy 1)
    "ep_exposed": 0.5,  # fraction of the EP all-to-all not hidden by overlap
    "tp_exposed": 0.5,
    "dp_exposed": 0.2,
    "launch_overhead_s": 2.0e-4,  # per layer per microbatch, removed by CUDA graphs as they cover it
    "cpu_overhead_per_layer_s": CPU_OVERHEAD_PER_LAYER_S,  # replaces launch_overhead_s on cpu (no graphs there)
    "comm_efficiency": 0.7,  # achieved / datasheet bandwidth
    "dispatcher_efficiency": {"alltoall": 0.6, "allgather": 0.6, "deepep": 0.85, "hybridep": 0.9},
}
CALIBRATION_ALIASES = {"h200": "h100"}

# ---- physical, derived and assumed constants (not fitted) -----------------------------------------------------
FWD_BWD_FLOPS_PER_MAC = 6.0  # 2 FLOPs per multiply-add x 3 GEMMs (forward, data grad, weight grad): Bridge's count
FWD_FLOPS_PER_MAC = 2.0  # the forward alone
GEMMS_PER_FWD_BWD = 3  # recomputing the forward repeats one GEMM of the three
FWD_AND_BWD = 2  # a transfer made in the forward is mirrored by one in the backward
FP8_BYTES = 1
# the rate used for a precision class the calibration has no entry for
UNCALIBRATED_GEMM_EFFICIENCY = 0.5
# beyond 4 pipeline ranks only the first (embedding, most in flight), second, middle, last two (output head) are
# timed: the slowest of them sets the pace
ALL_RANKS_UP_TO_PP = 4
# every GEMM input is cast to fp8 twice: the activation in the forward, the output gradient in the backward
FP8_CASTS_PER_GEMM_INPUT = 2
# sequence parallel: all-gather before and reduce-scatter after attention and MLP in the forward (4 per layer),
# mirrored in the backward (4)
SP_COLLECTIVES_PER_LAYER = 8
# ring CP: each of the CP-1 ring steps moves a K/V chunk in the forward, then K/V again and dK/dV in the backward
CP_RING_TRANSFERS_PER_STEP = 3
# share of a layer's attention that can hide its ring transfers (each step overlaps one attention block);
# assumed, not fitted: the CP terms carry the long-context extrapolation (CALIBRATION.md)
CP_RING_HIDDEN_SHARE = 0.9
# all-gather CP gathers K/V before the attention that needs it: about half the attention can hide it (assumed)
CP_ALLGATHER_HIDDEN_SHARE = 0.5
# fixed cost of one ring transfer (send/recv launch and handshake, ~20 us; assumed)
RING_TRANSFER_LATENCY_S = 2e-5
# gloo's all-to-all between processes on one host, whatever the dispatcher (assumed; no fused kernels on cpu)
CPU_DISPATCHER_EFFICIENCY = 0.5
# share of a layer's host launches each CUDA-graph scope captures (assumed from the share of the layer's kernels
# it holds; not fitted); full_iteration captures all of them
GRAPH_COVERAGE = {"attn": 0.35, "mlp": 0.3, "moe": 0.4, "moe_router": 0.1, "moe_preprocess": 0.1,
                  "full_iteration": 1.0}
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
# a host link this fast is Grace's NVLink-C2C (450 GB/s); PCIe hosts have 55 GB/s
GRACE_HOST_LINK_GBPS = 400


@lru_cache(maxsize=1)
def calibration() -> dict:
    cal = json.loads(json.dumps(DEFAULT_CALIBRATION))
    if CALIBRATION_PATH.is_file():
        stored = json.loads(CALIBRATION_PATH.read_text())
        cal.update({k: v for k, v in stored.items() if k in cal})
    return cal


def gpu_family(gpu: GPUSpec) -> str:
    if gpu.is_cpu:
        return "cpu"
    return "hopper" if gpu.name.startswith("h") else "blackwell"


def precision_class(precision: str) -> str:
    return "fp8" if precision.startswith("fp8") or precision == "mxfp8" else precision


def sustained_factor(gpu: GPUSpec, cal: dict) -> float:
    """Blackwell Ultra (B300, GB300) runs faster than its datasheet twin at the same dense peak: a higher power
    limit keeps the tensor cores at higher clocks, and its doubled SFU rate speeds up softmax. Measured on the
    reference rows that ran the same layout and release on both chips (see CALIBRATION.md)."""
    return cal["sustained_rate"].get(gpu.name, 1.0)


def gemm_rate(gpu: GPUSpec, precision: str, cal: dict) -> float:
    table = cal["gemm_efficiency"]
    per = table.get(CALIBRATION_ALIASES.get(gpu.name, gpu.name)) or table[gpu_family(gpu)]
    eff = per.get(precision_class(precision), UNCALIBRATED_GEMM_EFFICIENCY)
    return gpu.peak(precision) * 1e12 * eff * sustained_factor(gpu, cal)


def attention_rate(gpu: GPUSpec, precision: str, cal: dict) -> float:
    base = "fp32" if precision == "fp32" else "bf16"
    return gpu.peak(base) * 1e12 * cal["attention_efficiency"][gpu_family(gpu)] * sustained_factor(gpu, cal)


def _bw(gpu: GPUSpec, span: int, cal: dict) -> float:
    """Bytes/s per GPU for a group of `span` consecutive ranks: NVLink inside a domain, else scale-out."""
    gbps = gpu.nvlink_gbps if span <= gpu.nvlink_domain else gpu.scaleout_gbps
    return gbps * 1e9 * cal["comm_efficiency"]


def _nvlink_bw(gpu: GPUSpec, cal: dict) -> float:
    return _bw(gpu, 1, cal)


def _scaleout_bw(gpu: GPUSpec, cal: dict) -> float:
    return _bw(gpu, gpu.nvlink_domain + 1, cal)


def _element_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else (FP8_BYTES if precision_class(precision) == "fp8" else 2)


def _shape_factor(m: float, k: float, n: float, precision: str, rate: float, hbm: float, cpu: bool) -> float:
    """Share of the GEMM rate left once the operand traffic is added: 1 / (1 + rate / (HBM x intensity)).

    Intensity = 2mkn / (bytes x (mk + kn + mn)): small experts (Qwen3-30B's 768-wide FFN), few tokens per expert
    or a narrow TP slice make a GEMM memory-bound; big square GEMMs lose a few per cent.
    """
    if cpu or min(m, k, n) <= 0:
        return 1.0
    b = _element_bytes(precision)
    intensity = 2 * m * k * n / (b * (m * k + k * n + m * n))
    return 1.0 / (1.0 + rate / (hbm * intensity))


@dataclass(frozen=True)
class Job:
    """One step-time question: model, hardware, world size, sequence length, layout, and the calibration."""
    model: ModelSpec
    gpu: GPUSpec
    num_gpus: int
    seq_len: int
    layout: Layout
    cal: dict

    @property
    def place(self) -> Placement:
        place = placement(self.model, self.layout.pp, self.layout.vpp)
        assert place is not None, "step_time needs a legal layout (rules.check)"
        return place

    @property
    def tokens_mb(self) -> int:
        """Tokens of one microbatch (whole sequences)."""
        return self.layout.mbs * self.seq_len

    @property
    def tokens_rank(self) -> float:
        """Tokens of one microbatch on a CP rank (what the dense GEMMs see after the SP all-gather)."""
        return self.tokens_mb / self.layout.cp

    @property
    def act_bytes(self) -> int:
        return act_bytes(self.layout)

    @property
    def hbm(self) -> float:
        return self.gpu.hbm_tbps * 1e12

    @property
    def dp(self) -> int:
        return max(self.layout.dp(self.num_gpus), 1)

    @property
    def edp(self) -> int:
        return max(self.layout.edp(self.num_gpus), 1)


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
    proj = FWD_BWD_FLOPS_PER_MAC * _attention_proj_per_token(model, kind)
    core = FWD_BWD_FLOPS_PER_MAC * _attention_core_per_token(model, kind, seq_len)
    if model.layer_is_moe(unit.layer):
        expert = FWD_BWD_FLOPS_PER_MAC * h * model.moe_ffn_hidden_size * model.topk * glu
        mlp = FWD_BWD_FLOPS_PER_MAC * h * model.shared_expert_ffn_hidden_size * glu
    else:
        expert, mlp = 0.0, FWD_BWD_FLOPS_PER_MAC * h * model.ffn_hidden_size * glu
    if unit.is_mtp:
        mlp += FWD_BWD_FLOPS_PER_MAC * (3 * h + 2 * h * h)  # MTP's eh-projection (2h -> h) and norms, Bridge's term
    return proj, core, expert, mlp


def _recompute_flops(model: ModelSpec, unit: Unit, layout: Layout, proj: float, core: float, expert: float,
                     mlp: float) -> float:
    """Per-token FLOPs the recompute choice adds to a layer: the repeated forward of what it recomputes."""
    if layout.recompute_granularity == "full":
        return (proj + core + expert + mlp) / GEMMS_PER_FWD_BWD
    if layout.recompute_granularity != "selective":
        return 0.0
    rc = 0.0
    mods = set(layout.recompute_modules)
    moe = model.layer_is_moe(unit.layer)
    if "core_attn" in mods:
        rc += core / GEMMS_PER_FWD_BWD
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


def _unit_flops(model: ModelSpec, seq_len: int, unit: Unit, layout: Layout) -> UnitFlops:
    """Per-token forward+backward FLOPs of one pipeline unit."""
    if unit == EMBEDDING:
        return UnitFlops(0.0, 0.0, 0.0, 0.0)
    if unit == LOSS:
        logits = FWD_BWD_FLOPS_PER_MAC * model.hidden_size * padded_vocab_size(model.vocab_size)
        return UnitFlops(logits * (1 + model.mtp_layers), 0.0, 0.0, 0.0)
    proj, core, expert, mlp = _layer_flops(model, seq_len, unit)
    return UnitFlops(proj + mlp, expert, core, _recompute_flops(model, unit, layout, proj, core, expert, mlp))


def _rank_flops(model: ModelSpec, seq_len: int, units: list[Unit], layout: Layout) -> UnitFlops:
    dense = expert = core = rc = 0.0
    for u in units:
        f = _unit_flops(model, seq_len, u, layout)
        dense, expert, core, rc = dense + f.dense, expert + f.expert, core + f.core, rc + f.recompute
    return UnitFlops(dense, expert, core, rc)


def _gemm_input_width(model: ModelSpec, units) -> float:
    """Sum over the rank's layers of the widths of every GEMM input per token (what fp8 casts)."""
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


def _moe_layers(model: ModelSpec, units) -> int:
    return sum(1 for u in units if u.is_layer and model.layer_is_moe(u.layer))


# ---- compute per microbatch on one pipeline rank --------------------------------------------------------------
class GemmRates(NamedTuple):
    dense: float  # FLOP/s of the rank's dense GEMMs at their shape
    grouped: float  # the expert grouped GEMMs' rate relative to `dense` (1 without experts)


def gemm_rates(job: Job) -> GemmRates:
    """Dense GEMMs see this rank's tokens of the microbatch and a TP-split width; each local expert sees its share
    of the tokens of all EP ranks and an ETP-split width."""
    model, L, gpu, h = job.model, job.layout, job.gpu, job.model.hidden_size
    peak_rate = gemm_rate(gpu, L.precision, job.cal)
    t_rank = job.tokens_rank
    n_dense = (model.ffn_hidden_size if not model.is_moe else
               model.num_attention_heads * (model.q_head_dim if model.is_mla else model.head_dim)) / L.tp
    dense_shape = _shape_factor(t_rank, h, n_dense, L.precision, peak_rate, job.hbm, gpu.is_cpu)
    if not model.is_moe:
        return GemmRates(peak_rate * dense_shape, 1.0)
    m_expert = t_rank / (L.tp if L.sp else 1) * L.ep * model.topk / model.num_experts
    expert_shape = _shape_factor(m_expert, h, model.moe_ffn_hidden_size / L.etp, L.precision, peak_rate, job.hbm,
                                 gpu.is_cpu)
    grouped = job.cal["grouped_gemm_efficiency"][gpu_family(gpu)] * expert_shape / dense_shape
    return GemmRates(peak_rate * dense_shape, grouped)


def activation_passes_time(job: Job, rank: int) -> float:
    """Norms, RoPE, residuals, casts: passes over every activation the rank's chunks produce (before recompute)."""
    plain = job.layout.replace(recompute="none")
    acts = sum(chunk_activations(job.model, plain, job.seq_len, c, job.gpu.is_cpu)
               for c in job.place.rank_stages(rank))
    return job.cal["elementwise_passes"] * acts / job.hbm


def routed_passes_time(job: Job, units: list[Unit], per_gpu: float) -> float:
    """Every routed copy of a token is permuted, scattered, put through the activation and the probability
    scaling and un-permuted (fwd and bwd): passes over topk x (hidden + intermediate)."""
    model, L = job.model, job.layout
    n_moe = _moe_layers(model, units)
    if not n_moe or job.gpu.is_cpu:
        return 0.0
    glu = 2 if model.gated_mlp else 1
    routed = model.topk * (2 * model.hidden_size + (glu + 1) * model.moe_ffn_hidden_size / L.etp)
    return job.cal["routed_passes"] * n_moe * per_gpu * routed * job.act_bytes / job.hbm


def fp8_cast_time(job: Job, units: list[Unit], per_gpu: float) -> float:
    """fp8 recipes cast every GEMM input to fp8 first (plus a transposed copy for the weight gradient)."""
    if precision_class(job.layout.precision) != "fp8" or job.gpu.is_cpu:
        return 0.0
    width = _gemm_input_width(job.model, units)
    return per_gpu * width * FP8_CASTS_PER_GEMM_INPUT * job.cal["fp8_cast_bytes"] / job.hbm


class RankCompute(NamedTuple):
    """Seconds per microbatch of one pipeline rank's own work."""
    rank: int
    units: list[Unit]
    total: float  # everything below: what the pace is set by
    gemm: float  # the model's GEMMs
    recompute: float  # the GEMMs recompute repeats
    attention: float
    elementwise: float


def rank_compute(job: Job, rates: GemmRates, rank: int) -> RankCompute:
    L = job.layout
    units = job.place.rank_units(rank)
    flops = _rank_flops(job.model, job.seq_len, units, L)
    per_gpu = job.tokens_mb / (L.tp * L.cp)  # tokens of the microbatch per GPU sharing its dense work
    # recomputed forwards run at the dense GEMM rate (recomputed experts too), in one pass with the model's GEMMs
    gemm_all = per_gpu * (flops.dense + flops.recompute) / rates.dense \
        + per_gpu * flops.expert / (rates.dense * rates.grouped)
    recompute = per_gpu * flops.recompute / rates.dense
    attention = per_gpu * flops.core / attention_rate(job.gpu, L.precision, job.cal)
    elementwise = (activation_passes_time(job, rank) + routed_passes_time(job, units, per_gpu)
                   + fp8_cast_time(job, units, per_gpu))
    total = gemm_all + attention + elementwise
    return RankCompute(rank, units, total, gemm_all - recompute, recompute, attention, elementwise)


def slowest_rank_compute(job: Job) -> RankCompute:
    """The pipeline rank whose compute per microbatch sets the pace."""
    pp = job.layout.pp
    ranks = range(pp) if pp <= ALL_RANKS_UP_TO_PP else sorted({0, 1, pp // 2, pp - 2, pp - 1})
    rates = gemm_rates(job)
    worst = None
    for rank in ranks:
        rc = rank_compute(job, rates, rank)
        if worst is None or rc.total > worst.total:
            worst = rc
    assert worst is not None
    return worst


# ---- communication per microbatch -----------------------------------------------------------------------------
def tp_comm_time(job: Job, layers: int) -> float:
    """Sequence-parallel all-gathers and reduce-scatters of the rank's layers, partly overlapped."""
    L = job.layout
    if L.tp <= 1:
        return 0.0
    vol = SP_COLLECTIVES_PER_LAYER * layers * job.tokens_rank * job.model.hidden_size * job.act_bytes \
        * (L.tp - 1) / L.tp
    return job.cal["tp_exposed"] * vol / _bw(job.gpu, L.tp, job.cal)


class CpGeometry(NamedTuple):
    """What every cp_comm_type's cost is made of, for one softmax-attention layer on one rank."""
    cp: int
    kv_chunk: float  # bytes: this rank's K and V of one layer
    qkvo_a2a: float  # bytes: q, k, v and the output re-sharded between sequence and heads, fwd and bwd
    inside: int  # CP ranks per NVLink domain (CP ranks are strided by TP: the group spans TP*CP GPUs)
    nvlink_bw: float
    scaleout_bw: float

    @property
    def ring_bw(self) -> float:
        return self.nvlink_bw if self.inside >= self.cp else self.scaleout_bw

    @property
    def scaleout_share(self) -> float:
        """Share of an all-to-all's peers outside the NVLink domain."""
        return max(0.0, 1.0 - self.inside / self.cp)


def _cp_ranks_per_nvlink_domain(job: Job) -> int:
    return max(1, min(job.layout.cp, job.gpu.nvlink_domain // job.layout.tp))


def cp_geometry(job: Job) -> CpGeometry:
    model, L, e = job.model, job.layout, job.act_bytes
    if model.is_mla:
        kv_width = model.num_attention_heads * (model.q_head_dim + model.v_head_dim)
    else:
        kv_width = 2 * model.num_kv_heads * model.head_dim
    q_width = model.num_attention_heads * (model.q_head_dim if model.is_mla else model.head_dim)
    t_local = job.tokens_rank
    return CpGeometry(cp=L.cp, kv_chunk=t_local * kv_width * e / L.tp,
                      qkvo_a2a=FWD_AND_BWD * t_local * (2 * q_width + kv_width) * e / L.tp,
                      inside=_cp_ranks_per_nvlink_domain(job), nvlink_bw=_nvlink_bw(job.gpu, job.cal),
                      scaleout_bw=_scaleout_bw(job.gpu, job.cal))


def _split_traffic_time(volume: float, scaleout_share: float, nvlink_bw: float, scaleout_bw: float) -> float:
    return volume * ((1 - scaleout_share) / nvlink_bw + scaleout_share / scaleout_bw)


def cp_p2p_time(g: CpGeometry, attention_per_layer: float) -> float:
    """Ring: CP-1 K/V chunks forward, K/V and dK/dV backward; each step overlaps one attention block."""
    transfers = CP_RING_TRANSFERS_PER_STEP * (g.cp - 1)
    return max(0.0, transfers * g.kv_chunk / g.ring_bw - CP_RING_HIDDEN_SHARE * attention_per_layer) \
        + transfers * RING_TRANSFER_LATENCY_S


def cp_allgather_time(g: CpGeometry, attention_per_layer: float) -> float:
    """All-gather of K/V (and reduce-scatter of dK/dV), partly hidden behind the attention."""
    volume = CP_RING_TRANSFERS_PER_STEP * (g.cp - 1) * g.kv_chunk
    return max(0.0, volume / g.ring_bw - CP_ALLGATHER_HIDDEN_SHARE * attention_per_layer)


def cp_a2a_time(g: CpGeometry, attention_per_layer: float) -> float:
    """q, k, v and the output re-sharded from sequence to heads and back (Ulysses), fwd and bwd; not overlapped."""
    volume = g.qkvo_a2a * (g.cp - 1) / g.cp
    return _split_traffic_time(volume, g.scaleout_share, g.nvlink_bw, g.scaleout_bw)


def cp_a2a_p2p_time(g: CpGeometry, attention_per_layer: float) -> float:
    """All-to-all inside the NVLink domain, a ring of the remaining CP/inside groups across it."""
    outer = max(1, g.cp // g.inside)
    volume = g.qkvo_a2a * (g.inside - 1) / g.inside
    ring = CP_RING_TRANSFERS_PER_STEP * (outer - 1) * g.kv_chunk / g.scaleout_bw
    return volume / g.nvlink_bw + max(0.0, ring - CP_RING_HIDDEN_SHARE * attention_per_layer) \
        + CP_RING_TRANSFERS_PER_STEP * (outer - 1) * RING_TRANSFER_LATENCY_S


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
    return _split_traffic_time(layers * vol, scaleout_share, _nvlink_bw(job.gpu, job.cal),
                               _scaleout_bw(job.gpu, job.cal))


def cp_comm_time(job: Job, rank: RankCompute) -> float:
    """Context parallel: the layout's cp_comm_type over the softmax-attention layers, plus the linear ones."""
    layers = [u for u in rank.units if u.is_layer]
    softmax = [u for u in layers if job.model.attention_kind(u.layer) != "linear"]
    linear = len(layers) - len(softmax)
    softmax_time = 0.0
    if job.layout.cp > 1 and softmax:
        per_layer = CP_COMM_TIME[job.layout.cp_comm_type](cp_geometry(job), rank.attention / len(softmax))
        softmax_time = per_layer * len(softmax)
    return softmax_time + linear_attention_cp_time(job, linear)


def _ep_volume(job: Job) -> float:
    """Bytes one rank sends per MoE layer per microbatch: dispatch + combine, fwd and bwd."""
    model, L, e = job.model, job.layout, job.act_bytes
    h = model.hidden_size
    tsp = job.tokens_rank / L.tp if L.sp else job.tokens_rank
    if L.dispatcher == "allgather":
        # all-gather of the tokens and reduce-scatter of the outputs, fwd and bwd
        return FWD_AND_BWD * tsp * h * e * (L.ep - 1) * 2
    fp8_dispatch = precision_class(L.precision) == "fp8" and L.dispatcher in ("deepep", "hybridep")
    per_dir = tsp * model.topk * h * (L.ep - 1) / L.ep
    return FWD_AND_BWD * per_dir * ((FP8_BYTES if fp8_dispatch else e) + e)


def ep_comm_time(job: Job, moe_layers: int) -> float:
    """Expert-parallel all-to-all, split into NVLink-domain and scale-out traffic, partly overlapped."""
    model, L, gpu = job.model, job.layout, job.gpu
    if not (model.is_moe and L.ep > 1 and moe_layers):
        return 0.0
    span = L.ep * L.etp * L.tp  # EP ranks are strided by TP-sized blocks in the folded grid
    inter = max(0.0, 1.0 - gpu.nvlink_domain / span)
    eff = CPU_DISPATCHER_EFFICIENCY if gpu.is_cpu else job.cal["dispatcher_efficiency"][L.dispatcher]
    # the dispatchers' own efficiency stands in for comm_efficiency here
    t_a2a = _split_traffic_time(_ep_volume(job), inter, gpu.nvlink_gbps * 1e9, gpu.scaleout_gbps * 1e9) / eff
    return job.cal["ep_exposed"] * t_a2a * moe_layers


def launch_overhead_time(job: Job, layers: int) -> float:
    """Host launch/sync time per layer, removed by the CUDA-graph scopes that cover it; eager autograd on cpu."""
    if job.gpu.is_cpu:
        return job.cal["cpu_overhead_per_layer_s"] * layers
    coverage = min(1.0, sum(GRAPH_COVERAGE.get(s, 0.0) for s in job.layout.cuda_graphs))
    return job.cal["launch_overhead_s"] * (1 - coverage) * layers


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
    return job.cal["dp_exposed"] * vol / _bw(job.gpu, job.num_gpus if dpcp > 1 else 1, job.cal)


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
    host = "grace" if gpu.host_link_gbps >= GRACE_HOST_LINK_GBPS else gpu_family(gpu)
    off = _optimizer_shard(job, params) * job.layout.optimizer_offload
    return off * OFFLOAD_HOST_BYTES_PER_PARAM / (gpu.host_link_gbps * 1e9) + off / CPU_ADAM_PARAMS_PER_S[host]


def step_time(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
              cal: dict | None = None) -> dict[str, float]:
    """Seconds per optimizer step, by component (the module docstring's formula); key 'step' is the total.

    Per step: `compute` (= gemm + attention + elementwise) and `recompute` are apart; the components sum to 'step'.
    """
    job = Job(model, gpu, num_gpus, seq_len, layout, cal or calibration())
    m = layout.grad_accum(num_gpus) or 1
    rank = slowest_rank_compute(job)
    layers = sum(1 for u in rank.units if u.is_layer)
    tp = tp_comm_time(job, layers)
    cp = cp_comm_time(job, rank)
    ep = ep_comm_time(job, _moe_layers(model, rank.units))
    launch = launch_overhead_time(job, layers)
    pp = pp_comm_time(job)
    per_mb = rank.total + tp + cp + ep + launch + pp  # rank.total: compute + recompute
    bubble = pipeline_bubble_time(layout, per_mb, m)
    params = rank_params(model, layout, rank.units)
    dp = dp_comm_time(job, params)
    optimizer = optimizer_time(job, params)
    offload = optimizer_offload_time(job, params)
    return {
        "compute": (rank.total - rank.recompute) * m,
        "gemm": rank.gemm * m,
        "attention": rank.attention * m,
        "elementwise": rank.elementwise * m,
        "recompute": rank.recompute * m,
        "tp_comm": tp * m,
        "cp_comm": cp * m,
        "ep_comm": ep * m,
        "pp_comm": pp * m,
        "launch_overhead": launch * m,
        "pipeline_bubble": bubble,
        "dp_comm": dp,
        "optimizer": optimizer,
        "optimizer_offload": offload,
        "step": per_mb * m + bubble + dp + optimizer + offload,
    }


def recompute_flops_per_step(model: ModelSpec, seq_len: int, layout: Layout) -> float:
    """Extra FLOPs the recompute choice adds over a whole step (for hardware-FLOP figures)."""
    units = model_units(model.num_layers, model.mtp_layers)
    return sum(_unit_flops(model, seq_len, u, layout).recompute for u in units) * seq_len * layout.gbs
