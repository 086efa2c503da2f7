"""The cost terms that say how much each knob moves (issue 23): host launches and CUDA-graph scopes, the
dispatchers' all-to-all, FP8 quantisation, gated delta-net at length, and the published A/B pairs they are held to."""

import math

import pytest

from search_spaces.calibration.knob_pairs import (
    KNOBS,
    load_knob_pairs,
    noise_band,
    patch_release_changes,
    predicted_ratio,
)
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost import delta_net, dispatcher_comm, launch_overhead, quantisation
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.throughput import calibration
from search_spaces.layouts.layout import Layout

CAL = calibration()


def test_the_pairs_file_is_sourced_balanced_and_covers_the_searched_knobs():
    pairs = load_knob_pairs()
    assert len(pairs) >= 12
    assert {p.knob for p in pairs} >= {"dispatcher", "cuda_graphs", "precision", "recompute", "ep_overlap"}
    assert {p.knob for p in pairs} <= set(KNOBS)
    # half fit, half held out; a pair found after the last refit joins the held half (fitting on it would change
    # constants the packaged calibration was not fitted with)
    halves = [p.half for p in pairs]
    assert 0 <= halves.count("held") - halves.count("fit") <= 2
    for p in pairs:
        assert "@" in p.source and p.changed  # a commit, and B differs from A
        assert p.a.replace(**{k: getattr(p.b, k) for k in ("dispatcher", "cuda_graphs", "precision", "recompute",
                                                          "cp_comm_type", "hierarchical_cp", "ep_overlap", "routing",
                                                          "optimizer_offload")}) == p.b


