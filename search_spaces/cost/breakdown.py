"""What the cost model reports for one layout: a `MemoryBreakdown` (bytes, with the counts apart) and a `StepTime`
(seconds), each a typed record with one field per component.

Their dict forms (`MemoryBreakdown.to_gib`, `StepTime.components`) are the `breakdown` of `estimate --json`, a
public format: the keys and their order are the fields'. `PEAK_KEYS`, `COUNT_KEYS` and `TIME_KEYS` derive from
the declarations, so a new component is one field here and the one line of the model that computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

GIB = float(1 << 30)
PEAK = {"peak": True}  # field metadata: this component adds to the peak


@dataclass(frozen=True)
class RankCounts:
    """What the most loaded pipeline rank holds, counted (not bytes: never divided into GiB)."""
    pipeline_rank: int
    """The pipeline rank the breakdown is of (the one with the highest peak)."""
    inflight_microbatches: float
    """Microbatches whose activations the rank holds at its peak, per model chunk (chunk-microbatches / chunks)."""
    params_on_rank: float
    """Parameters the rank holds (dense + expert)."""
    dense_params_on_rank: float
    """Its dense (TP-sharded) parameters."""
    expert_params_on_rank: float
    """Its routed-expert (EP x ETP-sharded) parameters."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on one pipeline rank, by component (search_spaces/cost/memory.py, extra_memory.py). `peak` sums the
    components marked PEAK (PEAK_KEYS); the others are informational."""
    weights: float = field(metadata=PEAK)
    """Parameters: 4 B (fp32) or 2 B each, plus a 1 B cast cache under fp8 recipes."""
    gradients: float = field(metadata=PEAK)
    """Megatron DDP main_grad buffers (not sharded): 4 B per parameter in fp32 runs, 2 B otherwise."""
    optimizer_states: float = field(metadata=PEAK)
    """Adam's states (and the fp32 master copy) kept on the GPU: the distributed optimizer's shard, less what
    is offloaded to the host."""
    activations: float = field(metadata=PEAK)
    """What autograd saves for backward: every microbatch in flight through the rank's chunks, after recompute."""
    dispatcher_buffers: float = field(metadata=PEAK)
    """The MoE dispatcher's buffers: DeepEP/HybridEP's pre-allocated ones, or the all-to-all / all-gather ones."""
    cuda_graphs: float = field(metadata=PEAK)
    """CUDA graphs' static inputs, outputs and private pools."""
    runtime_overhead: float = field(metadata=PEAK)
    """CUDA context, NCCL communicators, cuBLAS/TE workspaces (0 on cpu)."""
    allocator_margin: float = field(metadata=PEAK)
    """The caching allocator's fragmentation (0 on cpu)."""
    activations_per_microbatch: float
    """Saved activations of one microbatch through all the rank's chunks."""
    embedding_logits: float
    """The output head's share of it (final norm, logits, cross-entropy)."""
    offloaded_to_host: float
    """Optimizer states (optimizer_offload) and activations (activation_offload) kept in pinned host memory."""
    counts: RankCounts
    """The rank and what it holds, counted."""
    cp_attention_buffers: float = field(default=0.0, metadata=PEAK)
    """What one attention layer's CP communication holds while it runs (extra_memory.cp_attention_buffers)."""
    delta_net_chunk_states: float = field(default=0.0, metadata=PEAK)
    """Gated delta-net's chunk states and their gradients while one layer's state pass runs
    (extra_memory.py, search_spaces/cost/delta_net.py)."""
    host_process: float = field(default=0.0, metadata=PEAK)
    """cpu: the training process's resident memory beside its tensors (extra_memory.host_process_bytes)."""

    @property
    def peak(self) -> float:
        """The PEAK components summed: the rank's peak in bytes."""
        return self.peak_with(self.cp_attention_buffers, self.delta_net_chunk_states, self.host_process)

    def peak_with(self, cp_attention_buffers: float, delta_net_chunk_states: float, host_process: float) -> float:
        """The peak with these extra_memory terms in place of the breakdown's own (what `space` asks of
        candidates, without building a breakdown for each)."""
        return peak_bytes(self.weights, self.gradients, self.optimizer_states, self.activations,
                          self.dispatcher_buffers, self.cuda_graphs, self.runtime_overhead, self.allocator_margin,
                          cp_attention_buffers, delta_net_chunk_states, host_process)

    def to_gib(self) -> dict[str, float]:
        """Every component in GiB and the counts as they are, in declaration order (the `memory_gib` of
        `estimate --json`; the pipeline rank is written as a float there, as it always was)."""
        out: dict[str, float] = {}
        for f in fields(self):
            if f.name == "counts":
                out.update({c.name: float(getattr(self.counts, c.name)) for c in fields(RankCounts)})
            else:
                out[f.name] = getattr(self, f.name) / GIB
        return out


