"""Memory components, hand-computed for tiny-moe on cpu in fp32 (what the trainer measures) and for the schedules."""

import pytest

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost.breakdown import GIB
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.memory import inflight_per_chunk, memory_breakdown
from search_spaces.layouts.layout import Layout

TINY = load_model("tiny-moe")
CPU = load_gpu("cpu")
H, V, F, E, K = 64, 256, 128, 4, 2
# per decoder layer: q,k,v,o (4 x 64x64) + 2 norms + q/k norms (Qwen3 QK-norm, 2 x 16) + router (64x4);
# experts: 4 x (3 x 64 x 128)
DENSE_LAYER = 4 * H * H + 2 * H + 2 * 16 + H * E
EXPERTS_LAYER = E * 3 * H * F
DENSE = 4 * DENSE_LAYER + 2 * V * H + H  # + embedding, output layer, final norm


def mem(world, seq, **fields):
    return memory_breakdown(TINY, CPU, world, seq, Layout.from_dict({"precision": "fp32", **fields}))


def test_static_state_fp32_distributed_optimizer():
    m = mem(4, 512, ep=2, gbs=4)  # DP 4, EDP 2
    params = DENSE + 4 * EXPERTS_LAYER / 2
    assert m.weights == pytest.approx(4 * params)
    assert m.gradients == pytest.approx(4 * params)  # fp32 main_grad buffers, not sharded
    # Adam exp_avg + exp_avg_sq, no master copy with fp32 params; dense sharded over DP*CP, experts over EDP
    assert m.optimizer_states == pytest.approx(8 * (DENSE / 4 + 4 * EXPERTS_LAYER / 2 / 2))


def test_bf16_adds_a_master_copy_and_no_distopt_does_not_shard():
    m = mem(2, 512, gbs=2, precision="bf16", distributed_optimizer=False)
    params = DENSE + 4 * EXPERTS_LAYER
    assert m.weights == pytest.approx(2 * params) and m.gradients == pytest.approx(2 * params)
    assert m.optimizer_states == pytest.approx(12 * params)


def test_tp_shards_the_dense_part():
    m1, m2 = mem(1, 512), mem(2, 512, tp=2)
    norms_router = 4 * (2 * H + H * E) + H  # not sharded by TP
    assert m2.weights == pytest.approx(4 * ((DENSE - norms_router) / 2 + norms_router + 4 * EXPERTS_LAYER))
    assert m2.weights < m1.weights


def test_activations_per_microbatch_hand_computed():
    """The CPU trainer runs PyTorch composite ops (no fused kernels): this is what its saved-tensor hooks see."""
    T, D = 512, 16  # tokens; head_dim (4 heads x 16 = 64 = H: q, k, v and the attention output are [T, H] too)
    unit = T * H * 4  # one [T, h] fp32 tensor
    per_layer = (2 * unit                                # norm inputs (residual stream)
                 + 2 * (unit + T * 4) + 2 * unit         # normalised copies + rsqrt; norm outputs (QKV, router)
                 + 3 * unit + 2 * (unit + T * 4 * 4)     # QKV output; QK-norm normalised q, k + rsqrt per head
                 + 2 * unit + unit                       # q and k after RoPE, attention output
                 + 4 * T * D * 4                         # RoPE cos/sin for q and k
                 + T * T * 4 * 4 + T * T                 # fp32 attention probabilities (4 heads) + causal mask
                 + T * (E * 4 + K * 20)                  # router scores, top-k probabilities and indices
                 + T * K * (H * 4 + 2 * F * 4 + 4) + T * (E + K) * 8  # expert input, fc1 output, probs; permutation
                 + T * K * F * 4 * 4)                    # silu out, linear-half copy, product, fc2 input
    head = T * (3 * H + 1) * 4 + T * V * 4 + T * 9      # final norm, output-layer input, fp32 softmax, labels/mask
    embedding = T * 8                                   # token ids
    m = mem(1, T)
    assert m.activations_per_microbatch == pytest.approx(4 * per_layer + head + embedding)
    assert m.activations == pytest.approx(m.activations_per_microbatch)  # PP=1: one microbatch in flight
    assert m.embedding_logits == pytest.approx(head)