def test_the_noise_band_is_what_the_same_layout_moves_between_a_release_and_its_patch():
    """bench/knob_effects.py counts a direction only beyond it: a published A/B ratio is two runs, and the same
    layout run twice (a release and its patch release in the performance summary) moves too."""
    changes = patch_release_changes()
    assert len(changes) >= 50 and changes == sorted(changes) and changes[0] >= 0
    median = math.exp(changes[len(changes) // 2]) - 1
    assert median < noise_band(0.9) <= noise_band(0.95) < math.exp(changes[-1]) - 1


def test_a_step_time_metric_is_inverted():
    neutral = next(p for p in load_knob_pairs() if p.metric == "step_time_s")
    assert neutral.ratio == pytest.approx(neutral.value_a / neutral.value_b) and neutral.ratio < 1


def test_excess_smooths_max_of_host_and_gpu():
    g = 1.0
    assert launch_overhead.excess(0.0, g) == 0.0
    assert 0 < launch_overhead.excess(0.3, g) < 0.01  # a host well below the GPU is nearly hidden
    assert launch_overhead.excess(3.0, g) == pytest.approx(2.0, rel=0.01)  # far above it: the difference
    values = [launch_overhead.excess(h, g) for h in (0.2, 0.5, 1.0, 2.0)]
    assert values == sorted(values)


def _layer_host(layout, busy, index=5):
    return launch_overhead.layer_host_time(load_model("deepseek-v3"), layout, index, busy, CAL)


def test_graph_scopes_remove_host_launches_and_full_iteration_removes_all():
    base = Layout(ep=32, dispatcher="deepep", precision="mxfp8")
    busy = launch_overhead.LayerBusy(0.5e-3, 1e-3, 0.2e-3)  # a host-bound layer
    eager = _layer_host(base, busy)
    graphed = _layer_host(base.replace(cuda_graphs="attn,moe_router,moe_preprocess"), busy)
    assert 0 < graphed < eager
    assert _layer_host(base.replace(cuda_graphs="full_iteration"), busy) == 0.0
    # a GPU-bound layer hides nearly all of it: only the MoE sync stays
    slow = launch_overhead.LayerBusy(0.1, 0.2, 0.05)
    assert _layer_host(base, slow) == pytest.approx(CAL.moe_sync_s, rel=0.05)


def test_host_launches_grow_with_local_experts_and_fp8_quantisation():
    model = load_model("qwen3-30b-a3b")
    experts = [sum(launch_overhead.layer_kernels(model, Layout(ep=ep), 0).values()) for ep in (32, 8)]
    assert experts[1] > experts[0]
    bf16 = sum(launch_overhead.layer_kernels(model, Layout(ep=8), 0).values())
    fp8 = sum(launch_overhead.layer_kernels(model, Layout(ep=8, precision="fp8-tensorwise"), 0).values())
    assert fp8 > bf16
    flex = launch_overhead.layer_kernels(model, Layout(ep=8, dispatcher="hybridep"), 0)
    nccl = launch_overhead.layer_kernels(model, Layout(ep=8), 0)
    assert flex["router"] + flex["preprocess"] < nccl["router"] + nccl["preprocess"]  # the fused preprocess


def test_dispatcher_bandwidth_by_backend_and_domain():
    gb200, h100 = load_gpu("gb200"), load_gpu("h100")
    nccl = CAL.dispatcher_efficiency["alltoall"]
    deepep_nvl72 = dispatcher_comm.link_efficiency(gb200, "deepep", 32, nccl)[0]
    hybridep_nvl72 = dispatcher_comm.link_efficiency(gb200, "hybridep", 32, nccl)[0]
    assert deepep_nvl72 < nccl < hybridep_nvl72  # DeepEP's MNNVL path: ~258 GB/s of 900
    assert deepep_nvl72 * gb200.nvlink_gbps == pytest.approx(20 / 24 * 2 / (1 / 400 + 1 / 190), rel=1e-6)
    assert dispatcher_comm.link_efficiency(h100, "deepep", 32, nccl)[1] > nccl  # RDMA near the NIC
    model = load_model("deepseek-v3")
    assert dispatcher_comm.global_permute_bytes(model, Layout(ep=8), 4096, 2) > 0
    assert dispatcher_comm.global_permute_bytes(model, Layout(ep=8, dispatcher="hybridep"), 4096, 2) == 0
    assert dispatcher_comm.latency_time(Layout(ep=8, dispatcher="hybridep"), 10) < \
        dispatcher_comm.latency_time(Layout(ep=64), 10)


def test_quantisation_bytes_and_dispatch_precision():
    assert quantisation.cast_bytes("bf16") == 0
    assert quantisation.cast_bytes("fp8-tensorwise") > quantisation.cast_bytes("mxfp8") > 4
    assert quantisation.dispatch_bytes_per_element("mxfp8", 2) == 2  # MXFP8 tokens travel in BF16
    assert quantisation.dispatch_bytes_per_element("fp8-blockwise", 2) == 1
    assert quantisation.gemm_factor(load_gpu("h100"), "fp8-blockwise", CAL) < 1


def test_fp8_pays_little_on_small_experts_and_more_on_large_gemms():
    """Qwen3-30B-A3B's experts (2048 x 768) against Llama3-70B's dense GEMMs (8192 x 28672): the casts cost per
    input element what FP8 saves per GEMM FLOP, so the small model gains less."""
    def gain(model, n, seq, **fields):
        a = estimate(model, "b200", n, seq, Layout.from_dict({**fields, "precision": "bf16"}))
        b = estimate(model, "b200", n, seq, Layout.from_dict({**fields, "precision": "mxfp8"}))
        return b.tokens_per_sec_per_gpu / a.tokens_per_sec_per_gpu
    small = gain("qwen3-30b-a3b", 8, 4096, ep=8, mbs=4, gbs=512, dispatcher="hybridep", cuda_graphs="full_iteration")
    large = gain("llama3-70b", 64, 8192, tp=4, pp=4, vpp=5, gbs=128, cuda_graphs="full_iteration")
    assert small < large


def test_delta_net_state_pass_does_not_shrink_with_cp():
    model, gpu = load_model("qwen3-next-80b-a3b"), load_gpu("gb200")
    step = CAL.delta_net_state_step_s
    one = delta_net.state_pass_time(model, Layout(), gpu, 65536, False, step)
    sixteen = delta_net.state_pass_time(model, Layout(cp=16), gpu, 65536, False, step)
    assert sixteen == pytest.approx(one)  # the same sequential chunk steps with fewer heads per rank
    assert one == pytest.approx(3 * math.ceil(65536 / delta_net.CHUNK) * step)
    # four sequences of 32 heads (256 blocks of BV) fit one wave of 2 blocks per SM on GB200's 148; eight need two
    assert delta_net.state_pass_time(model, Layout(mbs=8, gbs=8), gpu, 8192, False, step) == pytest.approx(
        2 * delta_net.state_pass_time(model, Layout(mbs=4, gbs=4), gpu, 8192, False, step))
    # while the parallel work per rank falls by CP
    rate = 1e15
    assert delta_net.parallel_time(model, Layout(cp=16), 65536, rate, False) == pytest.approx(
        delta_net.parallel_time(model, Layout(), 65536, rate, False) / 16)
    assert delta_net.chunk_state_bytes(model, Layout(cp=4), 32768, 2) > 0
    assert delta_net.chunk_state_bytes(load_model("llama3-8b"), Layout(), 32768, 2) == 0


def test_qwen3_next_loses_throughput_with_cp_at_length():
    def tflops(cp, seq):
        layout = Layout(cp=cp, ep=32, gbs=max(1, 2 ** 21 // seq), dispatcher="hybridep")
        return estimate("qwen3-next-80b-a3b", "gb200", 32, seq, layout).tflops_per_gpu
    assert tflops(16, 65536) < 0.8 * tflops(4, 65536)


def test_the_held_out_pairs_are_predicted_in_the_right_direction_for_the_dispatcher():
    hybrid = next(p for p in load_knob_pairs() if p.name == "dsv3-gb200-deepep-hybridep")
    assert predicted_ratio(hybrid, CAL) > 1.02


def test_flex_dispatchers_send_a_token_once_per_rank_and_domain():
    """DeepEP/HybridEP deduplicate: one copy per distinct destination rank, one per distinct remote NVLink domain;
    NCCL's path sends every (token, expert) copy."""
    assert dispatcher_comm.distinct_destinations(1, 8) == 1.0
    assert dispatcher_comm.distinct_destinations(8, 1) == pytest.approx(1.0)
    assert dispatcher_comm.distinct_destinations(8, 8) == pytest.approx(8 * (1 - (7 / 8) ** 8))
    nvl, out = dispatcher_comm.flex_token_copies(ep=8, domains=1, topk=8)
    assert out == 0.0 and nvl < 8 * 7 / 8  # fewer copies than the 7 top-k copies that leave the rank
    assert sum(dispatcher_comm.alltoall_token_copies(8, 8, 0.0)) == pytest.approx(7.0)
    nvl, out = dispatcher_comm.flex_token_copies(ep=32, domains=4, topk=8)
    assert out == pytest.approx(4 * (1 - 0.75 ** 8) * 3 / 4) and out < 3  # at most one per other node


def test_an_ep_group_spans_ep_x_etp_consecutive_ranks_whatever_the_tp():
    """Megatron's expert grid is ETP-EP-EDP-PP: with TP 2, EP 8 still sits in one 8-GPU node (no scale-out);
    EP 16 spans two."""
    from search_spaces.cost.throughput import _ep_traffic, job_for

    model, h100 = load_model("qwen3-235b-a22b"), load_gpu("h100")
    for dispatcher in ("alltoall", "deepep"):
        one_node = job_for(model, h100, 64, 4096, Layout(tp=2, ep=8, pp=4, gbs=64, dispatcher=dispatcher))
        assert _ep_traffic(one_node)[1] == 0.0, dispatcher
        two_nodes = job_for(model, h100, 64, 4096, Layout(tp=2, ep=16, pp=4, gbs=64, dispatcher=dispatcher))
        assert _ep_traffic(two_nodes)[1] > 0.0, dispatcher


def test_the_ep_overlap_hides_the_all_to_all_on_the_microbatches_it_pairs():
    model, gpu = load_model("qwen3-30b-a3b"), load_gpu("h100")
    serial = Layout.from_dict(dict(ep=16, gbs=1024, dispatcher="hybridep", cuda_graphs="moe_router,moe_preprocess"))
    overlapped = serial.replace(ep_overlap=True)
    off, on = (estimate(model, gpu, 16, 4096, lay).time for lay in (serial, overlapped))
    assert on.ep_comm < 0.2 * off.ep_comm  # 64 microbatches: all but one paired
    assert on.dispatcher_overhead > off.dispatcher_overhead  # the dispatcher's SMs are held beside compute
    one = serial.replace(gbs=16)  # one microbatch per step: nothing to pair it with
    assert estimate(model, gpu, 16, 4096, one.replace(ep_overlap=True)).time.ep_comm == pytest.approx(
        estimate(model, gpu, 16, 4096, one).time.ep_comm)
