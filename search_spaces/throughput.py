"""Throughput model: step time of the most loaded pipeline rank, with a breakdown.

compute     = GEMM FLOPs (Bridge accounting + recompute) / (peak(precision) x GEMM efficiency x shape factor)
              (shape factor: the GEMM's operand traffic over HBM at its m x k x n -- small experts, few tokens
              per expert and narrow TP slices lose more; grouped expert GEMMs have their own efficiency)
            + core-attention FLOPs / (BF16 peak x attention efficiency)   # flash attention runs in bf16
            + element-wise passes over the activations / HBM bandwidth
            + passes over the routed token copies (permute, activation, un-permute) / HBM bandwidth
            + fp8 only: casting every GEMM input to fp8 (and its transposed copy) / HBM bandwidth
            Blackwell Ultra (B300, GB300) runs these at a measured `sustained_rate` over B200/GB200
tp_comm     = sequence-parallel all-gather/reduce-scatter, 8 per layer per microbatch, partly overlapped
cp_comm     = ring p2p of K/V (3(CP-1) chunk transfers per layer) overlapped with the layer's attention,
              or all-gather / all-to-all per cp_comm_type
ep_comm     = dispatch + combine all-to-all, fwd and bwd, split into NVLink-domain and scale-out traffic
pp_comm     = activations sent between stages; bubble = (PP-1)/(VPP*m) of the compute
dp_comm     = gradient reduce-scatter + parameter all-gather over DP*CP (dense) and EDP (experts), overlapped
optimizer   = Adam step over the local shard (HBM bound) + offloaded share over the host link and CPU Adam
launch      = host launch overhead per layer per microbatch, removed by the CUDA graph scopes that cover it
The few efficiency constants are fitted on ../shared/reference (search_spaces/calibration.json, CALIBRATION.md).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from search_spaces.flops import _attention_core_per_token, _attention_proj_per_token, padded_vocab_size
from search_spaces.hardware import GPUSpec
from search_spaces.layout import Layout
from search_spaces.memory import act_bytes, chunk_activations, rank_params, weight_bytes
from search_spaces.models import ModelSpec
from search_spaces.pipeline import EMBEDDING, LOSS, Unit, model_units, placement

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
    "comm_efficiency": 0.7,  # achieved / datasheet bandwidth
    "dispatcher_efficiency": {"alltoall": 0.6, "allgather": 0.6, "deepep": 0.85, "hybridep": 0.9},
}
GRAPH_COVERAGE = {"attn": 0.35, "mlp": 0.3, "moe": 0.4, "moe_router": 0.1, "moe_preprocess": 0.1,
                  "full_iteration": 1.0}
CPU_OVERHEAD_PER_LAYER_S = 0.01  # per microbatch, fwd+bwd: tiny-moe steps measured 0.2-1.3 s on 2 shared cores
CPU_ADAM_PARAMS_PER_S = {"hopper": 0.6e9, "blackwell": 1.0e9, "grace": 2.5e9, "cpu": 0.2e9}


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


CALIBRATION_ALIASES = {"h200": "h100"}


def sustained_factor(gpu: GPUSpec, cal: dict) -> float:
    """Blackwell Ultra (B300, GB300) runs faster than its datasheet twin at the same dense peak: a higher power
    limit keeps the tensor cores at higher clocks, and its doubled SFU rate speeds up softmax. Measured on the
    reference rows that ran the same layout and release on both chips (see CALIBRATION.md)."""
    return cal["sustained_rate"].get(gpu.name, 1.0)


def gemm_rate(gpu: GPUSpec, precision: str, cal: dict) -> float:
    table = cal["gemm_efficiency"]
    per = table.get(CALIBRATION_ALIASES.get(gpu.name, gpu.name)) or table[gpu_family(gpu)]
    eff = per.get(precision_class(precision), 0.5)
    return gpu.peak(precision) * 1e12 * eff * sustained_factor(gpu, cal)


def attention_rate(gpu: GPUSpec, precision: str, cal: dict) -> float:
    base = "fp32" if precision == "fp32" else "bf16"
    return gpu.peak(base) * 1e12 * cal["attention_efficiency"][gpu_family(gpu)] * sustained_factor(gpu, cal)


def _bw(gpu: GPUSpec, span: int, cal: dict) -> float:
    """Bytes/s per GPU for a group of `span` consecutive ranks: NVLink inside a domain, else scale-out."""
    gbps = gpu.nvlink_gbps if span <= gpu.nvlink_domain else gpu.scaleout_gbps
    return gbps * 1e9 * cal["comm_efficiency"]


def _shape_factor(m: float, k: float, n: float, precision: str, rate: float, hbm: float, cpu: bool) -> float:
    """Share of the GEMM rate left once the operand traffic is added: 1 / (1 + rate / (HBM x intensity)).

    Intensity = 2mkn / (bytes x (mk + kn + mn)): small experts (Qwen3-30B's 768-wide FFN), few tokens per expert
    or a narrow TP slice make a GEMM memory-bound; big square GEMMs lose a few per cent.
    """
    if cpu or min(m, k, n) <= 0:
        return 1.0
    b = 4 if precision == "fp32" else (1 if precision_class(precision) == "fp8" else 2)
    intensity = 2 * m * k * n / (b * (m * k + k * n + m * n))
    return 1.0 / (1.0 + rate / (hbm * intensity))


def _gemm_input_width(model: ModelSpec, units) -> float:
    """Sum over the rank's layers of the widths of every GEMM input per token (what fp8 casts)."""
    h = model.hidden_size
    total = 0.0
    for u in units:
        if not u.is_layer:
            continue
        idx = u.layer
        q = model.num_attention_heads * (model.value_head_dim if model.is_mla else model.head_dim)
        total += h + q  # QKV projection and output projection inputs
        if model.layer_is_moe(idx):
            total += model.topk * (h + model.moe_ffn_hidden_size)
            if model.shared_expert_ffn_hidden_size:
                total += h + model.shared_expert_ffn_hidden_size
        else:
            total += h + model.ffn_hidden_size
    return total


def _unit_flops(model: ModelSpec, seq_len: int, unit: Unit, layout: Layout) -> tuple[float, float, float, float]:
    """Per-token forward+backward FLOPs of one pipeline unit: (dense GEMM, expert GEMM, core attention, recompute)."""
    h = model.hidden_size
    glu = 3 if model.gated_mlp else 2
    if unit == EMBEDDING:
        return 0.0, 0.0, 0.0, 0.0
    if unit == LOSS:
        return 6.0 * h * padded_vocab_size(model.vocab_size) * (1 + model.mtp_layers), 0.0, 0.0, 0.0
    idx = unit.layer
    kind = model.attention_kind(idx)
    proj = 6.0 * _attention_proj_per_token(model, kind)
    core = 6.0 * _attention_core_per_token(model, kind, seq_len)
    if model.layer_is_moe(idx):
        expert = 6.0 * h * model.moe_ffn_hidden_size * model.topk * glu
        mlp = 6.0 * h * model.shared_expert_ffn_hidden_size * glu
    else:
        expert, mlp = 0.0, 6.0 * h * model.ffn_hidden_size * glu
    if unit.is_mtp:
        mlp += 6.0 * (3 * h + 2 * h * h)
    # recompute repeats (part of) the forward: one third of the fwd+bwd count
    rc = 0.0
    if layout.recompute_granularity == "full":
        rc = (proj + core + expert + mlp) / 3
    elif layout.recompute_granularity == "selective":
        mods = set(layout.recompute_modules)
        if "core_attn" in mods:
            rc += core / 3
        if "mla_up_proj" in mods and model.is_mla:
            n = model.num_attention_heads
            rc += 2.0 * (model.q_lora_rank * n * model.q_head_dim
                         + model.kv_lora_rank * n * (model.qk_nope_head_dim + model.v_head_dim))
        if "mlp" in mods and not model.layer_is_moe(idx):
            rc += mlp / 3
        if "moe" in mods and model.layer_is_moe(idx):
            rc += expert / 3
        if "shared_experts" in mods and model.layer_is_moe(idx):
            rc += mlp / 3
    return proj + mlp, expert, core, rc


def step_time(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout,
              cal: dict | None = None) -> dict[str, float]:
    """Seconds per optimizer step, by component; key 'step' is the total."""
    cal = cal or calibration()
    L = layout
    place = placement(model, L.pp, L.vpp)
    assert place is not None
    m = L.grad_accum(num_gpus) or 1
    dp = max(L.dp(num_gpus), 1)
    edp = max(L.edp(num_gpus), 1)
    tokens_mb = L.mbs * seq_len  # tokens of one microbatch (whole sequence)
    stage_gpus = L.tp * L.cp  # GPUs sharing one microbatch's dense work
    hbm = gpu.hbm_tbps * 1e12
    fam = gpu_family(gpu)
    e = act_bytes(L)
    h = model.hidden_size
    peak_rate = gemm_rate(gpu, L.precision, cal)
    a_rate = attention_rate(gpu, L.precision, cal)
    # GEMM shapes: dense GEMMs see this rank's tokens of the microbatch (after the SP all-gather) and a
    # TP-split width; each local expert sees its share of the tokens of all EP ranks
    t_rank = L.mbs * seq_len / L.cp
    n_dense = (model.ffn_hidden_size if not model.is_moe else
               model.num_attention_heads * (model.q_head_dim if model.is_mla else model.head_dim)) / L.tp
    g_rate = peak_rate * _shape_factor(t_rank, h, n_dense, L.precision, peak_rate, hbm, gpu.is_cpu)
    grouped = 1.0
    if model.is_moe:
        m_expert = t_rank / (L.tp if L.sp else 1) * L.ep * model.topk / model.num_experts
        grouped = cal["grouped_gemm_efficiency"][fam] * _shape_factor(
            m_expert, h, model.moe_ffn_hidden_size / L.etp, L.precision, peak_rate, hbm, gpu.is_cpu) \
            / _shape_factor(t_rank, h, n_dense, L.precision, peak_rate, hbm, gpu.is_cpu)

    # ---- compute per microbatch on each pipeline rank; the slowest rank sets the pace
    plain = L.replace(recompute="none")
    worst = None
    # the first rank (embedding, most in flight), the last (output head) and a middle one decide the pace
    for rank in range(L.pp) if L.pp <= 4 else sorted({0, 1, L.pp // 2, L.pp - 2, L.pp - 1}):
        units = place.rank_units(rank)
        dense = expert = core = rc = 0.0
        layers = 0
        for u in units:
            d_, x_, c_, r_ = _unit_flops(model, seq_len, u, L)
            dense, expert, core, rc = dense + d_, expert + x_, core + c_, rc + r_
            layers += u.is_layer
        per_gpu = tokens_mb / stage_gpus
        t_gemm = per_gpu * (dense + rc) / g_rate + per_gpu * expert / (g_rate * grouped)
        t_attn = per_gpu * core / a_rate
        acts = sum(chunk_activations(model, plain, seq_len, c, gpu.is_cpu)
                   for c in place.rank_stages(rank))
        t_elem = cal["elementwise_passes"] * acts / hbm
        n_moe = sum(1 for u in units if u.is_layer and model.layer_is_moe(u.layer))
        if n_moe and not gpu.is_cpu:
            # every routed copy of a token is permuted, scattered, put through the activation and the
            # probability scaling and un-permuted (fwd and bwd): passes over topk x (hidden + intermediate)
            glu = 2 if model.gated_mlp else 1
            routed = model.topk * (2 * h + (glu + 1) * model.moe_ffn_hidden_size / L.etp)
            t_elem += cal["routed_passes"] * n_moe * per_gpu * routed * e / hbm
        if precision_class(L.precision) == "fp8" and not gpu.is_cpu:
            # every GEMM input (activation fwd, output gradient bwd) is cast to fp8 first: read 2 B, write 1 B,
            # plus a column-wise (transposed) copy for the weight gradient
            t_elem += per_gpu * _gemm_input_width(model, units) * 2 * cal["fp8_cast_bytes"] / hbm
        total = t_gemm + t_attn + t_elem
        if worst is None or total > worst["compute_mb"]:
            worst = {"compute_mb": total, "gemm": t_gemm, "attention": t_attn, "elementwise": t_elem,
                     "layers": layers, "units": units, "rank": rank}
    assert worst is not None
    layers = worst["layers"]
    units = worst["units"]
    moe_layers = sum(1 for u in units if u.is_layer and model.layer_is_moe(u.layer))
    attn_layers = [u for u in units if u.is_layer and model.attention_kind(u.layer) != "linear"]

    t_local = tokens_mb / L.cp
    # ---- tensor parallel (sequence parallel AG/RS), per microbatch
    tp_comm = 0.0
    if L.tp > 1:
        vol = 8 * layers * t_local * h * e * (L.tp - 1) / L.tp
        tp_comm = cal["tp_exposed"] * vol / _bw(gpu, L.tp, cal)
    # ---- context parallel, per microbatch
    cp_comm = 0.0
    if L.cp > 1 and attn_layers:  # softmax attention layers
        if model.is_mla:
            kv_width = model.num_attention_heads * (model.q_head_dim + model.v_head_dim)
        else:
            kv_width = 2 * model.num_kv_heads * model.head_dim
        chunk = t_local * kv_width * e / L.tp  # this rank's K and V for one layer
        q_width = model.num_attention_heads * (model.q_head_dim if model.is_mla else model.head_dim)
        attn_per_layer = worst["attention"] / max(len(attn_layers), 1)
        # CP ranks are strided by TP: the group spans TP*CP consecutive GPUs
        inside = max(1, min(L.cp, gpu.nvlink_domain // L.tp))  # CP ranks per NVLink domain
        nv_bw, so_bw = _bw(gpu, 1, cal), _bw(gpu, gpu.nvlink_domain + 1, cal)
        ring_bw = nv_bw if inside >= L.cp else so_bw
        if L.cp_comm_type == "p2p":
            # ring: CP-1 K/V chunks forward, K/V and dK/dV backward; each step overlaps one attention block
            exposed = max(0.0, 3 * (L.cp - 1) * chunk / ring_bw - 0.9 * attn_per_layer) + 3 * (L.cp - 1) * 2e-5
        elif L.cp_comm_type == "allgather":
            exposed = max(0.0, 3 * (L.cp - 1) * chunk / ring_bw - 0.5 * attn_per_layer)
        elif L.cp_comm_type == "a2a":
            # q, k, v and the output re-sharded from sequence to heads, fwd and bwd; not overlapped
            vol = 2 * t_local * (2 * q_width + kv_width) * e / L.tp * (L.cp - 1) / L.cp
            inter = max(0.0, 1.0 - inside / L.cp)
            exposed = vol * ((1 - inter) / nv_bw + inter / so_bw)
        else:  # a2a+p2p: a2a inside the NVLink domain, a ring of the remaining CP/inside groups across it
            outer = max(1, L.cp // inside)
            vol = 2 * t_local * (2 * q_width + kv_width) * e / L.tp * (inside - 1) / inside
            ring = 3 * (outer - 1) * chunk / so_bw
            exposed = vol / nv_bw + max(0.0, ring - 0.9 * attn_per_layer) + 3 * (outer - 1) * 2e-5
        cp_comm = exposed * len(attn_layers)
    linear_layers = sum(1 for u in units if u.is_layer and model.attention_kind(u.layer) == "linear")
    if L.cp > 1 and linear_layers:
        # gated delta-net is sequential along the sequence: under CP its inputs are re-sharded from sequence to
        # heads and back with all-to-alls (q, k, v, gates in; output out), fwd and bwd, not overlapped
        qk = model.linear_key_head_dim * model.linear_num_key_heads
        v = model.linear_value_head_dim * model.linear_num_value_heads
        inside = max(1, min(L.cp, gpu.nvlink_domain // L.tp))
        inter = max(0.0, 1.0 - inside / L.cp)
        vol = 2 * t_local * (2 * qk + 2 * v + 2 * model.linear_num_value_heads) * e / L.tp * (L.cp - 1) / L.cp
        cp_comm += linear_layers * vol * ((1 - inter) / _bw(gpu, 1, cal) + inter / _bw(gpu, gpu.nvlink_domain + 1, cal))
    # ---- expert parallel all-to-all, per microbatch
    ep_comm = 0.0
    if model.is_moe and L.ep > 1 and moe_layers:
        tsp = t_local / L.tp if L.sp else t_local
        fp8_dispatch = precision_class(L.precision) == "fp8" and L.dispatcher in ("deepep", "hybridep")
        per_dir = tsp * model.topk * h * (L.ep - 1) / L.ep
        vol = 2 * per_dir * ((1 if fp8_dispatch else e) + e)  # dispatch + combine, fwd and bwd
        span = L.ep * L.etp * L.tp  # EP ranks are strided by TP-sized blocks in the folded grid
        inter = max(0.0, 1.0 - gpu.nvlink_domain / span)
        eff = cal["dispatcher_efficiency"][L.dispatcher] if not gpu.is_cpu else 0.5
        if L.dispatcher == "allgather":
            vol = 2 * tsp * h * e * (L.ep - 1) * 2
        t_a2a = vol * ((1 - inter) / (gpu.nvlink_gbps * 1e9) + inter / (gpu.scaleout_gbps * 1e9)) / eff
        ep_comm = cal["ep_exposed"] * t_a2a * moe_layers
    # ---- launch overhead, hidden by CUDA graphs
    coverage = min(1.0, sum(GRAPH_COVERAGE.get(s, 0.0) for s in L.cuda_graphs))
    # on cpu the eager PyTorch/autograd overhead per layer dominates a tiny model (no graphs there)
    launch = CPU_OVERHEAD_PER_LAYER_S if gpu.is_cpu else cal["launch_overhead_s"] * (1 - coverage)
    launch *= layers
    # ---- pipeline
    pp_comm = 0.0
    if L.pp > 1:
        act = t_local * h * e / (L.tp if L.sp else 1)
        pp_comm = 0.5 * 2 * L.vpp * act / _bw(gpu, L.pp * L.tp * L.cp * dp, cal)
    per_mb = worst["compute_mb"] + tp_comm + cp_comm + ep_comm + launch + pp_comm
    bubble = per_mb * (L.pp - 1) / (L.vpp * m) if L.pp > 1 else 0.0
    # ---- data parallel gradient reduce + parameter gather
    params = rank_params(model, L, units)
    dpcp = dp * L.cp
    grad_b = 4 if L.precision == "fp32" else 2
    dp_vol = params.dense * (grad_b + weight_bytes(L)) * (dpcp - 1) / dpcp \
        + params.expert * (grad_b + weight_bytes(L)) * (edp - 1) / edp
    dp_comm = cal["dp_exposed"] * dp_vol / _bw(gpu, num_gpus if dpcp > 1 else 1, cal) if (dpcp > 1 or edp > 1) else 0.0
    # ---- optimizer step
    shard = params.dense / dpcp + params.expert / edp if L.distributed_optimizer else params.dense + params.expert
    on_gpu = shard * (1 - L.optimizer_offload)
    optimizer = on_gpu * 36 / hbm  # read grad, param, 2 states, master; write them back
    offload = 0.0
    if L.optimizer_offload > 0:
        host = "grace" if gpu.host_link_gbps >= 400 else fam
        off = shard * L.optimizer_offload
        offload = off * 6 / (gpu.host_link_gbps * 1e9) + off / CPU_ADAM_PARAMS_PER_S[host]
    out = {
        "compute": worst["compute_mb"] * m,
        "gemm": worst["gemm"] * m,
        "attention": worst["attention"] * m,
        "elementwise": worst["elementwise"] * m,
        "tp_comm": tp_comm * m,
        "cp_comm": cp_comm * m,
        "ep_comm": ep_comm * m,
        "pp_comm": pp_comm * m,
        "launch_overhead": launch * m,
        "pipeline_bubble": bubble,
        "dp_comm": dp_comm,
        "optimizer": optimizer,
        "optimizer_offload": offload,
    }
    out["step"] = per_mb * m + bubble + dp_comm + optimizer + offload
    return out


def recompute_flops_per_step(model: ModelSpec, seq_len: int, layout: Layout) -> float:
    """Extra FLOPs the recompute choice adds over a whole step (for hardware-FLOP figures)."""
    units = model_units(model.num_layers, model.mtp_layers)
    return sum(_unit_flops(model, seq_len, u, layout)[3] for u in units) * seq_len * layout.gbs
