"""Each legality rule: a layout that breaks it (the rule is named) and a close one that does not."""

import dataclasses

import pytest

from search_spaces.hardware import load_gpu
from search_spaces.layout import Layout
from search_spaces.models import load_model
from search_spaces import rules
from search_spaces.rules import RULES, check


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
    ("moe_tp_needs_sp", ("tiny-moe", "cpu", 2, 512), dict(tp=2, sequence_parallel=False), dict(tp=2)),
    ("precision_supported", ("tiny-moe", "h100", 1, 512), dict(precision="mxfp8"), dict(precision="fp8")),
    ("gpu_only_feature", ("tiny-moe", "cpu", 2, 512), dict(ep=2, dispatcher="deepep"), dict(ep=2, dispatcher="allgather")),
    ("graph_recompute_conflict", ("tiny-moe", "h100", 1, 512), dict(recompute="moe", cuda_graphs="moe_router"),
     dict(recompute="moe_act", cuda_graphs="moe_router")),
    ("routing_needs_experts", ("llama3-8b", "h100", 8, 4096), dict(routing="capacity:1.0"), dict()),
    ("routing_dispatcher", ("tiny-moe", "h100", 2, 512), dict(ep=2, dispatcher="deepep", routing="capacity:1.25"),
     dict(ep=2, dispatcher="hybridep", routing="capacity:1.25")),
    ("routing_moe_graph", ("tiny-moe", "h100", 1, 512), dict(cuda_graphs="moe"),
     dict(cuda_graphs="moe", routing="capacity:1.0")),
    ("offload_needs_distopt", ("tiny-moe", "h100", 2, 512), dict(optimizer_offload=0.5, distributed_optimizer=False),
     dict(optimizer_offload=0.5)),
    ("ep_overlap_needs", ("tiny-moe", "h100", 2, 512), dict(ep=2, ep_overlap=True, recompute="moe"),
     dict(ep=2, ep_overlap=True, recompute="moe_act")),
    ("ep_overlap_schedule", ("tiny-moe", "h100", 4, 512), dict(ep=2, pp=2, gbs=2, ep_overlap=True),
     dict(ep=2, pp=2, vpp=2, gbs=2, ep_overlap=True)),
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
    assert "pipeline_split" not in rules_broken("qwen3-235b-a22b", "gb200", 256, 131072, tp=4, cp=4, ep=32, pp=4, vpp=12,
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
    from search_spaces.space import GRID_FIELDS

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
    # Megatron-Core 0.19.2's TransformerConfig asserts each of these (tests/test_consumers.py builds the legal ones)
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
