"""The real Megatron-Core trainer on CPU: multi-process gloo runs of tiny MoE models.

Every layout family runs once (tiny-qwen3-next and tiny-gpt-oss too); CP2, TP2 and DP2 must reproduce the
single-rank loss on the same data
(same initialisation, same global batch); recompute must lower the saved activations without changing the
loss; an injected OOM must come back as status oom with every rank gone.
"""

import pytest

from search_spaces.failures import read_records

from tests.trainer_helpers import (
    FAMILY_MODELS,
    LAYOUTS,
    RECOMPUTE_CHOICES,
    ROUTINGS,
    assert_ok,
    routing_run,
    run_trainer,
    shared_run,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def single_rank(tmp_path_factory):
    result, proc = shared_run(tmp_path_factory, "single")
    assert_ok(result, proc)
    return result


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["dp2", "tp2_sp", "cp2"])
def test_layouts_that_keep_the_initialisation_reproduce_the_single_rank_loss(tmp_path_factory, single_rank, name):
    result, proc = shared_run(tmp_path_factory, name)
    assert_ok(result, proc)
    assert result.loss == pytest.approx(single_rank.loss, rel=1e-4)
    assert result.loss[-1] < result.loss[0]
    applied = result.applied
    assert (applied["tp"], applied["cp"], applied["dp"]) == {"dp2": (1, 1, 2), "tp2_sp": (2, 1, 1),
                                                             "cp2": (1, 2, 1)}[name]
    if name == "tp2_sp":
        assert applied["sequence_parallel"] is True
    if name == "cp2":
        assert applied["core_attention"] == ["ContextParallelDotProductAttention"]
    if name == "dp2":  # the distributed optimizer shards Adam's states over DP
        assert result.memory_gib["optimizer_states"] == pytest.approx(single_rank.memory_gib["optimizer_states"] / 2,
                                                                      rel=0.02)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name, expect", [
    ("ep2_allgather", dict(ep=2, dp=2, edp=1, dispatcher=["MoEAllGatherTokenDispatcher"])),
    ("pp2_uneven", dict(pp=2, layers_per_rank=[3, 2], pipeline_split={"pipeline_model_parallel_layout": "Ettt|ttL"},
                        schedule="forward_backward_pipelining_without_interleaving")),
    ("pp2_vpp2", dict(pp=2, vpp=2, layers_per_rank=[2, 2], schedule="forward_backward_pipelining_with_interleaving")),
    ("ep2_pp2_recompute", dict(ep=2, pp=2, dp=2, edp=1, dispatcher=["MoEAlltoAllTokenDispatcher"],
                               layers_per_rank=[2, 2, 2, 2])),
])
def test_parallel_layouts_run_and_report_what_megatron_applied(tmp_path_factory, name, expect):
    result, proc = shared_run(tmp_path_factory, name)
    assert_ok(result, proc)
    assert result.loss[-1] < result.loss[0]
    for key, value in expect.items():
        assert result.applied[key] == value, key
    if name == "ep2_pp2_recompute":
        assert result.applied["recompute"]["modules"] == ["moe_act", "layernorm"]
    nproc = LAYOUTS[name][0]
    assert len(result.peak_memory_gib_per_rank) == nproc
    assert set(result.memory_gib) >= {"weights", "gradients", "optimizer_states", "activations_per_microbatch"}
    assert all(v > 0 for v in result.memory_gib.values())
    assert result.versions["megatron-core"].startswith("0.19.2")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", FAMILY_MODELS)