def test_selective_recompute_frees_exactly_its_tensors():
    T = 512
    base = mem(1, T).activations_per_microbatch
    # layernorm: per norm the normalised copy, rsqrt and the output the next module keeps
    assert base - mem(1, T, recompute="layernorm").activations_per_microbatch == \
        pytest.approx(4 * 2 * (2 * T * H * 4 + T * 4))
    # moe_act: silu output, the linear half's copy, the product and fc2's input (4 token-copy x ffn tensors)
    assert base - mem(1, T, recompute="moe_act").activations_per_microbatch == pytest.approx(4 * 4 * T * K * F * 4)
    full = mem(1, T, recompute="full")
    assert full.activations_per_microbatch < 0.2 * base


def test_context_parallel_shrinks_the_per_rank_sequence():
    a1 = mem(2, 1024, gbs=2).activations_per_microbatch
    a2 = mem(2, 1024, cp=2, gbs=1).activations_per_microbatch
    assert a2 < 0.75 * a1


@pytest.mark.parametrize("pp,vpp,m,rank,expected", [
    (4, 1, 8, 0, [4]), (4, 1, 8, 3, [1]), (4, 1, 2, 0, [2]),
    (2, 2, 4, 0, [3, 2]),  # warm-up (2-0-1)*2 + (2-1)*2 = 4, +1: groups of PP through the chunks
    (2, 2, 4, 1, [2, 1]),
    (4, 2, 1, 0, [1, 1]),
])
def test_microbatches_in_flight(pp, vpp, m, rank, expected):
    assert inflight_per_chunk(Layout(pp=pp, vpp=vpp), rank, m) == expected


def test_first_stage_holds_more_in_flight_than_the_last():
    m = mem(4, 512, pp=4, gbs=8)
    assert m.counts.pipeline_rank in (0, 3)
    layouts = Layout(pp=4, gbs=8, precision="fp32")
    assert inflight_per_chunk(layouts, 0, 8)[0] == 4 * inflight_per_chunk(layouts, 3, 8)[0]


def test_optimizer_offload_moves_the_moments_to_host_and_keeps_the_master_shard():
    """Megatron-Core's HybridDeviceOptimizer steps a pinned host copy of the distributed optimizer's fp32 master shard,
    which stays on the GPU: offloading moves the moments (8 of Adam's 12 B per bf16 parameter)."""
    q, h100 = load_model("qwen3-30b-a3b"), load_gpu("h100")
    base = Layout(ep=8, gbs=8, precision="bf16")
    on = memory_breakdown(q, h100, 8, 4096, base.replace(optimizer_offload=1.0))
    half = memory_breakdown(q, h100, 8, 4096, base.replace(optimizer_offload=0.5))
    off = memory_breakdown(q, h100, 8, 4096, base)
    assert on.optimizer_states == pytest.approx(off.optimizer_states * 4 / 12)  # the master shard
    assert on.offloaded_to_host == pytest.approx(off.optimizer_states)  # the moments and the master's host copy
    assert half.optimizer_states == pytest.approx(off.optimizer_states * (1 - 0.5 * 8 / 12))
    assert on.peak < off.peak - 0.6 * off.optimizer_states


def test_optimizer_offload_saves_what_the_published_card_measured():
    """Megatron-Bridge's CPU-offloading card (skills/nemo-mbridge-perf-cpu-offloading @067f987df): Qwen3-30B-A3B at TP2
    PP2 EP4 on 16 H100, 47.2 GB allocated without offload, 32.0 GB with all of it offloaded (15.3 GB saved; 3.8 GB per
    quarter). The card's GBS 8 is assumed from its skill's command; the saving does not depend on it."""
    q, h100 = load_model("qwen3-30b-a3b"), load_gpu("h100")
    base = Layout(tp=2, pp=2, ep=4, mbs=1, gbs=8, precision="bf16", dispatcher="alltoall")
    # what torch allocates (the card's figure, in GB): the peak without the allocator's margin
    allocated = [(m.peak - m.allocator_margin) / 1e9 for f in (0.0, 0.25, 1.0)
                 for m in [memory_breakdown(q, h100, 16, 4096, base.replace(optimizer_offload=f))]]
    assert allocated[0] - allocated[2] == pytest.approx(15.3, rel=0.05)
    assert allocated[0] - allocated[1] == pytest.approx(3.8, rel=0.05)


