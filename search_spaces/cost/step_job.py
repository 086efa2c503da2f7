"""One step-time question (`Job`) and the interface a hardware family's cost terms answer it through.

The step-time model (search_spaces/cost/throughput.py) is the same formula on every machine; where an accelerator and
the CPU host (gloo ranks) differ, it asks the job's `StepTimeTerms`: search_spaces/cost/gpu_terms.py for the GPU
families, search_spaces/cost/host_terms.py for the host. throughput.job_for picks them once, by the accelerator's
declared family. This module holds what both sets read: the job, a rank's compute, and a few shared facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.launch_overhead import LayerBusy
from search_spaces.cost.memo import Memo, fields
from search_spaces.cost.memory import ACTIVATION_LEVER_FIELDS, CHUNK_FIELDS, act_bytes, rank_chunk_activations
from search_spaces.cost.packing import LengthHistogram
from search_spaces.cost.pipeline import Placement, Unit, placement
from search_spaces.layouts.layout import Layout

FP8_BYTES = 1
FWD_AND_BWD = 2  # a transfer made in the forward is mirrored by one in the backward
FWD_BWD_FLOPS_PER_MAC = 6.0  # 2 FLOPs per multiply-add x 3 GEMMs (forward, data grad, weight grad): Bridge's count
# sequence parallel: all-gather before and reduce-scatter after attention and MLP in the forward (4 per layer),
# mirrored in the backward (4)
SP_COLLECTIVES_PER_LAYER = 8

# the layout fields memoised terms read (search_spaces/cost/memo.py): the routed load (routing.expert_load at the
# microbatch's tokens per rank) and the activation passes (memory.py's activations without recompute)
EXPERT_LOAD_FIELDS = ("routing", "ep", "etp", "tp", "cp", "mbs", "sequence_parallel", "expert_stash")
PASSES_FIELDS = tuple(f for f in CHUNK_FIELDS if not f.startswith("recompute") and f not in ACTIVATION_LEVER_FIELDS
                      ) + ("pp", "vpp")
_expert_load_fields, passes_key = fields(*EXPERT_LOAD_FIELDS), fields(*PASSES_FIELDS)
_EXPERT_LOAD, _PASSES, _CENSUS = Memo("expert load"), Memo("activation passes"), Memo("unit census")


class RankCompute(NamedTuple):
    """Seconds per microbatch of one pipeline rank's own work."""
    rank: int
    units: tuple[Unit, ...]
    total: float  # everything below: what the pace is set by
    gemm: float  # the model's GEMMs
    recompute: float  # the GEMMs and attention forwards recompute repeats
    attention: float
    elementwise: float
    expert_gemm: float = 0.0  # the routed experts' grouped GEMMs (part of gemm): an MoE layer's post-sync work


class StepTimeTerms(Protocol):
    """The terms of the step in which a hardware family differs from the others. Each method answers for one job;
    everything else in the step is throughput.py's, shared by all families."""
    families: tuple[str, ...]
    """The accelerator families (hardware.FAMILIES) these terms are for."""

    def attention_rates(self, job: Job, dims: tuple[int, int], length: float) -> tuple[float, float]:
        """Achieved FLOP/s of softmax attention, forward and backward, for heads of widths `dims` (d_qk, d_v) and
        a kernel over `length` query tokens."""

    def gemm_shape_factor(self, job: Job, m: float, k: float, n: float, rate: float) -> float:
        """Share of the GEMM rate `rate` left for an m x k x n GEMM."""

    def elementwise_time(self, job: Job, rank: int, units: tuple[Unit, ...], per_gpu: float) -> float:
        """Seconds per microbatch of the rank's element-wise work (norms, casts, permutes ...); `per_gpu`: the
        microbatch's tokens per GPU sharing the dense work."""

    def linear_attention_layer_time(self, job: Job, rate: float) -> tuple[float, float]:
        """(fwd+bwd seconds, of which a recomputed forward) of one gated delta-net layer's kernels per microbatch,
        `rate` the FLOP/s its kernels reach."""

    def recomputed_elementwise_time(self, job: Job, elementwise: float, share: float) -> float:
        """Seconds of element-wise work a recomputed forward repeats, `share` the recomputed GEMM FLOPs over the
        model's (of `elementwise`, the rank's element-wise seconds per microbatch)."""

    def ep_alltoall_time(self, job: Job, volume: float, scaleout_share: float) -> float:
        """Seconds of one MoE layer's dispatch and combine per microbatch that overlap does not hide, for `volume`
        bytes, a share `scaleout_share` of them leaving the NVLink domain."""

    def dispatcher_overhead_time(self, job: Job, moe: int, ep_time: float) -> float:
        """Seconds per microbatch the dispatcher costs beside its all-to-all's bytes (`ep_time`: their exposed
        time over the rank's `moe` MoE layers): fixed costs per call, extra copies, the SMs it holds."""

    def launch_overhead_time(self, job: Job, units: tuple[Unit, ...], busy: LayerBusy) -> float:
        """Seconds per microbatch the rank's layers wait for the host (launches, eager overhead, fixed costs);
        `busy`: one layer's GPU time, what launches can hide behind."""

    def dp_latency(self, job: Job, ranks: int) -> float:
        """Fixed cost per step of the data-parallel collectives over `ranks` ranks (beyond their bytes)."""

    def host_contention_time(self, job: Job, rank: RankCompute) -> float:
        """Seconds per microbatch the rank waits for a share of its host (ranks beyond its cores)."""


