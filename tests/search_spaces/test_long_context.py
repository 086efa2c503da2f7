"""Attention at length and context parallelism per cp_comm_type (search_spaces/cost/throughput.py, extra_memory.py)."""

import pytest

from search_spaces.calibration.calibration_file import calibration
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost.breakdown import GIB
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.gpu_terms import head_width_factor, shard_length_factor
from search_spaces.cost.throughput import (
    RING_TRANSFER_LATENCY_S,
    RingStep,
    attention_layer_time,
    cp_geometry,
    job_for,
    ring_exposed_time,
)
from search_spaces.layouts.layout import Layout
from search_spaces.layouts.space import explore

# DeepSeek-V3's published long-context layout on 256 H100 (notes/long-context-moe.md): CP = seq / 4096; the
# benchmark's forced-balance routing (reference/moe_long_context.csv), so that the band compares like with like
DSV3 = dict(tp=1, ep=32, etp=1, pp=8, vpp=4, mbs=1, precision="fp8-blockwise", dispatcher="deepep",
            recompute="mla_up_proj,layernorm,moe,mlp", optimizer_offload=1.0, cuda_graphs="none")
DSV3_PUBLISHED_ROUTING = {"routing": "forced_balance"}
LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)


def dsv3_fixed(seq_len: int) -> tuple[dict, int]:
    """Every field of the published layout fixed but the CP communication; GBS keeps 128 microbatches."""
    cp = max(1, seq_len // 4096)
    dp = 256 // (8 * cp)
    return {**DSV3, "cp": cp}, 128 * dp


def test_ring_exposure_counts_each_step():
    t = 1.0
    # nothing to hide behind: forward CP-1 sends, backward KV, (CP-2) x (KV + dKV), dKV
    assert ring_exposed_time(4, t, RingStep(0.0, 0.0)) == pytest.approx(3 + 2 + 2 * 2 + 6 * RING_TRANSFER_LATENCY_S)
    # attention steps longer than the transfers hide them all but the latency
    assert ring_exposed_time(4, t, RingStep(1.5, 2.5)) == pytest.approx(6 * RING_TRANSFER_LATENCY_S)
    # a backward step between one and two transfers hides the single ones, not the doubled middle ones
    assert ring_exposed_time(4, t, RingStep(1.5, 1.5)) == pytest.approx(2 * 0.5 + 6 * RING_TRANSFER_LATENCY_S)
    assert ring_exposed_time(1, t, RingStep(0.0, 0.0)) == 0.0


def _job(seq, **fields):
    return job_for(load_model("deepseek-v3"), load_gpu("h100"), 256, seq, Layout.from_dict({**DSV3, **fields}))


def test_a2a_level_lets_attention_hide_the_cross_node_ring():
    """CP32 at 128K: a p2p ring over 4 nodes sends 4K tokens of MLA K/V per step over InfiniBand, more than a
    step's attention lasts; a2a over the 8 ranks of a node makes each ring step 8x longer with the same bytes."""
    p2p = _job(131072, cp=32, gbs=128)
    g = cp_geometry(p2p)
    att = attention_layer_time(p2p, "full")
    transfer = g.kv / g.ring_bw
    assert g.ring == 32 and transfer > att.fwd / 32  # not hidden
    hier = _job(131072, cp=32, gbs=128, cp_comm_type="a2a+p2p", hierarchical_cp=(8, 4))
    h = cp_geometry(hier)
    h_att = attention_layer_time(hier, "full")
    assert (h.a2a, h.ring, h.a2a_outside) == (8, 4, 0.0)  # the a2a level stays inside the node
    assert h.kv == pytest.approx(g.kv)  # the same bytes per ring step...
    # ...against 8x the attention per step: the backward's K/V + dK/dV hide behind it, the forward's mostly
    assert 2 * h.kv / h.ring_bw < h_att.bwd / 4
    exposed = ring_exposed_time(h.ring, h.kv / h.ring_bw, RingStep(h_att.fwd / 4, h_att.bwd / 4))
    assert exposed < 0.05 * ring_exposed_time(g.ring, transfer, RingStep(att.fwd / 32, att.bwd / 32))
    a = estimate("deepseek-v3", "h100", 256, 131072, hier.layout)
    b = estimate("deepseek-v3", "h100", 256, 131072, p2p.layout)
    assert a.time.cp_comm < 0.05 * b.time.cp_comm


def test_ring_inside_the_nvlink_domain_is_hidden():
    job = _job(32768, cp=8, gbs=128 * 4)  # TP1 x CP8 = one node
    g = cp_geometry(job)
    att = attention_layer_time(job, "full")
    assert g.ring_bw == g.nvlink_bw and g.kv / g.ring_bw < att.fwd / 8


def test_attention_efficiency_depends_on_head_widths_and_shard_length():
    assert head_width_factor(128, 128) == pytest.approx(1.0)
    assert head_width_factor(64, 64) < 1.0 < head_width_factor(192, 128)  # forward: the softmax's share
    assert head_width_factor(192, 128, backward=True) < 1.0  # MLA's backward (flash-attention PR #2270)
    assert shard_length_factor(1300) == pytest.approx(0.5)  # FlashAttention-4's causal rates (throughput.py)
    assert shard_length_factor(1024) < shard_length_factor(4096) < shard_length_factor(32768) < 1.0
    # a2a runs one kernel over the whole sequence (1/CP of the heads): faster than p2p's shard-long steps
    p2p = attention_layer_time(_job(65536, cp=16, gbs=256), "full")
    a2a = attention_layer_time(_job(65536, cp=16, gbs=256, cp_comm_type="a2a"), "full")
    assert a2a.fwd < p2p.fwd and a2a.bwd < p2p.bwd
    assert p2p.bwd > 2 * p2p.fwd  # the backward has 2.6x the forward's FLOPs at a lower rate


def test_cp_attention_buffers_per_type():
    def buffers(**fields):
        est = estimate("deepseek-v3", "h100", 256, 131072, Layout.from_dict({**DSV3, "gbs": 128, **fields}))
        return est.memory.cp_attention_buffers / GIB

    p2p = buffers(cp=32)
    gathered = buffers(cp=32, cp_comm_type="allgather")
    assert gathered == pytest.approx(2 * 32 / 4 * p2p)  # 2 x CP shards against the ring's 4
    assert buffers(cp=32, cp_comm_type="a2a+p2p", hierarchical_cp=(8, 4)) > p2p
    assert estimate("deepseek-v3", "h100", 256, 4096, Layout.from_dict({**DSV3, "cp": 1, "gbs": 4096})
                    ).memory.cp_attention_buffers == 0


def test_deepseek_v3_long_context_band():
    """Issue 17: the published layout, each length with the CP communication `space` ranks best, stays in the
    published band (~300-320 TF/s from 4K to 256K, Megatron-Bridge's long-context card). Since issue 23 the 4K end
    carries the MoE layers' per-microbatch sync and launches (it matches its published ~300 within 1%, was 14%
    high), so the band is held against the published figures of each length (reference/moe_long_context.csv)
    within 16%, not against the 4K prediction. Since the EP overlap became a dimension, whole-MoE recompute (this
    layout) leaves the EP all-to-all exposed, and the routing is the published runs' forced balance (dropless
    adds its expert imbalance: 4K at 238 instead of 255)."""
    from search_spaces.calibration.reference import long_context_moe_rows
    published = {m.seq_len: m.tflops() for m in long_context_moe_rows() if m.release == "dsv3-h100"}
    best = {}
    for seq in LENGTHS:
        fixed, gbs = dsv3_fixed(seq)
        found = explore("deepseek-v3", "h100", 256, seq, fixed={**fixed, **DSV3_PUBLISHED_ROUTING}, gbs=gbs, top=1)
        assert found.top, seq
        best[seq] = found.top[0]
    low, high = 0.84 * min(published.values()), 1.16 * max(published.values())  # 8K is not published
    for seq, row in best.items():
        tflops = row["prediction"]["tflops_per_gpu"]
        if seq in published:
            assert abs(tflops / published[seq] - 1) <= 0.16, (seq, row["key"])
        assert low <= tflops <= high, (seq, row["key"])
    # the winners: no CP at 4K; beyond one node a2a inside it with the ring across (a2a+p2p)
    assert best[131072]["layout"]["cp_comm_type"] == "a2a+p2p"
    assert best[131072]["layout"]["hierarchical_cp"] == [8, 4]


def test_cpu_pays_collectives_and_shares_the_cores():
    from search_spaces.cost.host_terms import cpu_collectives
    from search_spaces.cost.throughput import step_time

    spec, cpu = load_model("tiny-moe"), load_gpu("cpu")
    cal = calibration().updated({"cpu_cores": 2.0})
    job = job_for(spec, cpu, 4, 256, Layout(tp=2, cp=2, gbs=8, precision="fp32"), cal)
    # 4 layers: 8 SP collectives each (TP), 4 for CP's K/V gather and its gradient's reduce-scatter
    assert cpu_collectives(job, 4, 4, 4) == 4 * 8 + 4 * 4  # TP2 and CP2: one exchange per collective
    four = step_time(spec, cpu, 4, 256, Layout(gbs=8, precision="fp32"), cal)
    two = step_time(spec, cpu, 2, 256, Layout(gbs=8, precision="fp32"), cal)
    assert four.host_contention > 0 and two.host_contention == 0  # 4 ranks on 2 cores wait for a core
    gpu = step_time(load_model("llama3-8b"), load_gpu("h100"), 8, 4096, Layout(gbs=8))
    assert gpu.host_contention == 0


# Megatron-Bridge's long-context card (reference/moe_long_context.csv): Qwen3-Next on 32 GB200 at ~270, ~230 and
# ~100 TF/s at 8K CP1, 32K CP4 and 64K CP16 -- the seed's "8K and 32K practicable at moderate CP, 64K possible but
# throughput drops noticeably"
QWEN3_NEXT_CARD = {8192: (1, 256), 32768: (4, 64), 65536: (16, 32)}  # length: (CP, GBS as the card's rows)


def test_qwen3_next_at_the_cards_layouts_loses_throughput_at_64k():
    """Gated delta-net under CP: Megatron-Core 0.19 all-to-alls its inputs from sequence to heads, so each rank
    walks the whole sequence's chunk states for fewer heads; the sequential state pass does not shrink with CP while
    the work per rank does (search_spaces/cost/delta_net.py)."""
    tflops = {}
    for seq, (cp, gbs) in QWEN3_NEXT_CARD.items():
        layout = Layout(cp=cp, ep=32, gbs=gbs, precision="bf16", dispatcher="hybridep", routing="forced_balance")
        est = estimate("qwen3-next-80b-a3b", "gb200", 32, seq, layout)
        assert est.legal and est.fits, seq
        tflops[seq] = est.tflops_per_gpu
        # the state pass is its own cost: it grows with CP x length, per token
        assert est.time.attention > 0
    assert tflops[32768] < tflops[8192]
    assert tflops[65536] < 0.6 * tflops[32768]


@pytest.mark.slow
def test_qwen3_next_space_fits_8k_and_32k_at_moderate_cp_and_64k_only_much_tighter():
    """`space` on 32 GB200: the best layouts at 8K and 32K fit at CP <= 4; at 64K the best needs at least 1.3x their
    memory (the seed's "memory gets tight"). (For one stop it asserted selective recompute at 8K/32K instead: the
    model then freed the fp32 master shard too under optimizer offload, which Megatron-Core keeps on the GPU.)"""
    best = {seq: explore("qwen3-next-80b-a3b", "gb200", 32, seq, top=1).top[0] for seq in QWEN3_NEXT_CARD}
    for seq in (8192, 32768):
        assert best[seq]["layout"]["cp"] <= 4, best[seq]["key"]
    long = best[65536]
    shorter = max(best[seq]["prediction"]["peak_memory_gib"] for seq in (8192, 32768))
    assert long["prediction"]["peak_memory_gib"] >= 1.3 * shorter, long["key"]
