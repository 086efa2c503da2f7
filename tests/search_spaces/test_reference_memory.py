"""Every published layout fits as it ran (with the memory levers its config set), or names why not, with a source
(search_spaces/calibration/reference_memory.py); the memory levers' terms hold what search_spaces/cost/offload.py
says."""

from __future__ import annotations

import pytest

from search_spaces.calibration import reference
from search_spaces.calibration.reference_memory import MEMORY_GAPS, ROW_LEVERS, as_run, memory_gap, row_key
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost.costmodel import estimate
from search_spaces.layouts.layout import Layout

ROWS = reference.published_rows() + reference.long_context_moe_rows()


def _estimate(row):
    return estimate(row.spec(), row.gpu, row.num_gpus, row.seq_len, row.layout, with_time=False)


def test_every_published_row_fits_as_run_or_names_why():
    unexplained, closed = [], []
    for row in map(as_run, ROWS):
        est = _estimate(row)
        assert est.legal, (row_key(row), est.violations)
        if not est.fits and not memory_gap(row):
            unexplained.append((row_key(row), round(est.peak_memory_gib, 1)))
        if est.fits and memory_gap(row):
            closed.append(row_key(row))  # the gap closed: its entry must go
    assert unexplained == [] and closed == []


def test_the_lever_and_gap_tables_name_published_rows_with_sources():
    keys = {row_key(row) for row in ROWS}
    assert set(ROW_LEVERS) <= keys and set(MEMORY_GAPS) <= keys
    assert all(source for _, source in ROW_LEVERS.values()) and all(MEMORY_GAPS.values())
    # the levers are what the row lacked: without them the row does not fit, with them it does or names why
    qwen = next(row for row in ROWS if row_key(row) == ("qwen3-235b-a22b", "gb200", 256, 4096, "mxfp8", "moe_4k_more"))
    assert not _estimate(qwen).fits and _estimate(as_run(qwen)).fits


def test_the_rows_that_kept_fp8_weights_fit_with_them_and_not_without():
    """Bridge's fp8 recipes keep the weights in fp8 (fp8_param_gather): 1 B per parameter where bf16 weights and their
    cast cache take 3; the Llama rows fit only with it."""
    fp8_rows = [row for row in ROWS if ROW_LEVERS.get(row_key(row), ({},))[0].get("fp8_param_gather")]
    assert len(fp8_rows) == 6
    for row in fp8_rows:
        plain, kept = _estimate(row), _estimate(as_run(row))
        params = kept.memory.counts.params_on_rank
        assert kept.memory.weights == pytest.approx(params) and plain.memory.weights == pytest.approx(3 * params)
    llamas = [row for row in fp8_rows if row.model.startswith("llama")]
    assert len(llamas) == 3 and all(not _estimate(r).fits and _estimate(as_run(r)).fits for r in llamas)


def test_a_full_iteration_graph_holds_the_activations_once_plus_its_pool_excess():
    from search_spaces.cost.memory import FULL_ITERATION_POOL_EXCESS, GRAPH_SCOPE_BUFFER

    full = _mem(cuda_graphs="full_iteration", ep_overlap=False, pp=1, vpp=1, num_gpus=32, ep=8)
    assert full.memory.cuda_graphs == pytest.approx(FULL_ITERATION_POOL_EXCESS * full.memory.activations)
    assert _mem(cuda_graphs="attn,moe_router").memory.cuda_graphs == 2 * GRAPH_SCOPE_BUFFER  # other scopes as before
    # the tightest published row: Qwen3-30B-A3B on 8 GB300 at MBS 8 fits, and would not at 29% of its activations
    row = as_run(next(r for r in ROWS if row_key(r) == ("qwen3-30b-a3b", "gb300", 8, 4096, "mxfp8", "bridge-26.08")))
    est = _estimate(row)
    assert est.fits
    more = (0.29 - FULL_ITERATION_POOL_EXCESS) * est.memory.activations * 1.05 / 2**30
    assert est.peak_memory_gib + more > est.memory_capacity_gib


def test_the_deepseek_25_11_row_runs_its_configs_recompute():
    row = next(r for r in ROWS if row_key(r) == ("deepseek-v3-no-mtp", "gb200", 256, 4096, "bf16", "bridge-25.11"))
    assert row.layout.recompute == "none" and as_run(row).layout.recompute == "mla_up_proj"
    assert not _estimate(row).fits and _estimate(as_run(row)).fits


# ---- the levers' terms ------------------------------------------------------------------------------------------
QWEN = load_model("qwen3-235b-a22b")
BASE = dict(ep=32, pp=4, vpp=6, mbs=1, gbs=512, dispatcher="hybridep", precision="mxfp8")