@dataclass(frozen=True)
class Job:
    """One step-time question: model, hardware, world size, sequence length, layout, the calibration, and the cost
    terms of the hardware's family (throughput.job_for picks them)."""
    model: ModelSpec
    """The model (its catalog or config.json form, with any overrides)."""
    gpu: GPUSpec
    """The accelerator every rank runs on."""
    num_gpus: int
    """GPUs (ranks) of the run."""
    seq_len: int
    """Tokens per sequence."""
    layout: Layout
    """The parallel layout and features (legal: rules.check)."""
    cal: Calibration
    """The cost model's constants."""
    terms: StepTimeTerms
    """The cost terms of gpu's family."""
    packing: LengthHistogram | None = None
    """The document lengths packed into each sequence (THD, search_spaces/cost/packing.py); None: one document of
    seq_len tokens per sequence."""

    def __post_init__(self) -> None:
        if self.gpu.family not in self.terms.families:
            raise ValueError(f"{type(self.terms).__name__} are the cost terms of {', '.join(self.terms.families)}, "
                             f"not of {self.gpu.name} ({self.gpu.family})")

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
    def expert_load(self) -> float:
        """The busiest EP rank's routed token copies over the balanced share, for the layout's routing
        (memoised on EXPERT_LOAD_FIELDS)."""
        from search_spaces.cost.routing import expert_load

        L, cpu = self.layout, self.gpu.is_cpu
        return _EXPERT_LOAD.get((self.model,), (_expert_load_fields(L), self.seq_len, cpu), lambda: expert_load(
            self.model, L, self.tokens_rank / L.tp if L.sp else self.tokens_rank, cpu))

    @property
    def dp(self) -> int:
        return max(self.layout.dp(self.num_gpus), 1)

    @property
    def edp(self) -> int:
        return max(self.layout.edp(self.num_gpus), 1)


def precision_class(precision: str) -> str:
    return "fp8" if precision.startswith("fp8") or precision == "mxfp8" else precision


def split_traffic_time(volume: float, scaleout_share: float, nvlink_bw: float, scaleout_bw: float) -> float:
    """Seconds of `volume` bytes, a share `scaleout_share` of them over the scale-out link, the rest over NVLink."""
    return volume * ((1 - scaleout_share) / nvlink_bw + scaleout_share / scaleout_bw)


class UnitCensus(NamedTuple):
    """What the step-time terms count over a rank's units (counted once per units object: census())."""
    layers: int
    """Transformer layers (decoder and MTP)."""
    moe: int
    """Of them MoE layers."""
    kinds: tuple[str, ...]
    """Each layer's attention kind, in order."""


def census(model: ModelSpec, units) -> UnitCensus:
    """The census of `units` (a pipeline rank's, Placement.rank_units: one object per rank, so a lookup by
    identity)."""
    return _CENSUS.get_for((model,), units, lambda: UnitCensus(
        sum(1 for u in units if u.is_layer), sum(1 for u in units if u.is_layer and model.layer_is_moe(u.layer)),
        tuple(model.attention_kind(u.layer) for u in units if u.is_layer)))


def moe_layers(model: ModelSpec, units) -> int:
    return census(model, units).moe


def attention_peak(job: Job) -> float:
    """FLOP/s peak of the attention kernels' precision (BF16; fp32 in fp32 runs) at the GPU's sustained rate."""
    base = "fp32" if job.layout.precision == "fp32" else "bf16"
    return job.gpu.peak(base) * 1e12 * job.cal.sustained_factor(job.gpu)


def activation_passes_time(job: Job, rank: int, cpu_trainer: bool, passes: float) -> float:
    """Norms, RoPE, residuals, casts: `passes` over every activation the rank's chunks produce (before recompute),
    as memory.py counts them for the GPU trainer or (cpu_trainer) for the CPU trainer's own layers (memoised on
    PASSES_FIELDS)."""
    def compute() -> float:
        # what the layers produce: before recompute, offload or the paged stash change what stays saved
        plain = job.layout.replace(recompute="none", activation_offload=(), activation_offload_fraction=1.0,
                                   expert_stash="none")
        acts = sum(rank_chunk_activations(job.model, plain, job.seq_len, job.place, rank, cpu_trainer))
        return passes * acts / job.hbm
    return _PASSES.get((job.model, job.gpu), (passes_key(job.layout), job.seq_len, rank, cpu_trainer, passes),
                       compute)
