"""Each legality rule: a layout that breaks it (the rule is named) and a close one that does not."""

import dataclasses

import pytest

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.layouts import rules
from search_spaces.layouts.layout import Layout
from search_spaces.layouts.rules import RULES, check


def rules_broken(model, gpu, n, seq, **fields):
    return {v.rule for v in check(load_model(model), load_gpu(gpu), n, seq, Layout.from_dict(fields))}


CASES = [
    # rule, (model, gpu, n, seq), breaking fields, legal fields
    ("world_dense", ("tiny-moe", "cpu", 4, 512), dict(pp=3), dict(pp=2)),
    ("world_expert", ("tiny-moe", "cpu", 4, 512), dict(ep=4, pp=2), dict(ep=2, pp=2)),
    ("pipeline_split", ("tiny-moe", "cpu", 8, 512), dict(pp=4, vpp=2), dict(pp=4, vpp=1)),
    ("vpp_needs_pp", ("tiny-moe", "cpu", 2, 512), dict(vpp=2), dict(pp=2, vpp=2)),
    ("heads_tp", ("tiny-moe", "cpu", 8, 512), dict(tp=8), dict(tp=4)),
    ("experts_ep", ("tiny-moe", "cpu", 8, 512), dict(ep=8), dict(ep=4)),
    ("expert_ffn_etp", ("tiny-moe", "h100", 3, 512), dict(etp=3), dict(etp=1)),
    ("dense_model_ep", ("llama3-8b", "h100", 8, 4096), dict(ep=2), dict()),
    ("sequence_cp", ("tiny-moe", "cpu", 2, 102), dict(cp=2), dict(cp=1)),
    ("cp_a2a_heads", ("tiny-moe", "h100", 8, 4096), dict(cp=8, cp_comm_type="a2a"), dict(cp=4, cp_comm_type="a2a")),
    ("global_batch", ("tiny-moe", "cpu", 2, 512), dict(gbs=3), dict(gbs=4)),
    # found by the trainer's drawn layouts (tests/trainers/test_layout_matrix.py): PP 2, VPP 3, one microbatch
    ("interleaved_microbatches", ("tiny-gpt-oss", "cpu", 4, 128), dict(pp=2, vpp=3, mbs=4, gbs=8),
     dict(pp=2, vpp=3, mbs=2, gbs=8)),
    ("moe_tp_needs_sp", ("tiny-moe", "cpu", 2, 512), dict(tp=2, sequence_parallel=False), dict(tp=2)),
    ("precision_supported", ("tiny-moe", "h100", 1, 512), dict(precision="mxfp8"), dict(precision="fp8")),
    ("gpu_only_feature", ("tiny-moe", "cpu", 2, 512), dict(ep=2, dispatcher="deepep"),
     dict(ep=2, dispatcher="allgather")),
    ("graph_recompute_conflict", ("tiny-moe", "h100", 1, 512), dict(recompute="moe", cuda_graphs="moe_router"),
     dict(recompute="moe_act", cuda_graphs="moe_router")),
    ("routing_needs_experts", ("llama3-8b", "h100", 8, 4096), dict(routing="capacity:1.0"), dict()),
    ("routing_dispatcher", ("tiny-moe", "h100", 2, 512), dict(ep=2, dispatcher="deepep", routing="capacity:1.25"),
     dict(ep=2, dispatcher="hybridep", routing="capacity:1.25")),
    ("routing_moe_graph", ("tiny-moe", "h100", 1, 512), dict(cuda_graphs="moe"),
     dict(cuda_graphs="moe", routing="capacity:1.0")),
    ("offload_needs_distopt", ("tiny-moe", "h100", 2, 512), dict(optimizer_offload=0.5, distributed_optimizer=False),
     dict(optimizer_offload=0.5)),
    ("activation_offload_modules", ("tiny-moe", "h100", 2, 512), dict(activation_offload="attn_proj"),
     dict(activation_offload="core_attn,attn_proj")),
    ("expert_stash_needs", ("tiny-moe", "h100", 2, 512), dict(ep=2, expert_stash="paged:1.5"),
     dict(ep=2, expert_stash="paged:1.5", dispatcher="hybridep")),
    ("optimizer_states_needs", ("tiny-moe", "h100", 2, 512), dict(optimizer_states="bf16", distributed_optimizer=False),
     dict(optimizer_states="bf16")),
    ("fp8_param_gather_needs", ("tiny-moe", "h100", 2, 512), dict(fp8_param_gather=True),
     dict(fp8_param_gather=True, precision="fp8-tensorwise")),
    ("ep_overlap_needs", ("tiny-moe", "h100", 2, 512), dict(ep=2, ep_overlap=True, recompute="moe"),
     dict(ep=2, ep_overlap=True, recompute="moe_act")),
    ("ep_overlap_schedule", ("tiny-moe", "h100", 4, 512), dict(ep=2, pp=2, gbs=2, ep_overlap=True),
     dict(ep=2, pp=2, vpp=2, gbs=4, ep_overlap=True)),
    ("tp_in_nvlink", ("deepseek-v3", "h100", 16, 4096), dict(tp=16), dict(tp=8, cp=2)),
    ("ep_in_nvlink", ("deepseek-v3", "h100", 128, 4096), dict(ep=128), dict(ep=64)),
    # tiny-qwen3-next: 2 key / 4 value delta-net heads, a 2*32 + 2*(64+4) = 200-wide in_proj (not 16-aligned)
    ("linear_heads_cp", ("tiny-qwen3-next", "cpu", 4, 512), dict(tp=2, cp=2), dict(cp=2)),
    ("linear_fp8_align", ("tiny-qwen3-next", "h100", 1, 512), dict(precision="fp8"), dict(precision="bf16")),
    ("expert_bias_etp", ("tiny-gpt-oss", "h100", 2, 512), dict(etp=2), dict(ep=2)),
    ("cp_window_sinks", ("tiny-gpt-oss", "h100", 2, 512), dict(cp=2, cp_comm_type="allgather"),
     dict(cp=2, cp_comm_type="a2a")),
    # Qwen3-Next's 256-wide full-attention heads on Blackwell: TE's fused CP attention runs p2p and all_gather only
    ("cp_wide_heads", ("qwen3-next-80b-a3b", "gb200", 32, 32768), dict(cp=4, ep=8, cp_comm_type="a2a"),
     dict(cp=4, ep=8, cp_comm_type="p2p")),
    ("hierarchical_cp", ("deepseek-v3", "h100", 64, 65536), dict(cp=16, cp_comm_type="a2a+p2p", hierarchical_cp="8,4"),
     dict(cp=16, cp_comm_type="a2a+p2p", hierarchical_cp="8,2")),
]