def _mem(gpu="gb200", num_gpus=128, seq_len=4096, **fields):
    return estimate(QWEN, gpu, num_gpus, seq_len, Layout.from_dict({**BASE, **fields}), with_time=False)


def test_bf16_moments_halve_the_moments():
    fp32, bf16 = _mem(), _mem(optimizer_states="bf16")
    # mxfp8 keeps TE's fp32 master: 8 + 4 B per parameter become 4 + 4
    assert bf16.memory.optimizer_states == pytest.approx(fp32.memory.optimizer_states * 8 / 12)
    bf16_weights = _mem(precision="bf16"), _mem(precision="bf16", optimizer_states="bf16")
    # bf16 weights: the master copy becomes its 16-bit remainder too (8 + 4 -> 4 + 2)
    assert bf16_weights[1].memory.optimizer_states == pytest.approx(bf16_weights[0].memory.optimizer_states / 2)


def test_an_offloaded_input_leaves_the_gpu_for_the_host():
    off, on = _mem(), _mem(activation_offload="core_attn,attn_proj")
    moved = off.memory.activations - on.memory.activations
    assert moved > 0 and on.memory.offloaded_to_host > moved  # the host holds every microbatch's, the GPU 2 layers'
    half = _mem(activation_offload="core_attn,attn_proj", activation_offload_fraction=0.5)
    assert on.memory.activations < half.memory.activations < off.memory.activations
    assert half.memory.offloaded_to_host == pytest.approx(on.memory.offloaded_to_host / 2)
    # a recomputed module's input is not saved: nothing left to offload
    assert _mem(recompute="layernorm", activation_offload="qkv_linear").memory.offloaded_to_host == 0


def test_the_paged_stash_holds_the_average_not_the_busiest_rank():
    dropless, stash = _mem(routing="dropless"), _mem(routing="dropless", expert_stash="paged:1.5")
    assert stash.memory.activations < dropless.memory.activations
    forced = _mem(routing="forced_balance"), _mem(routing="forced_balance", expert_stash="paged:1.5")
    # balanced routing has no worst case to save: the pool's 10% headroom costs a little
    assert forced[0].memory.activations < forced[1].memory.activations < 1.1 * forced[0].memory.activations


def test_pinned_host_memory_is_a_budget_per_node():
    # 256K tokens, every module offloaded: more than a Grace tray's pinned half of 960 GB for 4 GPUs
    est = _mem(seq_len=262144, cp=8, gbs=128, mbs=1, activation_offload="attn_norm,qkv_linear,core_attn,attn_proj,"
               "mlp_norm,expert_fc1,moe_act", num_gpus=1024)
    assert est.legal and not est.fits and "pinned host memory" in est.host_memory_refusal
    assert "GB200 NVL72" in est.host_memory_refusal
    assert _mem().host_memory_refusal is None


def test_the_offload_copies_hide_behind_compute_where_the_host_link_keeps_up():
    """The offloaded inputs cross the host link down in the forward and back in the backward: NVLink-C2C (Grace)
    hides them behind the layers' compute, PCIe Gen5 (x86 DGX) does not hide the routed experts' inputs; without
    the offload nothing changes and time_s keeps its published keys."""
    experts = dict(activation_offload="expert_fc1,moe_act")
    plain_b200 = estimate(QWEN, "b200", 128, 4096, Layout.from_dict(BASE))
    b200 = estimate(QWEN, "b200", 128, 4096, Layout.from_dict({**BASE, **experts}))
    gb200 = estimate(QWEN, "gb200", 128, 4096, Layout.from_dict({**BASE, **experts}))
    assert gb200.time.activation_offload == 0 and b200.time.activation_offload > 0
    # the exposed copies lengthen every microbatch, so the pipeline's warm-up and drain too
    added = b200.time.activation_offload + b200.time.pipeline_bubble - plain_b200.time.pipeline_bubble
    assert b200.time.step == pytest.approx(plain_b200.time.step + added, rel=1e-9)
    assert "activation_offload" not in plain_b200.time.components() and "activation_offload" in b200.time.components()
    # the exposed time is what the copies outlast: at most each microbatch's bytes (no more than the host holds for
    # the microbatches in flight) down and back over the link; half the offload exposes less
    microbatches = Layout.from_dict(BASE).grad_accum(128)
    copies = 2 * b200.memory.offloaded_to_host * microbatches / (load_gpu("b200").host_link_gbps * 1e9)
    assert b200.time.activation_offload < copies
    half = estimate(QWEN, "b200", 128, 4096, Layout.from_dict({**BASE, **experts, "activation_offload_fraction": 0.5}))
    assert 0 <= half.time.activation_offload < b200.time.activation_offload
