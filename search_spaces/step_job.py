"""One step-time question (`Job`) and the interface a hardware family's cost terms answer it through.

The step-time model (search_spaces/throughput.py) is the same formula on every machine; where an accelerator and
the CPU host (gloo ranks) differ, it asks the job's `StepTimeTerms`: search_spaces/gpu_terms.py for the GPU
families, search_spaces/host_terms.py for the host. throughput.job_for picks them once, by the accelerator's
declared family. This module holds what both sets read: the job, a rank's compute, and a few shared facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from search_spaces.calibration_file import Calibration
from search_spaces.hardware import GPUSpec
from search_spaces.layout import Layout
from search_spaces.memory import act_bytes, chunk_activations
from search_spaces.models import ModelSpec
from search_spaces.pipeline import Placement, Unit, placement

FP8_BYTES = 1
# sequence parallel: all-gather before and reduce-scatter after attention and MLP in the forward (4 per layer),
# mirrored in the backward (4)
SP_COLLECTIVES_PER_LAYER = 8


class RankCompute(NamedTuple):
    """Seconds per microbatch of one pipeline rank's own work."""
    rank: int
    units: list[Unit]
    total: float  # everything below: what the pace is set by
    gemm: float  # the model's GEMMs
    recompute: float  # the GEMMs and attention forwards recompute repeats
    attention: float
    elementwise: float


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

    def elementwise_time(self, job: Job, rank: int, units: list[Unit], per_gpu: float) -> float:
        """Seconds per microbatch of the rank's element-wise work (norms, casts, permutes ...); `per_gpu`: the
        microbatch's tokens per GPU sharing the dense work."""

    def dispatcher_efficiency(self, job: Job) -> float:
        """Achieved / datasheet bandwidth of the MoE dispatcher's all-to-all."""

    def launch_overhead_time(self, job: Job, units: list[Unit]) -> float:
        """Seconds per microbatch the rank's layers wait for the host (launches, eager overhead, fixed costs)."""

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
        """The busiest EP rank's routed token copies over the balanced share, for the layout's routing."""
        from search_spaces.routing import expert_load

        L = self.layout
        return expert_load(self.model, L, self.tokens_rank / L.tp if L.sp else self.tokens_rank, self.gpu.is_cpu)

    @property
    def dp(self) -> int:
        return max(self.layout.dp(self.num_gpus), 1)

    @property
    def edp(self) -> int:
        return max(self.layout.edp(self.num_gpus), 1)


def precision_class(precision: str) -> str:
    return "fp8" if precision.startswith("fp8") or precision == "mxfp8" else precision


def moe_layers(model: ModelSpec, units) -> int:
    return sum(1 for u in units if u.is_layer and model.layer_is_moe(u.layer))


def attention_peak(job: Job) -> float:
    """FLOP/s peak of the attention kernels' precision (BF16; fp32 in fp32 runs) at the GPU's sustained rate."""
    base = "fp32" if job.layout.precision == "fp32" else "bf16"
    return job.gpu.peak(base) * 1e12 * job.cal.sustained_factor(job.gpu)


def activation_passes_time(job: Job, rank: int, cpu_trainer: bool) -> float:
    """Norms, RoPE, residuals, casts: passes over every activation the rank's chunks produce (before recompute),
    as memory.py counts them for the GPU trainer or (cpu_trainer) for the CPU trainer's own layers."""
    plain = job.layout.replace(recompute="none")
    acts = sum(chunk_activations(job.model, plain, job.seq_len, c, cpu_trainer) for c in job.place.rank_stages(rank))
    return job.cal.elementwise_passes * acts / job.hbm
