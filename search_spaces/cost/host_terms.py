"""The CPU host's own step-time terms: ranks are processes on one machine, talking over gloo (trainers/ runs
Megatron-Core there), sharing the host's cores.

- attention and GEMMs at their calibrated rates, with no kernel-length, head-width or GEMM-shape factors (PyTorch's
  CPU kernels; bench/cpu_calibration.py fits the rates);
- element-wise work: passes over the activations the CPU trainer's own layers save (memory.py's cpu terms);
  no routed-copy passes, no fp8;
- gloo's all-to-all whatever the dispatcher (CPU_DISPATCHER_EFFICIENCY);
- eager PyTorch/autograd overhead per layer, and the fixed cost of every gloo exchange (`cpu_collectives`);
- host contention: ranks beyond the host's cores wait for one (`host_slowdown`).
"""

from __future__ import annotations

from search_spaces.cost.flops import linear_attention_core_per_token
from search_spaces.cost.launch_overhead import LayerBusy
from search_spaces.cost.packing import statistics_for
from search_spaces.cost.pipeline import Unit
from search_spaces.cost.step_job import (
    FWD_BWD_FLOPS_PER_MAC,
    SP_COLLECTIVES_PER_LAYER,
    Job,
    RankCompute,
    activation_passes_time,
    attention_peak,
    moe_layers,
    split_traffic_time,
)

# gloo collectives a cpu trainer rank makes per microbatch (trainers/: Megatron-Core on gloo), forward + backward
# (forward alone): sequence-parallel all-gather / reduce-scatter, SP_COLLECTIVES_PER_LAYER (4 forward) per layer;
# CP's all-gathers of K and V and the reduce-scatters of their gradients (trainers/cp_attention.py), 4 (2); the
# alltoall dispatcher's token-count exchange, dispatch and combine forward and their mirrors backward, 5 (3);
# per virtual stage a send forward and one backward; per step the DP gradient reduce and parameter gather.
# gloo runs a collective over n ranks as n-1 pairwise exchanges: each costs cpu_collective_latency_s. A
# recomputed forward repeats its collectives.
CPU_CP_COLLECTIVES_PER_LAYER = (4, 2)
CPU_EP_COLLECTIVES_PER_MOE_LAYER = (5, 3)
CPU_SP_FORWARD_COLLECTIVES_PER_LAYER = 4
CPU_PP_COLLECTIVES_PER_STAGE = 2
CPU_DP_COLLECTIVES_PER_STEP = 2
# gloo's all-to-all between processes on one host, whatever the dispatcher (assumed; no fused kernels on cpu)
CPU_DISPATCHER_EFFICIENCY = 0.5
# packed documents (THD) on the CPU trainer, seconds per document of a microbatch per softmax-attention layer:
# eager host work per document (Megatron's THD RoPE splits the pack by document; the CPU attention lays out each
# document's tokens to build its mask), a fixed part and a part per CP rank whose tokens are laid out. Derived
# from two packed-vs-unpacked pairs of bench/cpu_calibration.py (DP4 and CP2, 4 ranks on 2 cores), the other
# packed layouts held out; GPUs run fused THD kernels (no such term).
CPU_PACKED_DOCUMENT_S = (1.1e-3, 1.0e-3)


def cpu_collectives(job: Job, layers: int, softmax_layers: int, moe: int) -> int:
    """Pairwise gloo exchanges a cpu rank makes per microbatch: each collective over n ranks counts n-1 (the
    CPU_*_COLLECTIVES constants), forward collectives twice where recompute repeats them."""
    L = job.layout
    full = L.recompute_granularity == "full"
    again_attention = full or "core_attn" in L.recompute_modules
    again_moe = full or "moe" in L.recompute_modules
    sp = SP_COLLECTIVES_PER_LAYER + (CPU_SP_FORWARD_COLLECTIVES_PER_LAYER if full else 0)
    cp = CPU_CP_COLLECTIVES_PER_LAYER[0] + (CPU_CP_COLLECTIVES_PER_LAYER[1] if again_attention else 0)
    ep = CPU_EP_COLLECTIVES_PER_MOE_LAYER[0] + (CPU_EP_COLLECTIVES_PER_MOE_LAYER[1] if again_moe else 0)
    n = sp * layers * (L.tp - 1) + cp * softmax_layers * (L.cp - 1) + ep * moe * (L.ep - 1)
    return n + (CPU_PP_COLLECTIVES_PER_STAGE * L.vpp if L.pp > 1 else 0)


