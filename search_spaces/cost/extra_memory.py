"""Memory terms beside search_spaces/cost/memory.py's: context-parallel attention buffers, gated delta-net's chunk
states and the CPU process.

- `cp_attention_buffers`: what one attention layer's CP communication holds while it runs, per cp_comm_type, as
  Transformer Engine allocates it (transformer_engine/pytorch/attention/dot_product_attention/
  context_parallel.py). One layer at a time, so it adds once to the peak (at the backward, the larger side):
  p2p: the backward's two ring buffers of [K/V, dK/dV] (AttnFuncWithCPAndKVP2P), 4 shards of K/V;
  allgather: the backward's re-gathered K/V and the full-length dK/dV before their reduce-scatter
  (AttnFuncWithCPAndKVAllGather), 2 x CP shards -- it grows with the whole sequence;
  a2a: the all-to-all outputs of q, k, v and in the backward of dq, dk, dv (AttnFuncWithCPAndQKVOA2A);
  a2a+p2p: both, the ring's over the a2a level's longer shards (the same bytes).
  The saved activations themselves are the same for every type (memory.py counts them).
- `delta_net_chunk_states`: gated delta-net's chunk states (and their gradients in the backward) while one layer's
  state pass runs (search_spaces/cost/delta_net.py); 0 on cpu, where the trainer's reference kernels are measured
  with the saved activations.
- `host_process`: on `cpu` the peak is the process's resident set: Python, torch and Megatron-Core's code and
  allocator state (`cpu_process_baseline_gib`, measured on the trainer: bench/cpu_calibration.py) beside the
  tensors memory.py counts.
"""

from __future__ import annotations

import dataclasses

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost import delta_net
from search_spaces.cost.breakdown import GIB, MemoryBreakdown
from search_spaces.cost.memo import Memo
from search_spaces.cost.memory import act_bytes
from search_spaces.layouts.layout import Layout

# K/V (and dK/dV) shards the backward of the p2p ring holds: two buffers of [K/V, dK/dV] (send and receive)
P2P_RING_BUFFERS = 4


# the layout fields cp_attention_buffers reads (search_spaces/layouts/space.py keys its probe by them)
CP_BUFFER_FIELDS = ("tp", "cp", "mbs", "precision", "cp_comm_type")
_ALL_LINEAR = Memo("all layers linear attention")


def cp_attention_buffers(model: ModelSpec, layout: Layout, seq_len: int, cpu: bool) -> float:
    """Bytes the layout's cp_comm_type holds for one attention layer beyond the saved activations (0 without CP
    or without softmax attention; 0 on cpu, where memory.py counts the trainer's gathered K/V itself)."""
    if cpu or layout.cp <= 1 or _ALL_LINEAR.get((model,), None, lambda: set(model.attention_kinds()) == {"linear"}):
        return 0.0
    e = act_bytes(layout)
    heads = model.num_attention_heads / layout.tp
    kv_heads = heads if model.is_mla else model.num_kv_heads / layout.tp
    d_qk, d_v = (model.q_head_dim, model.v_head_dim) if model.is_mla else (model.head_dim, model.head_dim)
    tokens = layout.mbs * seq_len / layout.cp
    kv = tokens * kv_heads * (d_qk + d_v) * e
    qkv = tokens * (heads * d_qk + kv_heads * (d_qk + d_v)) * e
    kind = layout.cp_comm_type
    if kind == "p2p":
        return P2P_RING_BUFFERS * kv
    if kind == "allgather":
        return 2 * layout.cp * kv
    if kind == "a2a":
        return 2 * qkv
    return 2 * qkv + P2P_RING_BUFFERS * kv  # a2a+p2p


def host_process_bytes(gpu: GPUSpec, cal: Calibration) -> float:
    """Resident memory of the training process beside its tensors: counted on cpu only (on GPUs the host's
    memory is not the GPU's; memory.py's runtime_overhead holds the CUDA context and workspaces)."""
    return cal.cpu_process_baseline_gib * GIB if gpu.is_cpu else 0.0


def extra_memory_terms(model: ModelSpec, gpu: GPUSpec, seq_len: int, layout: Layout,
                       cal: Calibration) -> tuple[float, float, float]:
    """(cp_attention_buffers, delta_net_chunk_states, host_process), bytes: MemoryBreakdown's fields of this
    module."""
    states = 0.0 if gpu.is_cpu else delta_net.chunk_state_bytes(model, layout, seq_len, act_bytes(layout))
    return cp_attention_buffers(model, layout, seq_len, gpu.is_cpu), states, host_process_bytes(gpu, cal)


def with_extra_memory(breakdown: MemoryBreakdown, model: ModelSpec, gpu: GPUSpec, seq_len: int, layout: Layout,
                      cal: Calibration) -> MemoryBreakdown:
    """memory.py's breakdown (bytes) with these terms in it (and so in its peak)."""
    buffers, states, host = extra_memory_terms(model, gpu, seq_len, layout, cal)
    return dataclasses.replace(breakdown, cp_attention_buffers=buffers, delta_net_chunk_states=states,
                               host_process=host)