def test_wide_heads_are_free_off_blackwell_and_for_mla():
    # Hopper runs them through FlashAttention's CP path; MLA's 192/128 heads are not 256 wide
    assert "cp_wide_heads" not in rules_broken("qwen3-next-80b-a3b", "h100", 32, 32768, cp=4, ep=8, cp_comm_type="a2a")
    assert "cp_wide_heads" not in rules_broken("deepseek-v3", "gb200", 256, 32768, cp=4, ep=64, cp_comm_type="a2a")


def test_every_rule_has_a_case():
    assert {c[0] for c in CASES} == set(RULES)


@pytest.mark.parametrize("rule,where,bad,good", CASES, ids=[c[0] for c in CASES])
def test_rule(rule, where, bad, good):
    assert rule in rules_broken(*where, **bad)
    assert rule not in rules_broken(*where, **good)


def test_reasons_are_one_human_line():
    for v in check(load_model("tiny-moe"), load_gpu("cpu"), 4, 512, Layout(tp=3, pp=3, precision="fp8")):
        assert v.reason and "\n" not in v.reason and v.to_dict() == {"rule": v.rule, "reason": v.reason}


@pytest.mark.parametrize("fields", [dict(precision="fp8"), dict(cuda_graphs="attn"), dict(optimizer_offload=0.5),
                                    dict(cp=2, cp_comm_type="a2a"), dict(ep=2, ep_overlap=True)])