def host_slowdown(ranks: int, cores: float) -> float:
    """Ranks sharing a host's cores each take max(1, ranks / cores) times as long."""
    return max(1.0, ranks / cores)


class GlooHostTerms:
    """The step-time terms of the CPU host (StepTimeTerms for the cpu family)."""
    families: tuple[str, ...] = ("cpu",)

    def attention_rates(self, job: Job, dims: tuple[int, int], length: float) -> tuple[float, float]:
        """The unfused attention's calibrated rates, whatever the length and head widths."""
        scale = attention_peak(job)
        family = job.gpu.family
        return scale * job.cal.attention_fwd_efficiency[family], scale * job.cal.attention_bwd_efficiency[family]

    def gemm_shape_factor(self, job: Job, m: float, k: float, n: float, rate: float) -> float:
        """The fitted CPU rate holds at every shape of the tiny models it runs."""
        return 1.0

    def elementwise_time(self, job: Job, rank: int, units: tuple[Unit, ...], per_gpu: float) -> float:
        """Passes over the activations the CPU trainer's layers save."""
        return activation_passes_time(job, rank, cpu_trainer=True, passes=job.cal.cpu_elementwise_passes)

    def linear_attention_layer_time(self, job: Job, rate: float) -> tuple[float, float]:
        """The CPU trainer's reference kernels: Bridge's count of the convolution and state update at the fitted
        rate (bench/cpu_calibration.py); their recompute is counted with the layer's."""
        L = job.layout
        flops = FWD_BWD_FLOPS_PER_MAC * linear_attention_core_per_token(job.model, "linear") * job.tokens_mb \
            / (L.tp * L.cp)
        return flops / rate, 0.0

    def recomputed_elementwise_time(self, job: Job, elementwise: float, share: float) -> float:
        """The fitted per-layer overhead holds what the CPU trainer's recompute repeats: none apart."""
        return 0.0

    def ep_alltoall_time(self, job: Job, volume: float, scaleout_share: float) -> float:
        """gloo's all-to-all whatever the dispatcher (CPU_DISPATCHER_EFFICIENCY of the "links"), `cpu_ep_exposed`
        of it not hidden."""
        gpu = job.gpu
        t = split_traffic_time(volume, scaleout_share, gpu.nvlink_gbps * 1e9, gpu.scaleout_gbps * 1e9)
        return job.cal.cpu_ep_exposed * t / CPU_DISPATCHER_EFFICIENCY

    def dispatcher_overhead_time(self, job: Job, moe: int, ep_time: float) -> float:
        """gloo's fixed costs are in `launch_overhead_time` (cpu_collectives): none apart."""
        return 0.0

    def launch_overhead_time(self, job: Job, units: tuple[Unit, ...], busy: LayerBusy) -> float:
        """Eager autograd per layer and the fixed cost of each gloo exchange."""
        layers = sum(1 for u in units if u.is_layer)
        softmax = sum(1 for u in units if u.is_layer and job.model.attention_kind(u.layer) != "linear")
        n = cpu_collectives(job, layers, softmax, moe_layers(job.model, units))
        return (job.cal.cpu_overhead_per_layer_s * layers + job.cal.cpu_collective_latency_s * n
                + _packed_documents_time(job, softmax))

    def dp_latency(self, job: Job, ranks: int) -> float:
        """The DP gradient reduce and parameter gather, each ranks-1 gloo exchanges."""
        return job.cal.cpu_collective_latency_s * CPU_DP_COLLECTIVES_PER_STEP * (ranks - 1)

    def host_contention_time(self, job: Job, rank: RankCompute) -> float:
        """The run's ranks share the host's `cpu_cores`: with more ranks than cores each rank's own work (compute and
        eager overhead) takes host_slowdown times as long."""
        slowdown = host_slowdown(job.num_gpus, job.cal.cpu_cores)
        layers = sum(1 for u in rank.units if u.is_layer)
        return (slowdown - 1.0) * (rank.total + job.cal.cpu_overhead_per_layer_s * layers)


def _packed_documents_time(job: Job, softmax_layers: int) -> float:
    """CPU_PACKED_DOCUMENT_S for the documents of a microbatch (0 for full-length sequences)."""
    if job.packing is None:
        return 0.0
    L = job.layout
    documents = statistics_for(job.packing, job.seq_len, L.cp, L.tp, L.sp).documents_per_sequence * L.mbs
    fixed, per_cp_rank = CPU_PACKED_DOCUMENT_S
    return documents * softmax_layers * (fixed + per_cp_rank * L.cp)


HOST_TERMS = GlooHostTerms()
