"""The layout space: legal members only, `fixed` honoured, counts consistent, fast, rules of thumb on top."""

import itertools

import pytest

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import MODEL_NAMES, load_model
from search_spaces.errors import SpecError
from search_spaces.layouts import space
from search_spaces.layouts.heuristics import rule_of_thumb_cp, seed_layouts
from search_spaces.layouts.layout import Layout
from search_spaces.layouts.rules import check
from search_spaces.layouts.space import candidate_layouts, count_space, explore

TINY, CPU = load_model("tiny-moe"), load_gpu("cpu")


def test_cpu_candidates_are_legal_and_honour_fixed_values():
    layouts = candidate_layouts(TINY, CPU, 4, 512, fixed={"precision": "fp32", "gbs": 8})
    assert layouts and len({lay.key() for lay in layouts}) == len(layouts)
    for layout in layouts:
        assert not check(TINY, CPU, 4, 512, layout), layout.key()
        assert layout.precision == "fp32" and layout.gbs == 8
        assert not layout.cuda_graphs and layout.optimizer_offload == 0
        assert layout.dispatcher in ("alltoall", "allgather")
    # the space explores the parallel dimensions, not just one of them
    assert {lay.pp for lay in layouts} >= {1, 2, 4} and {lay.ep for lay in layouts} >= {1, 2, 4}
    assert {lay.cp for lay in layouts} >= {1, 2}
    assert len(layouts) == count_space(TINY, CPU, 4, 512, fixed={"precision": "fp32", "gbs": 8}).legal


def test_fixed_parallel_fields_and_bad_fixed_values():
    layouts = candidate_layouts(TINY, CPU, 4, 512, fixed={"precision": "fp32", "gbs": 8, "pp": 2, "recompute": "none"})
    assert layouts and all(lay.pp == 2 and lay.recompute == "none" for lay in layouts)
    with pytest.raises(SpecError):
        candidate_layouts(TINY, CPU, 4, 512, fixed={"colour": "red"})
    with pytest.raises(SpecError):
        candidate_layouts(TINY, CPU, 4, 512, fixed={"precision": "fp7"})


# The feature rules that read grid fields too (the EP overlap reads EP and the schedule, the CP communication CP
# and the heads) are judged per grid: grids of one (TP, CP) differ in them, and a table kept per (TP, CP) once
# counted a third of DeepSeek-V3's legal layouts as illegal and ranked layouts the rules refuse
def test_each_grid_has_exactly_the_feature_combinations_that_check_finds_legal():
    model, gpu, num_gpus, seq_len = load_model("qwen3-30b-a3b"), load_gpu("h100"), 32, 8192
    fixed = {"precision": "bf16", "recompute": "none", "dispatcher": "deepep", "optimizer_offload": 0.0, "mbs": 1,
             "etp": 1}
    dims = space.dimensions(model, gpu, num_gpus, seq_len, fixed)
    base = {name: values[0] for name, values in dims.values.items()}
    combos = [dict(zip(space.FEATURE_FIELDS, values))
              for values in itertools.product(*(dims.values[name] for name in space.FEATURE_FIELDS))]
    grids = list(space.iter_grids(model, gpu, num_gpus, seq_len, dims))
    assert len({(g["pp"], g["vpp"], g["ep"]) for g in grids}) > 10 and len(combos) > 30
    table, legal_count = space._FeatureTable(model, gpu, num_gpus, seq_len, dims), 0
    for grid in grids:
        # without CP the space keeps cp_comm_type's first value (the others are counted as cp_comm_unused)
        layouts = (Layout(**{**base, **grid, **combo}) for combo in combos
                   if grid["cp"] > 1 or combo["cp_comm_type"] == base["cp_comm_type"])
        legal = {layout for layout in layouts if not check(model, gpu, num_gpus, seq_len, layout)}
        assert {Layout(**{**base, **grid, **combo}) for combo in table.get(grid)[0]} == legal, grid
        legal_count += len(legal)
    assert legal_count > 0
    assert count_space(model, gpu, num_gpus, seq_len, fixed).legal == legal_count


def test_counts_add_up():
    c = count_space(TINY, CPU, 4, 512, fixed={"gbs": 8})
    assert c.legal + sum(c.rejected_by_rule.values()) == c.total
    assert c.rejected_by_rule.get("world_dense", 0) > 0


