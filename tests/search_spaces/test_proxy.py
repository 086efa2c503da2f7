"""Proxy trials (issue 12): the derivation rules one by one, the composition's algebra, the sweep's fidelity
choice, promote's refusal of a proxy-only winner and `confirm` (analytic here; the real trainer in
tests/orchestrator/test_proxy_local.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from search_spaces.calibration.calibration_file import calibration
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost.costmodel import estimate
from search_spaces.layouts.layout import Layout
from search_spaces.proxy import ProxyMeasurement, compose, derive_proxy

from orchestrator.commands.cli import main
from orchestrator.spec.schema import parse_spec
from orchestrator.sweep.fidelity import trial_size

DSV3, H100 = load_model("deepseek-v3"), load_gpu("h100")
QWEN, TINY, CPU = load_model("qwen3-235b-a22b"), load_model("tiny-moe"), load_gpu("cpu")
LONG = Layout.from_dict(dict(tp=1, cp=32, ep=32, pp=8, vpp=4, mbs=1, gbs=128, precision="fp8", dispatcher="deepep",
                             recompute="mla_up_proj,layernorm,moe,mlp", optimizer_offload=1.0, cp_comm_type="a2a+p2p",
                             hierarchical_cp="8,4"))
KEPT = ("tp", "cp", "cp_comm_type", "hierarchical_cp", "ep", "etp", "mbs", "recompute", "cuda_graphs", "precision",
        "dispatcher",
        "optimizer_offload", "vpp")


def test_every_per_gpu_shape_and_communication_pattern_is_kept():
    plan = derive_proxy(DSV3, LONG, H100, 1024)
    assert all(getattr(plan.layout, k) == getattr(LONG, k) for k in KEPT)
    assert plan.strictly_smaller and {c.field for c in plan.changes} == {"pp", "num_layers", "mtp_layers", "world",
                                                                         "gbs"}
    assert all(c.reason for c in plan.changes)


def test_pipeline_becomes_two_stages_of_the_heaviest_ranks_layers():
    plan = derive_proxy(DSV3, LONG, H100, 1024)
    assert plan.layout.pp == 2 and plan.layout.vpp == 4  # one stage boundary; interleaving kept
    full = _layers_per_rank(DSV3, LONG)
    assert plan.model.num_layers == 2 * max(full) and plan.heavy_rank in range(LONG.pp)
    no_pp = derive_proxy(QWEN, Layout(tp=4, ep=8, gbs=64), H100, 64)
    assert no_pp.layout.pp == 1 and no_pp.model.num_layers == QWEN.num_layers  # nothing to cut


def test_the_world_is_the_smallest_that_parallel_folding_allows():
    plan = derive_proxy(DSV3, LONG, H100, 1024)
    assert plan.world == math.lcm(LONG.tp * LONG.cp, LONG.ep * LONG.etp) * 2 == 64
    assert plan.layout.dp(plan.world) == 1 and plan.layout.edp(plan.world) == 1
    wide_ep = LONG.replace(tp=2, cp=16, ep=64, gbs=128)
    plan = derive_proxy(DSV3, wide_ep, H100, 1024)
    assert (plan.world, plan.layout.dp(plan.world), plan.layout.edp(plan.world)) == (128, 2, 1)


def test_enough_microbatches_for_the_steady_state():
    plan = derive_proxy(DSV3, LONG, H100, 1024)
    m = plan.layout.grad_accum(plan.world)
    assert m == 8 and m % plan.layout.pp == 0 and plan.layout.gbs == plan.layout.mbs * 1 * m
    few = derive_proxy(TINY.with_overrides(num_layers=8), Layout(pp=4, gbs=4), CPU, 8)  # full: 2 microbatches
    assert few.layout.grad_accum(few.world) == 2


def test_composing_a_cost_model_measurement_gives_the_cost_models_full_prediction():
    """If the proxy measured exactly what the cost model predicts for it, the composition must land near the
    cost model's prediction of the full layout: the algebra (bubble, re-sharding, modelled parts) is right."""
    for model, layout, gpu, world, seq in ((DSV3, LONG, H100, 1024, 131072),
                                           (QWEN, Layout(tp=4, cp=2, ep=8, pp=4, vpp=2, gbs=256), H100, 256, 8192),
                                           (TINY.with_overrides(num_layers=8), Layout(pp=4, ep=2, gbs=16), CPU, 8,
                                            256)):
        plan = derive_proxy(model, layout, gpu, world)
        proxy = estimate(plan.model, gpu, plan.world, seq, plan.layout)
        full = estimate(model, gpu, world, seq, layout)
        composed = compose(plan, _as_measured(proxy, plan, gpu, seq), gpu, seq)
        assert composed.step_time_s == pytest.approx(full.step_time_s, rel=0.10), layout.key()
        mem = full.memory.to_gib()
        parts = composed.memory_gib["measured"]
        assert parts["weights"] == pytest.approx(mem["weights"], rel=0.05)  # the same layers per rank
        assert parts["optimizer_states"] == pytest.approx(mem["optimizer_states"], rel=0.05)
        assert parts["activations"] == pytest.approx(mem["activations"], rel=0.10)
        assert set(composed.time_s) == {"measured", "modelled"} and composed.time_s["modelled"]