def test_new_layer_kinds_reproduce_the_single_rank_loss_under_cp2_and_tp2(tmp_path_factory, family):
    """Qwen3-Next's gated delta-net layers (Megatron's GatedDeltaNet: heads all-to-all'd over CP, split over
    TP) and gpt-oss's windows and sinks (the CPU stand-in for TE's attention) are exact under CP and TP."""
    single, proc = shared_run(tmp_path_factory, f"{family}_single")
    assert_ok(single, proc)
    assert single.loss[-1] < single.loss[0]
    for name, sizes in (("cp2", (1, 2)), ("tp2", (2, 1))):
        result, proc = shared_run(tmp_path_factory, f"{family}_{name}")
        assert_ok(result, proc)
        assert result.loss == pytest.approx(single.loss, rel=1e-4), name  # well within 1e-3
        assert (result.applied["tp"], result.applied["cp"]) == sizes
    if family == "qwen3_next":
        assert single.applied["attention"] == ["GatedDeltaNet", "SelfAttention"]
    else:
        assert single.applied["core_attention"] == ["ContextParallelDotProductAttention"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", FAMILY_MODELS)
def test_new_families_train_on_four_ranks_with_ep2_and_pp2_at_512_tokens(tmp_path_factory, family):
    result, proc = shared_run(tmp_path_factory, f"{family}_ep2_pp2_seq512")
    assert_ok(result, proc)
    assert result.seq_len == 512 and len(result.loss) == 3
    assert all(later < earlier for earlier, later in zip(result.loss, result.loss[1:])), result.loss
    for key, value in dict(ep=2, pp=2, dp=2, edp=1, layers_per_rank=[2, 2, 2, 2]).items():
        assert result.applied[key] == value, key


@pytest.mark.timeout(900)
def test_each_recompute_choice_lowers_saved_activations_and_keeps_the_loss(tmp_path_factory):
    def run(choice):
        result, proc = shared_run(tmp_path_factory, f"mla_recompute_{choice}")
        assert_ok(result, proc)
        return result

    base = run("none")
    for choice in RECOMPUTE_CHOICES[1:]:
        result = run(choice)
        assert result.loss == pytest.approx(base.loss, rel=1e-5), choice
        saved, before = result.memory_gib["activations_per_microbatch"], base.memory_gib["activations_per_microbatch"]
        assert saved < before, f"{choice}: {saved} >= {before}"
        expected = "full" if choice == "full" else "selective"
        assert result.applied["recompute"]["granularity"] == expected
    assert run("moe_act").applied["experts"] == ["TEGroupedMLP"]  # SequentialMLP would ignore moe_act


# The fault tests below, the refused run and the eager-import probe each keep a process of their own: the faults
# come from the environment of the whole process, and the refusal and the probe are about what a process imports
# before Megatron-Core starts.
@pytest.mark.timeout(180)
def test_injected_oom_on_one_rank_is_reported_and_every_rank_exits(tmp_path):
    result, proc = run_trainer(tmp_path, 2, "--mbs", "1", "--gbs", "2",
                               env={"MOE_AUTOTUNE_FAULT": "oom@1", "MOE_AUTOTUNE_FAULT_RANK": "1"}, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert result.status == "oom"
    assert result.error.startswith("rank 1: OutOfMemoryError")
    assert (result.failure_class, result.failure_rank) == ("oom", 1)


@pytest.mark.timeout(180)
def test_an_exception_on_rank_1_is_the_root_cause_not_rank_0s_reset(tmp_path):
    result, proc = run_trainer(tmp_path, 2, "--mbs", "1", "--gbs", "2",
                               env={"MOE_AUTOTUNE_FAULT": "raise@1", "MOE_AUTOTUNE_FAULT_RANK": "1"}, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (result.status, result.failure_class, result.failure_rank) == ("error", "error", 1)
    assert result.failure_reason == "RuntimeError: injected by MOE_AUTOTUNE_FAULT=raise@1 on rank 1"
    assert result.error.startswith("rank 1: RuntimeError: injected")
    # rank 0 failed as well, on the connection rank 1's exit closed: a symptom, recorded beside the result
    peers = {f.rank: f for f in read_records(tmp_path / "result.json")}
    assert (peers[0].failure_class, peers[1].failure_class) == ("communication", "error")
    assert "Connection closed by peer" in peers[0].reason or "Connection reset" in peers[0].reason


@pytest.mark.timeout(60)
def test_gpu_only_features_on_cpu_are_invalid_before_megatron_starts(tmp_path):
    result, proc = run_trainer(tmp_path, 1, "--precision", "fp8", "--dispatcher", "deepep")
    assert proc.returncode == 0
    assert result.status == "invalid"
    assert "gpu_only_feature" in result.error and "fp8" in result.error and "deepep" in result.error
    assert not result.loss and result.applied == {}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("routing, dispatcher", ROUTINGS)
def test_each_routing_mode_runs_on_cpu_and_is_reported_in_effect(tmp_path_factory, routing, dispatcher):
    """Megatron-Core's router options on CPU, EP2 of tiny-moe: the config in effect spells the routing asked for,
    and the experts' rows show it -- every token copy once (dropless, forced balance), padded to 1.5x the balanced
    share on every rank (capacity:1.5); the memory model's activations follow (within 5%)."""
    from search_spaces.cost.costmodel import estimate
    from search_spaces.layouts.layout import Layout

    # the two-rank shared launch: "--ep 2 --mbs 1 --gbs 2 --dispatcher DISPATCHER --routing ROUTING"
    result, proc = shared_run(tmp_path_factory, routing_run(routing, dispatcher))
    assert_ok(result, proc)  # validation would have marked a routing not in effect invalid
    assert result.applied["routing"] == routing
    load = result.applied["expert_load"]
    if routing.startswith("capacity"):
        assert load == {"busiest_over_mean": 1.0, "rows_per_routed_copy": pytest.approx(1.5, abs=0.02)}
    else:
        assert load["rows_per_routed_copy"] == 1.0 and 1.0 <= load["busiest_over_mean"] < 1.3
    layout = Layout.from_dict(result.layout)
    predicted = estimate("tiny-moe", "cpu", 2, result.seq_len, layout, with_time=False).memory.to_gib()
    measured = result.memory_gib["activations_per_microbatch"]
    assert predicted["activations_per_microbatch"] == pytest.approx(measured, rel=0.05)


EAGER_PROBE = """
import json, sys
from trainers.megatron_moe import main
code = main(sys.argv[1:])
import megatron.core.fusions.fused_bias_geglu as geglu
print(json.dumps({"code": code, "inductor": "torch._inductor.compile_fx" in sys.modules,
                  "plain": type(geglu.quick_gelu).__name__ == "function"
                  and not hasattr(geglu.quick_gelu, "_torchdynamo_orig_callable")}))
"""


@pytest.mark.timeout(300)
def test_on_cpu_megatron_jit_helpers_are_the_plain_functions_and_inductor_is_never_imported(tmp_path):
    """cpu_compat.compile_eagerly runs before Megatron-Core is imported: its torch.compile'd helpers are the functions
    themselves (run eagerly, as on CPU they must) and dynamo's inductor, about 1.2 s of every rank's start-up, is not
    loaded."""
    import json
    import subprocess
    import sys

    from tests.trainer_helpers import FAST, REPO

    argv = [sys.executable, "-c", EAGER_PROBE, "--model", "tiny-gpt-oss", *FAST, "--mbs", "2", "--gbs", "2",
            "--result", str(tmp_path / "result.json")]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"code": 0, "inductor": False, "plain": True}
