"""The MoE dispatcher's all-to-all: bandwidth and latency per backend and domain size, the SMs it takes from
compute, and the extra token copies NCCL's path makes.

Sources:
- NCCL all-to-all (Megatron-Core's `alltoall` dispatcher): "requires one global and one local permute before and
  after EP communication" -- the global permute copies every routed token topk times (NVIDIA/Megatron-LM
  docs/discussions/deepseek-v3-gb200-optimization @1d9edcf8, 2.1.1); its achieved share of a link is the
  calibration's `dispatcher_efficiency` (fitted elsewhere: 0.6).
- DeepEP: on an NVL72 rack with EP32 (the community multi-node-NVLink path), "dispatch can only reach about
  400 GB/s and the combine about 190 GB/s algorithm bandwidth with 24 SMs ... a large gap from the unidirectional
  bandwidth of 900 GB/s" (the same blog, 2.2.1): 258 GB/s for equal dispatch and combine bytes, 10.7 GB/s per SM;
  inside an 8-GPU node and over RDMA its kernels run near the link (deepseek-ai/DeepEP README: intranode
  153-158 GB/s of H800's ~160 GB/s NVLink, internode 43-58 GB/s of a 50 GB/s NIC: RDMA at DEEPEP_RDMA_SHARE); on
  the 2-6x faster NVLink of H100/B200 nodes its 20 default SMs (`moe-deepep-num-sms`, Megatron-Bridge's
  dispatcher-selection card) are assumed to reach DEEPEP_NVLINK_SHARE of the link.
- HybridEP: TMA copies inside the NVLink domain and IBGDA across it, "higher bandwidth with fewer SMs, and fully
  supporting MNNVL" (the blog, 2.5); 16 SMs by default (`moe-hybridep-num-sms`, the same card); its reach of the
  link is assumed at HYBRIDEP_LINK_SHARE.
- Latency: each dispatch or combine is a collective with a fixed setup cost (a handshake, a notify/layout phase
  for DeepEP); assumed per call below, 4 calls per MoE layer and microbatch (dispatch and combine, fwd and bwd).
- SMs: the dispatcher's kernels occupy their SMs while the all-to-all overlaps compute, which then runs on the
  rest: charged on the overlapped share of the all-to-all time.
Pure functions of (model, GPU, layout) returning bandwidth shares, seconds or bytes.
"""

from __future__ import annotations

from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.layouts.layout import Layout

DISPATCHER_SMS = {"deepep": 20, "hybridep": 16}
# NCCL's all-to-all kernels hold their channels' SMs too (a channel per SM; ~8 channels for an all-to-all
# within a node; assumed)
NCCL_ALLTOALL_SMS = 8
# DeepEP's per-SM rate on the multi-node-NVLink path: (2 / (1/400 + 1/190) GB/s) / 24 SMs (the blog, 2.2.1)
DEEPEP_GBPS_PER_SM = 2 / (1 / 400 + 1 / 190) / 24
DEEPEP_RDMA_SHARE = 0.9  # over RDMA: 43-58 GB/s of a 50 GB/s NIC (DeepEP README)
DEEPEP_NVLINK_SHARE = 0.7  # inside an 8-GPU node (assumed, see above)
# DeepEP's normal kernels reach 8 NVLink peers; beyond, on an NVL72 rack, only the community MNNVL path exists
DEEPEP_NVLINK_PEERS = 8
HYBRIDEP_LINK_SHARE = 0.8  # assumed: "fully release the performance potential of the NVL72"
# fixed cost of one dispatch or combine call (seconds; assumed): NCCL's all-to-all grows with its peers
ALLTOALL_LATENCY_S = 15e-6
ALLTOALL_LATENCY_PER_PEER_S = 0.5e-6
FLEX_LATENCY_S = {"deepep": 25e-6, "hybridep": 15e-6}
CALLS_PER_MOE_LAYER = 4
# HBM passes (read + write) over the routed token copies the NCCL path adds: the global permute before the
# dispatch and the un-permute after the combine, forward and backward
GLOBAL_PERMUTE_PASSES = 2 * 2 * 2


def ep_span(layout: Layout) -> int:
    """Consecutive ranks one EP group spans: Megatron's expert grid is ETP-EP-EDP-PP (no TP, no CP in it)."""
    return layout.ep * layout.etp