def _as_measured(est, plan, gpu, seq) -> ProxyMeasurement:
    """The cost model's view of the proxy as if measured: its step parts, and its first stage's memory (the
    one composition reads: it holds the most microbatches in flight)."""
    from search_spaces.cost.memory import rank_memory_breakdown

    mem = rank_memory_breakdown(plan.model, gpu, plan.world, seq, plan.layout, 0).to_gib()
    optimizer = est.time.optimizer + est.time.optimizer_offload
    return ProxyMeasurement(forward_backward_s=est.step_time_s - optimizer, optimizer_s=optimizer,
                            weights_gib=mem["weights"], gradients_gib=mem["gradients"],
                            optimizer_states_gib=mem["optimizer_states"],
                            activations_per_microbatch_gib=mem["activations_per_microbatch"],
                            host_cores=int(calibration().cpu_cores) if gpu.is_cpu else None)


def _layers_per_rank(model, layout) -> list[int]:
    from search_spaces.cost.pipeline import placement

    place = placement(model, layout.pp, layout.vpp)
    return [sum(1 for u in place.rank_units(r) if u.is_layer and not u.is_mtp) for r in range(layout.pp)]


# ---- the sweep's choice --------------------------------------------------------------------------------

# this module's sweep: trials of 2 GPUs on the 4-rank CPU cluster (sweep_spec: tests/conftest.py)
PROXIES = {"seed": 1, "trial_gpus": 2}


@pytest.mark.parametrize("fidelity, layout, expect", [
    ("auto", Layout(ep=2, gbs=8), ("proxy", 2)),  # DP 4 -> 2 ranks
    ("auto", Layout(ep=4, gbs=8), (None, 4)),  # EP 4 needs all 4 ranks: no smaller proxy, over trial_gpus
    ("full", Layout(ep=2, gbs=8), ("full", 4)),
])
def test_the_sweep_runs_full_size_when_it_fits_else_a_proxy(sweep_spec, fidelity, layout, expect):
    extra = {"fidelity": fidelity} if fidelity == "auto" else {"fidelity": fidelity, "trial_gpus": None}
    spec = parse_spec(sweep_spec("proxies", PROXIES, **extra))
    size = trial_size(spec, TINY, CPU, layout)
    assert (None if size.refusal else size.fidelity, size.world) == expect
    if size.refusal:
        assert "trial_gpus" in size.refusal


def test_trial_gpus_above_the_cluster_or_below_a_full_fidelity_is_refused(tmp_path, sweep_spec, capsys):
    for extra, words in (({"trial_gpus": 8}, "more than the target cluster"),
                         ({"fidelity": "full", "trial_gpus": 2}, "fidelity full")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(sweep_spec("proxies", PROXIES, **extra)))
        assert main(["sweep", str(path), "--quiet"]) == 2
        assert words in capsys.readouterr().err


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(600)
def test_promote_refuses_a_proxy_winner_until_confirm_measures_it_at_full_size(tmp_path, sweep_spec, capsys):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(sweep_spec("proxies", PROXIES, free=["ep", "pp", "mbs"])))
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert main(["sweep", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "proxy (2 GPUs)" in out and "GPU-h" in out
    assert main(["promote", "proxies", "--storage", storage, "--allow-estimated"]) == 2
    assert "only proxy measurements" in capsys.readouterr().err
    assert main(["confirm", "proxies", "--top", "2", "--storage", storage, "--quiet"]) == 2  # trial_gpus 2 < 4
    assert "--trial-gpus 4" in capsys.readouterr().err
    assert main(["confirm", "proxies", "--top", "2", "--storage", storage, "--trial-gpus", "4", "--quiet"]) == 0
    assert "composed from the proxy vs measured at full size" in capsys.readouterr().out
    assert main(["promote", "proxies", "--storage", storage, "--allow-estimated"]) == 0
    assert "composed from a proxy" not in capsys.readouterr().out
    assert main(["check", "proxies", "--storage", storage]) == 0


@pytest.mark.slow  # the example's full-scale sweep through the CLI with its stores
@pytest.mark.timeout(900)
def test_the_deepseek_example_shows_its_proxies_and_the_gpu_hours_saved(tmp_path, capsys):
    example = Path(__file__).resolve().parents[2] / "examples" / "deepseek-v3-128k-h100x1024.yaml"
    assert main(["sweep", str(example), "--backend", "analytic", "--trial-gpus", "64", "--n-trials", "12",
                 "--storage", f"sqlite:///{tmp_path / 'o.db'}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "proxy (64 GPUs)" in out or "proxy (32 GPUs)" in out
    # an analytic sweep's GPU time is what its trials would take: labelled predicted (issue 56)
    found = re.search(r"GPU time the trials would take \(predicted: nothing ran\): ([\d,.]+) GPU-h; the same trials "
                      r"at full size: ([\d,.]+)", out)
    used, full = (float(x.replace(",", "")) for x in found.groups())
    assert 0 < used < full / 4