@pytest.mark.timeout(120)
def test_dsv3_1024_h100_space_follows_the_rules_of_thumb():
    # its speed is a benchmark figure (bench/sweep_speed.py), not an assertion here
    d = explore("deepseek-v3", "h100", 1024, 131072, top=5).to_dict()
    assert d["legal_count"] > 0 and d["fitting_count"] > 0 and d["rejected_by_rule"]
    assert d["legal_count"] + sum(d["rejected_by_rule"].values()) == d["total"]
    assert len(d["top"]) == 5
    speeds = [t["prediction"]["tokens_per_sec_per_gpu"] for t in d["top"]]
    assert speeds == sorted(speeds, reverse=True)
    for row in d["top"]:
        lay = row["layout"]
        assert row["prediction"]["fits"]
        assert 2048 <= 131072 / (lay["cp"] * lay["tp"]) <= 8192  # rule 1: a ~4K shard per CP x TP rank
        assert lay["pp"] > 1 and lay["recompute"] != "full"  # rule 3: selective or none


def test_seed_layouts_follow_the_rules_of_thumb():
    seeds = seed_layouts("deepseek-v3", "h100", 256, 131072, limit=4)
    assert seeds
    for s in seeds:
        assert not check(load_model("deepseek-v3"), load_gpu("h100"), 256, 131072, s)
        assert s.optimizer_offload == 1.0  # rule 7: DSV3-class at 128K offloads the optimizer
        assert s.recompute_granularity == "selective" and "core_attn" not in s.recompute_modules
        assert s.precision == "fp8-blockwise" and s.dispatcher == "deepep"
    assert rule_of_thumb_cp(131072) == 32 and rule_of_thumb_cp(8192) == 1
    tiny = seed_layouts(TINY, CPU, 4, 512, gbs=8)
    assert tiny and all(s.precision == "fp32" and s.gbs == 8 for s in tiny)


def test_space_has_every_cp_communication_with_its_hierarchies():
    """Llama3-8B (8 KV heads) at CP16: p2p, allgather, and a2a+p2p split as 2x8, 4x4, 8x2; plain a2a cannot split
    8 KV heads 16 ways, and a hierarchy is counted as a rejection wherever it does not apply."""
    from search_spaces.layouts.space import candidate_layouts, count_space

    fixed = dict(tp=1, pp=1, cp=16, mbs=1, precision="bf16", recompute="none", cuda_graphs="none",
                 optimizer_offload=0.0)
    found = {(lay.cp_comm_type, lay.hierarchical_cp)
             for lay in candidate_layouts("llama3-8b", "h100", 16, 65536, fixed=fixed, gbs=16)}
    assert found == {("p2p", ()), ("allgather", ()), ("a2a+p2p", (2, 8)), ("a2a+p2p", (4, 4)), ("a2a+p2p", (8, 2))}
    counted = count_space("llama3-8b", "h100", 16, 65536, fixed=fixed, gbs=16)
    assert counted.legal == len(found) and counted.rejected_by_rule["hierarchical_cp"] > 0
    assert counted.rejected_by_rule["cp_a2a_heads"] > 0


def test_routing_is_searched_only_when_freed_and_forced_balance_never():
    """Token dropping changes what is trained: the space holds routing at dropless unless `free` names it; freed,
    it adds capacity:1.0 (legal with the dispatchers that pad); forced balance is never proposed, only fixed."""
    fixed = {"precision": "fp32", "gbs": 8}
    held = candidate_layouts(TINY, CPU, 4, 512, fixed=fixed)
    assert {lay.routing for lay in held} == {"dropless"}
    freed = candidate_layouts(TINY, CPU, 4, 512, fixed=fixed, free=["routing"])
    assert {lay.routing for lay in freed} == {"dropless", "capacity:1.0"}
    assert len(freed) == 2 * len(held) == count_space(TINY, CPU, 4, 512, fixed=fixed, free=["routing"]).legal
    assert all(not lay.benchmark_only() for lay in freed)
    forced = candidate_layouts(TINY, CPU, 4, 512, fixed={**fixed, "routing": "forced_balance"})
    assert forced and {lay.routing for lay in forced} == {"forced_balance"}
    # a dense model has no router to free; on GPUs DeepEP cannot pad to capacity
    assert {lay.routing for lay in candidate_layouts("llama3-8b", "h100", 8, 4096, free=["routing"], limit=200)} == {
        "dropless"}
    gpu = candidate_layouts("qwen3-30b-a3b", "h100", 8, 4096, free=["routing"],
                            fixed=dict(tp=1, cp=1, pp=1, ep=8, mbs=1, recompute="none", cuda_graphs="none",
                                       precision="bf16", optimizer_offload=0.0))
    assert ("capacity:1.0", "deepep") not in {(lay.routing, lay.dispatcher) for lay in gpu}
    assert ("capacity:1.0", "hybridep") in {(lay.routing, lay.dispatcher) for lay in gpu}
    # explore ranks both routings of a grid when freed
    top = explore("qwen3-30b-a3b", "h100", 8, 4096, free=["routing"], top=50,
                  fixed=dict(tp=1, cp=1, pp=1, ep=8, mbs=1, precision="bf16")).top
    assert {row["layout"]["routing"] for row in top} == {"dropless", "capacity:1.0"}