def test_cpu_refuses_gpu_only_features(fields):
    assert "gpu_only_feature" in rules_broken("tiny-moe", "cpu", 2, 512, **fields)


def test_cpu_accepts_its_own_paths():
    assert not rules_broken("tiny-moe", "cpu", 4, 512, tp=1, cp=2, ep=2, pp=2, gbs=2, precision="fp32")
    assert not rules_broken("tiny-moe", "cpu", 2, 512, cp=2, cp_comm_type="allgather", gbs=1)


def test_uneven_pipeline_splits_of_the_seed_recipes_are_legal():
    # Qwen3-235B: 94 layers over PP4 x VPP12 (embedding and loss count as layers); DeepSeek-V3: 61 + MTP over PP8 x VPP4
    assert "pipeline_split" not in rules_broken("qwen3-235b-a22b", "gb200", 256, 131072, tp=4, cp=4, ep=32, pp=4,
                                                vpp=12,
                                                gbs=64)
    assert "pipeline_split" not in rules_broken("deepseek-v3", "h100", 256, 131072, cp=32, ep=32, pp=8, vpp=4, gbs=128)


def test_layer_kind_rules_follow_megatron_and_transformer_engine():
    # the real models: Qwen3-Next's 16/32 delta-net heads split over TP*CP up to 16; 12352-wide in_proj is fp8-
    # and mxfp8-aligned; gpt-oss's sinks need a2a CP on GPUs, its sliding windows alone would take allgather
    assert "linear_heads_cp" not in rules_broken("qwen3-next-80b-a3b", "h100", 64, 131072, tp=2, cp=8, ep=4)
    assert "linear_heads_cp" in rules_broken("qwen3-next-80b-a3b", "h100", 64, 131072, tp=4, cp=8, ep=2)
    assert "linear_fp8_align" not in rules_broken("qwen3-next-80b-a3b", "b200", 8, 4096, ep=8, precision="mxfp8")
    assert "cp_window_sinks" in rules_broken("gpt-oss-120b", "h100", 8, 65536, cp=8, cp_comm_type="p2p")
    assert not rules_broken("gpt-oss-120b", "h100", 8, 65536, cp=8, cp_comm_type="a2a")
    windows_only = {v.rule for v in check(dataclasses.replace(load_model("gpt-oss-120b"), attention_sinks=False),
                                          load_gpu("h100"), 8, 65536, Layout(cp=8, cp_comm_type="allgather"))}
    assert "cp_window_sinks" not in windows_only
    # on cpu the trainer's own CP attention all-gathers K/V with windows and sinks: no TE limit applies
    assert "cp_window_sinks" not in rules_broken("tiny-gpt-oss", "cpu", 2, 512, cp=2)


@pytest.mark.parametrize("fields,why", [
    (dict(cp=16, cp_comm_type="a2a+p2p"), "needs hierarchical_cp"),  # Megatron asserts the sizes for a2a+p2p
    (dict(cp=16, cp_comm_type="p2p", hierarchical_cp="8,2"), "only used by cp_comm_type a2a+p2p"),
    (dict(cp=16, cp_comm_type="a2a+p2p", hierarchical_cp="2,2,4"), "needs hierarchical_cp A,P"),
    (dict(cp=32, cp_comm_type="a2a+p2p", hierarchical_cp="16,2"), "must divide the heads"),  # 8 KV heads
])
def test_hierarchical_cp_says_why(fields, why):
    violations = check(load_model("llama3-8b"), load_gpu("h100"), 64, 131072, Layout.from_dict(fields))
    assert [v.reason for v in violations if v.rule == "hierarchical_cp" and why in v.reason], violations


def test_a2a_needs_the_kv_heads_to_split_too():
    # Llama3-8B: 32 heads, 8 KV heads: Transformer Engine's a2a splits both
    assert "cp_a2a_heads" in rules_broken("llama3-8b", "h100", 16, 65536, cp=16, cp_comm_type="a2a")
    assert "cp_a2a_heads" in rules_broken("llama3-8b", "h100", 16, 65536, cp=8, tp=2, cp_comm_type="a2a")  # 4 KV/TP
    assert "cp_a2a_heads" not in rules_broken("llama3-8b", "h100", 8, 65536, cp=8, cp_comm_type="a2a")