def distinct_destinations(peers: int, topk: int) -> float:
    """Expected distinct destinations, of `peers` equally loaded ones, that a token's top-k expert choices touch:
    peers * (1 - (1 - 1/peers)^k) (each choice independent; the balanced routing the benchmarks force)."""
    if peers <= 1:
        return float(peers)
    return peers * (1 - (1 - 1 / peers) ** topk)


def flex_token_copies(ep: int, domains: int, topk: int) -> tuple[float, float]:
    """(copies over NVLink, copies over the scale-out link) of one token that DeepEP/HybridEP send per dispatch:
    one per distinct other EP rank its experts sit on ("tokens are deduplicated ... sent to each rank once", the
    DeepEP README; HybridEP alike), and across NVLink domains one per distinct other domain, forwarded inside it
    over NVLink (DeepEP's internode kernels: RDMA to the same-index GPU of the node, then NVLink). Megatron's
    NCCL path sends every (token, expert) copy instead (`alltoall_token_copies`)."""
    ranks = distinct_destinations(ep, topk) * (ep - 1) / ep
    remote_domains = distinct_destinations(domains, topk) * (domains - 1) / domains if domains > 1 else 0.0
    return ranks, remote_domains


def alltoall_token_copies(ep: int, topk: int, scaleout_share: float) -> tuple[float, float]:
    """(copies over NVLink, copies over the scale-out link) of one token on the NCCL all-to-all path: each of its
    top-k (token, expert) copies that leaves the rank, a `scaleout_share` of them across NVLink domains."""
    leaving = topk * (ep - 1) / ep
    return leaving * (1 - scaleout_share), leaving * scaleout_share


def link_efficiency(gpu: GPUSpec, dispatcher: str, span: int, nccl_efficiency: float) -> tuple[float, float]:
    """(NVLink share, scale-out share) of the link bandwidth this dispatcher's all-to-all reaches over `span`
    consecutive EP ranks."""
    if dispatcher == "deepep":
        if span > DEEPEP_NVLINK_PEERS and gpu.nvlink_domain > DEEPEP_NVLINK_PEERS:  # the MNNVL path: SM-bound
            return DISPATCHER_SMS["deepep"] * DEEPEP_GBPS_PER_SM / gpu.nvlink_gbps, DEEPEP_RDMA_SHARE
        return DEEPEP_NVLINK_SHARE, DEEPEP_RDMA_SHARE
    if dispatcher == "hybridep":
        return HYBRIDEP_LINK_SHARE, DEEPEP_RDMA_SHARE
    return nccl_efficiency, nccl_efficiency


def latency_time(layout: Layout, moe_layers: int) -> float:
    """Fixed cost of the dispatch and combine calls of the rank's MoE layers per microbatch."""
    if layout.ep <= 1 or not moe_layers:
        return 0.0
    per_call = FLEX_LATENCY_S.get(layout.dispatcher, ALLTOALL_LATENCY_S + ALLTOALL_LATENCY_PER_PEER_S * layout.ep)
    return CALLS_PER_MOE_LAYER * per_call * moe_layers


def global_permute_bytes(model: ModelSpec, layout: Layout, tokens_sp: float, act_bytes: int) -> float:
    """HBM bytes of the NCCL path's global permute per MoE layer and microbatch (0 for the flex dispatchers,
    which fuse it into the communication kernel)."""
    if layout.dispatcher not in ("alltoall", "allgather") or layout.ep <= 1:
        return 0.0
    return GLOBAL_PERMUTE_PASSES * tokens_sp * model.topk * model.hidden_size * act_bytes


def sm_share(gpu: GPUSpec, dispatcher: str) -> float:
    """Share of the GPU's SMs the dispatcher's kernels hold while they run."""
    return DISPATCHER_SMS.get(dispatcher, NCCL_ALLTOALL_SMS) / gpu.sms


def recompute_repeats_dispatch(layout: Layout) -> bool:
    """Whole-MoE and full recompute run the layer's forward again, dispatch and combine included
    (Megatron-Bridge's activation-recompute card: "whole moe ... can replay communication during backward")."""
    return layout.recompute_granularity == "full" or "moe" in layout.recompute_modules


__all__ = ["ep_span", "distinct_destinations", "flex_token_copies", "alltoall_token_copies", "link_efficiency",
           "latency_time",
           "global_permute_bytes", "sm_share", "recompute_repeats_dispatch"]