def _ranked_candidates(model_name: str, gpu_name: str, num_gpus: int, seq_len: int, grids: int):
    """The candidates `explore` estimates on the first `grids` grids that have any (its tables, its order)."""
    from search_spaces.layouts import space

    model, gpu = load_model(model_name), load_gpu(gpu_name)
    dims = space.dimensions(model, gpu, num_gpus, seq_len, None, None, ())
    table = space._FeatureTable(model, gpu, num_gpus, seq_len, dims)
    _, legal_grids = space._count(model, gpu, num_gpus, seq_len, dims, table)
    ranked = space._ranked_grids(model, gpu, num_gpus, seq_len, legal_grids, seq_len)
    for grid in [grid for grid in ranked if table.groups(grid)][:grids]:
        for group in table.groups(grid):
            for feats in group:
                yield model, gpu, grid, feats


# gpt-oss: sliding windows and attention sinks make p2p CP illegal (its candidates run a2a); DeepSeek-V3: p2p legal
@pytest.mark.parametrize("situation", [("gpt-oss-120b", "h100", 64, 131072, 12),
                                       ("deepseek-v3", "h100", 256, 65536, 4)])
def test_the_rankers_memory_probe_agrees_with_the_estimate_on_every_candidate(situation):
    from search_spaces.cost.costmodel import peak_memory_gib
    from search_spaces.layouts import space

    name, gpu_name, num_gpus, seq_len, grids = situation
    probe, checked, cp_fitting, keys = None, 0, 0, set()
    for model, gpu, grid, feats in _ranked_candidates(name, gpu_name, num_gpus, seq_len, grids):
        probe = probe or space._PeakProbe(model, gpu, num_gpus, seq_len, None)
        layout = space._layout({**grid, **feats})
        assert layout.key() not in keys  # the groups split a grid's combinations: the ranker counts each once
        keys.add(layout.key())
        assert not check(model, gpu, num_gpus, seq_len, layout), layout.key()  # the probe's premise
        peak = peak_memory_gib(model, gpu, num_gpus, seq_len, layout)
        fits = probe.fits(grid, feats)
        if abs(peak - gpu.memory_gib) > 1e-6:  # the probe sums the same terms in another order
            assert fits == (peak <= gpu.memory_gib), (layout.key(), peak)
        checked += 1
        cp_fitting += fits and layout.cp > 1
    assert checked > 100 and cp_fitting > 0


# the attention rules that refuse p2p CP (sinks, sliding windows) and a2a's head split must leave the rules of
# thumb a legal CP layout at long context, on every catalog model (but the CPU trainer's tiny ones: 4 layers, no
# 256-GPU layout)
@pytest.mark.parametrize("model", sorted(m for m in MODEL_NAMES if not m.startswith("tiny-")))
def test_rule_of_thumb_seeds_are_legal_and_use_cp_at_long_context(model):
    spec, gpu = load_model(model), load_gpu("h100")
    seeds = seed_layouts(spec, gpu, 256, 131072)
    assert seeds, model
    assert all(not check(spec, gpu, 256, 131072, layout) for layout in seeds)
    assert any(layout.cp > 1 for layout in seeds), [layout.key() for layout in seeds]