def test_gpu_extras_cuda_graphs_and_dispatcher_buffers():
    q = load_model("qwen3-30b-a3b")
    h100 = load_gpu("h100")
    base = Layout(ep=8, gbs=8, precision="bf16")
    plain = memory_breakdown(q, h100, 8, 4096, base)
    graphs = memory_breakdown(q, h100, 8, 4096, base.replace(cuda_graphs=("attn", "moe_router")))
    deepep = memory_breakdown(q, h100, 8, 4096, base.replace(dispatcher="deepep"))
    assert graphs.cuda_graphs > 0 and graphs.peak > plain.peak
    assert deepep.dispatcher_buffers > plain.dispatcher_buffers
    assert plain.runtime_overhead > 0 and plain.allocator_margin > 0


def test_hybridep_buffers_grow_with_the_tokens_per_rank_and_the_ep_group():
    """HybridEP sizes its buffer for every token of the EP group landing on one rank (DeepEP's hybrid-ep
    NVLCoordinator): tokens per rank x EP tokens of BF16 hidden, fp32 probabilities per expert of the NVLink
    domain and fp32 scales; DeepEP's chunked buffers do not grow with the tokens."""
    nxt, gb200 = load_model("qwen3-next-80b-a3b"), load_gpu("gb200")
    base = Layout(ep=8, gbs=32, precision="bf16", dispatcher="hybridep")
    long = memory_breakdown(nxt, gb200, 32, 65536, base)
    assert long.dispatcher_buffers == 65536 * 8 * (2 * 2048 + 4 * 64 * 8 + 4 * 2048 / 128)  # 3.0 GiB
    assert memory_breakdown(nxt, gb200, 32, 65536, base.replace(cp=2)).dispatcher_buffers \
        == pytest.approx(long.dispatcher_buffers / 2)
    assert memory_breakdown(nxt, gb200, 32, 8192, base).dispatcher_buffers == pytest.approx(
        long.dispatcher_buffers / 8)
    deepep = base.replace(dispatcher="deepep")
    assert memory_breakdown(nxt, gb200, 32, 65536, deepep).dispatcher_buffers \
        == memory_breakdown(nxt, gb200, 32, 8192, deepep).dispatcher_buffers
    # across NVLink domains (EP16 over two 8-GPU B200 nodes) the staging buffers come on top
    q = load_model("qwen3-235b-a22b")
    b200 = load_gpu("b200")
    one = memory_breakdown(q, b200, 64, 4096, Layout(ep=8, gbs=64, precision="bf16", dispatcher="hybridep"))
    two = memory_breakdown(q, b200, 64, 4096, Layout(ep=16, gbs=64, precision="bf16", dispatcher="hybridep"))
    assert two.dispatcher_buffers > 2 * one.dispatcher_buffers


def test_estimate_reports_the_named_keys_in_gib():
    est = estimate(TINY, CPU, 1, 512, Layout(precision="fp32"))
    mem_gib = est.to_dict()["breakdown"]["memory_gib"]  # the public JSON form
    for key in ("weights", "gradients", "optimizer_states", "activations_per_microbatch", "activations"):
        assert key in mem_gib
    assert mem_gib["weights"] == pytest.approx(4 * (DENSE + 4 * EXPERTS_LAYER) / GIB)


def test_matches_the_cpu_trainer_measurements_within_2_percent():
    """tests/data/cpu_trainer_memory.json: what the real trainer measured for tiny-moe on cpu in fp32."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parents[1] / "data" / "cpu_trainer_memory.json").read_text())
    for run in data["runs"]:
        layout = Layout.from_dict({"precision": "fp32", **run["layout"]})
        predicted = memory_breakdown(TINY, CPU, run["num_gpus"], data["seq_len"], layout)
        for key, measured_mib in run["memory_mib"].items():
            assert getattr(predicted, key) / 2**20 == pytest.approx(measured_mib, rel=0.02), (run["layout"], key)