# ---- the registry: a rule's declaration is what the enumeration relies on ---------------------------------------
class _Recorder:
    """A layout that records which fields are read, through its properties and methods too."""

    def __init__(self, layout: Layout):
        self._layout, self.read = layout, set()

    def __getattr__(self, name):
        attr = getattr(type(self._layout), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if callable(attr) and not isinstance(attr, type):
            return lambda *a, **k: attr(self, *a, **k)
        self.read.add(name)
        return getattr(self._layout, name)


def _situations():
    """Every layout of the cases above (breaking and legal), so that each rule's branches are taken."""
    for _, (model, gpu, n, seq), bad, good in CASES:
        for fields in (bad, good):
            yield rules.Situation(load_model(model), load_gpu(gpu), n, seq, Layout.from_dict(fields))


@pytest.mark.parametrize("rule", rules.REGISTRY, ids=[r.name for r in rules.REGISTRY])
def test_a_rule_reads_only_the_fields_it_declares(rule):
    # the enumeration caches a level's verdict keyed by its rules' declared fields: an undeclared read would
    # cache a wrong verdict for every grid that differs only in that field
    read = set()
    for s in _situations():
        recorder = _Recorder(s.layout)
        rule.test(dataclasses.replace(s, layout=recorder))
        read |= recorder.read
    assert read <= set(rule.reads), f"{rule.name} reads {sorted(read - set(rule.reads))} it does not declare"
    assert read, f"{rule.name} declares {rule.reads} but read nothing over the cases"


def test_a_level_rule_reads_only_fields_fixed_by_its_level():
    from search_spaces.layouts.space import GRID_FIELDS

    fixed_by = {"pipe": {"pp", "vpp"}, "tp": {"tp"}, "cp": {"cp"}, "ep": {"ep", "etp"}, "mbs": {"mbs"}}
    known: set[str] = set()
    for level in rules.LEVELS:
        known |= fixed_by[level]
        for name in rules.level_rules(level):
            reads = set(next(r for r in rules.REGISTRY if r.name == name).reads) & set(GRID_FIELDS)
            assert reads <= known, f"{name} at level {level} reads {sorted(reads - known)}, enumerated later"


def test_declaration_order_is_check_order_and_names_are_unique():
    assert rules.RULES == tuple(r.name for r in rules.REGISTRY) and len(set(rules.RULES)) == len(rules.RULES)
    broken = check(load_model("tiny-moe"), load_gpu("cpu"), 4, 512, Layout(tp=3, pp=3, ep=3, precision="fp8"))
    order = [rules.RULES.index(v.rule) for v in broken]
    assert len(broken) >= 3 and order == sorted(order)


def test_a_rule_declared_twice_or_reading_an_unknown_field_is_refused():
    with pytest.raises(ValueError):
        rules.rule("world_dense", why="again", reads=("tp",))
    with pytest.raises(ValueError):
        rules.rule("new_rule", why="typo", reads=("tensor_parallel",))


@pytest.mark.parametrize("fields,why", [
    (dict(ep_overlap=True), "needs expert parallelism"),
    (dict(ep=2, ep_overlap=True, dispatcher="allgather"), "not allgather"),
    (dict(ep=2, ep_overlap=True, recompute="full", cuda_graphs="full_iteration"), "no full or moe recompute"),
    (dict(ep=2, pp=2, ep_overlap=True, gbs=2), "VPP > 1"),
    (dict(ep=2, ep_overlap=True, cuda_graphs="moe", routing="capacity:1.0"), "moe/mlp CUDA-graph"),
])
def test_ep_overlap_says_why(fields, why):
    # Megatron-Core 0.19.2's TransformerConfig asserts each of these (tests/orchestrator/test_consumers.py builds the
    # legal ones)
    violations = check(load_model("tiny-moe"), load_gpu("h100"), 4, 512, Layout.from_dict(fields))
    assert any(v.rule.startswith("ep_overlap") and why in v.reason for v in violations), violations


def test_ep_overlap_allows_what_megatron_allows():
    assert not {"ep_overlap_needs", "ep_overlap_schedule"} & rules_broken(
        "tiny-moe", "h100", 4, 512, ep=2, pp=2, vpp=2, gbs=4, ep_overlap=True, dispatcher="hybridep",
        recompute="moe_act", cuda_graphs="attn,moe_router,moe_preprocess")
    # DeepSeek-V3's one MTP layer is allowed, two are not
    dsv3, layout = load_model("deepseek-v3"), Layout(ep=64, ep_overlap=True)
    assert "ep_overlap_needs" not in {v.rule for v in check(dsv3, load_gpu("h100"), 64, 4096, layout)}
    two = {v.rule for v in check(dataclasses.replace(dsv3, mtp_layers=2), load_gpu("h100"), 64, 4096, layout)}
    assert "ep_overlap_needs" in two


# ---- the memory levers (issue 29), held to Megatron-Core 0.19.2's own checks ----------------------------------------
@pytest.mark.parametrize("fields,why", [
    (dict(activation_offload="attn_proj"), "without core_attn"),
    (dict(ep=2, activation_offload="moe_act", recompute="moe"), "whole moe is recomputed"),
    (dict(ep=2, activation_offload="fused_group_mlp,expert_fc1"), "not with expert_fc1 or moe_act"),
    (dict(ep=2, dispatcher="hybridep", expert_stash="paged:1.5", activation_offload="expert_fc1"), "paged stash"),
    (dict(activation_offload="core_attn", cuda_graphs="moe", routing="capacity:1.0"), "moe CUDA-graph scope"),
    (dict(activation_offload_fraction=0.5), "none are set"),
])
def test_activation_offload_says_why(fields, why):
    violations = check(load_model("tiny-moe"), load_gpu("h100"), 4, 512, Layout.from_dict(fields))
    assert any(v.rule == "activation_offload_modules" and why in v.reason for v in violations), violations


def test_expert_modules_need_experts_and_the_levers_need_a_gpu():
    assert "activation_offload_modules" in rules_broken("llama3-8b", "h100", 8, 4096, activation_offload="moe_act")
    assert "expert_stash_needs" in rules_broken("llama3-8b", "h100", 8, 4096, expert_stash="paged:1.5")
    for fields in (dict(activation_offload="core_attn"), dict(optimizer_states="bf16")):
        assert "gpu_only_feature" in rules_broken("tiny-moe", "cpu", 2, 512, **fields)


def _mcore_lever_verdict(model, layout: Layout) -> str | None:
    """What Megatron-Core 0.19.2 says of the layout's lever fields, as the trainer builds them: None when
    TransformerConfig and OptimizerConfig accept them, else the refusal."""
    import warnings

    from megatron.core.optimizer.optimizer_config import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    from trainers import config as trainer_config

    kwargs = trainer_config.transformer_config_kwargs(model, layout, on_cpu=False, have_te=True)
    lever = {k: kwargs[k] for k in ("fine_grained_activation_offloading", "offload_modules",
                                    "activation_offload_fraction", "fine_grained_offloading_max_inflight_offloads",
                                    "moe_paged_stash", "moe_expert_rank_capacity_factor",
                                    "use_transformer_engine_op_fuser", "moe_token_dispatcher_type",
                                    "moe_flex_dispatcher_backend", "moe_expert_capacity_factor",
                                    "moe_pad_expert_input_to_capacity") if k in kwargs}
    if layout.fp8_param_gather:  # fp8 weights: TransformerConfig's check of fp8, megatron.training's of the optimizer
        return _megatron_lm_verdict(model, layout)
    recompute = {"recompute_granularity": "selective", "recompute_modules": list(layout.recompute_modules)} \
        if layout.recompute_modules else {}
    graphs = {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": list(layout.cuda_graphs)} \
        if layout.cuda_graphs else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=4, moe_router_topk=2,
                              moe_ffn_hidden_size=32, expert_model_parallel_size=layout.ep, moe_grouped_gemm=True,
                              **lever, **recompute, **graphs)
            OptimizerConfig(**{k: v for k, v in trainer_config.optimizer_config_kwargs(layout).items()
                               if k in ("use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype",
                                        "use_distributed_optimizer", "optimizer")})
    except (AssertionError, ValueError) as refused:
        return str(refused) or "refused"
    except (ImportError, RuntimeError) as unavailable:  # a kernel library this CPU machine lacks: not a refusal
        return None if "Transformer" in str(unavailable) or "cuda" in str(unavailable).lower() else str(unavailable)
    return None


def _megatron_lm_verdict(model, layout: Layout) -> str | None:
    """What Megatron-LM 0.19.2 says of the layout's flags (orchestrator/outputs/export/megatron_lm.py): validate_args
    (fp8_param_gather only
    with the distributed optimizer; with optimizer offload only the delayed recipe), then the TransformerConfig it
    builds (fp8_param only with fp8), on an H100's answers (tests/bridge_config.py)."""
    import argparse
    import os
    import warnings

    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.training.argument_utils import core_transformer_config_from_args
    from megatron.training.arguments import add_megatron_arguments, validate_args

    from orchestrator.outputs import export
    from tests import bridge_config

    argv = export.megatron_args(layout, model, 512) + [
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "10", "--lr", "1e-4", "--no-rope-fusion",
        "--vocab-size", str(model.vocab_size)]
    saved = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # the launch script's
    try:
        with bridge_config.on_h100_node(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)).parse_args(argv)
            args.world_size, args.rank = 4, 0
            validate_args(args)
            core_transformer_config_from_args(args, TransformerConfig)
    except (AssertionError, ValueError) as refused:
        return str(refused) or "refused"
    finally:
        if saved is None:
            os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS")
        else:
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = saved
    return None