def peak_bytes(weights: float, gradients: float, optimizer_states: float, activations: float,
               dispatcher_buffers: float, cuda_graphs: float, runtime_overhead: float, allocator_margin: float,
               cp_attention_buffers: float = 0.0, delta_net_chunk_states: float = 0.0,
               host_process: float = 0.0) -> float:
    """The PEAK components of a MemoryBreakdown summed (the one formula: memory.py compares ranks by it)."""
    base = weights + gradients + optimizer_states + activations + dispatcher_buffers + cuda_graphs
    return base + runtime_overhead + allocator_margin + (cp_attention_buffers + delta_net_chunk_states + host_process)


PEAK_KEYS = tuple(f.name for f in fields(MemoryBreakdown) if f.metadata.get("peak"))
COUNT_KEYS = tuple(f.name for f in fields(RankCounts))
# the components that are not part of the peak, by what they are a figure of: one microbatch's saved activations
# (the peak's `activations` holds every microbatch in flight), and the bytes kept in the host's pinned memory
PER_MICROBATCH_KEYS = ("activations_per_microbatch", "embedding_logits")
HOST_KEYS = ("offloaded_to_host",)


def memory_sections(memory: MemoryBreakdown) -> dict[str, dict[str, float]]:
    """The breakdown in GiB, grouped so that no figure is read as a part of another: `peak_components` (PEAK_KEYS,
    which sum to the peak), `per_microbatch` (one microbatch's activations and its output head's share: inside
    the peak's `activations`, not beside it) and `host_offloaded` (in the host's pinned memory, not on the GPU)."""
    gib = memory.to_gib()
    return {"peak_components": {k: gib[k] for k in PEAK_KEYS},
            "per_microbatch": {k: gib[k] for k in PER_MICROBATCH_KEYS},
            "host_offloaded": {k: gib[k] for k in HOST_KEYS}}


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step of the most loaded pipeline rank, by component (search_spaces/cost/throughput.py).
    `compute` is gemm + attention + elementwise (its parts); every other component adds to `step`."""
    compute: float
    """The rank's own work per step, recompute apart."""
    gemm: float
    """Part of compute: the model's dense and expert GEMMs."""
    attention: float
    """Part of compute: core attention (flash attention, gated delta-net kernels), forward and backward."""
    elementwise: float
    """Part of compute: element-wise passes over the activations and routed tokens, fp8 casts."""
    recompute: float
    """The forward GEMMs and attention the recompute choice repeats."""
    tp_comm: float
    """Sequence-parallel all-gathers and reduce-scatters not hidden by overlap."""
    cp_comm: float
    """Context-parallel exchanges (per cp_comm_type) and the linear-attention all-to-alls not hidden."""
    ep_comm: float
    """Expert-parallel dispatch and combine not hidden."""
    dispatcher_overhead: float
    """The dispatcher beside its bytes: fixed costs per call, NCCL's global permute, the SMs it takes from
    compute (0 on cpu)."""
    pp_comm: float
    """Pipeline sends and receives not hidden."""
    launch_overhead: float
    """Host time the GPU waits for (kernel launches CUDA graphs do not cover, the dropless MoE sync, graph
    replays' copies); on cpu eager overhead and gloo latency."""
    pipeline_bubble: float
    """Warm-up and drain of the pipeline schedule."""
    dp_comm: float
    """Gradient reduce-scatter and parameter all-gather not hidden (once per step)."""
    optimizer: float
    """Adam over the shard kept on the GPU."""
    optimizer_offload: float
    """The offloaded share: over the host link and the host's CPU Adam."""
    host_contention: float
    """cpu: the wait of ranks beyond the host's cores (0 on GPUs)."""
    step: float
    """The step: the components above added (compute's parts counted once, in compute)."""
    activation_offload: float = 0.0
    """The activation offload's copies over the host link not hidden behind the layers' compute (adds to the step;
    declared after it and left out of `components` while 0, so the published time_s of layouts without the
    offload keeps its keys)."""

    def components(self) -> dict[str, float]:
        """Every component but `step`, in declaration order (the `time_s` of `estimate --json`); a quiet one
        (QUIET_TIME_KEYS) only when not 0."""
        return {k: getattr(self, k) for k in TIME_KEYS if k not in QUIET_TIME_KEYS or getattr(self, k)}


TIME_KEYS = tuple(f.name for f in fields(StepTime) if f.name != "step")
QUIET_TIME_KEYS = ("activation_offload",)  # components added after time_s was published: shown only when not 0
COMPUTE_PARTS = ("gemm", "attention", "elementwise")  # the parts of `compute` (not added to the step again)