LEVER_RULES = {"activation_offload_modules", "expert_stash_needs", "optimizer_states_needs", "fp8_param_gather_needs"}


@pytest.mark.parametrize("fields", [
    dict(activation_offload="attn_proj"), dict(activation_offload="core_attn,attn_proj"),
    dict(activation_offload="attn_norm,qkv_linear,mlp_norm", activation_offload_fraction=0.5),
    dict(activation_offload="moe_act", recompute="moe"), dict(activation_offload="moe_act", recompute="moe_act"),
    dict(activation_offload="expert_fc1,moe_act"), dict(activation_offload="fused_group_mlp,moe_act"),
    dict(activation_offload="core_attn", cuda_graphs="moe", routing="capacity:1.0"),
    dict(activation_offload="core_attn", cuda_graphs="attn,moe_router"),
    dict(dispatcher="hybridep", expert_stash="paged:1.5"), dict(dispatcher="deepep", expert_stash="paged:1.5"),
    dict(dispatcher="hybridep", expert_stash="paged:1.5", activation_offload="moe_act"),
    dict(dispatcher="hybridep", expert_stash="paged:1.2", activation_offload="core_attn,attn_proj"),
    dict(optimizer_states="bf16"), dict(optimizer_states="bf16", distributed_optimizer=False),
    dict(precision="fp8-tensorwise", fp8_param_gather=True), dict(precision="bf16", fp8_param_gather=True),
    dict(precision="fp8-blockwise", fp8_param_gather=True, distributed_optimizer=False),
    dict(precision="fp8-tensorwise", fp8_param_gather=True, optimizer_offload=0.5),
    dict(precision="fp8-delayed", fp8_param_gather=True, optimizer_offload=0.5),
], ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_the_lever_rules_agree_with_megatron_core(fields):
    """Our rules refuse a lever setting exactly when Megatron-Core's configs do (the trainer's fields)."""
    model = load_model("tiny-moe")
    layout = Layout.from_dict({"ep": 2, "gbs": 4, **fields})
    ours = {v.rule for v in check(model, load_gpu("h100"), 4, 512, layout)} & LEVER_RULES
    theirs = _mcore_lever_verdict(model, layout)
    assert bool(ours) == (theirs is not None), (ours, theirs)
