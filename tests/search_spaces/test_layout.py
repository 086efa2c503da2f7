"""Layout: validation, recompute spellings, derived sizes, and the flag round trip through `estimate`."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout, parse_recompute

from orchestrator.commands.cli import main


def test_derived_sizes_with_parallel_folding():
    lay = Layout(tp=1, cp=32, ep=32, pp=8, vpp=4, gbs=128)
    assert lay.dp(256) == 1 and lay.edp(256) == 1 and lay.grad_accum(256) == 128
    assert lay.dp(512) == 2 and lay.edp(512) == 2  # EP can exceed DP: experts have their own grid
    assert Layout(pp=3).dp(4) == 0 and Layout(mbs=2, gbs=6).grad_accum(2) == 0


def test_recompute_spellings():
    lay = Layout.from_dict({"recompute": "up_proj,norm,moe,mlp"})
    assert lay.recompute_modules == ("mla_up_proj", "layernorm", "moe", "mlp")
    assert lay.recompute_granularity == "selective"
    assert Layout.from_dict({"recompute": "full"}).recompute == "full"
    assert parse_recompute("none") == "none" and parse_recompute(["norm", "moe"]) == "layernorm,moe"
    with pytest.raises(SpecError):
        Layout.from_dict({"recompute": "full,moe"})
    with pytest.raises(SpecError):
        Layout.from_dict({"recompute": "everything"})


@pytest.mark.parametrize("bad", [dict(tp=0), dict(mbs=3, gbs=4), dict(precision="fp4"), dict(dispatcher="x"),
                                 dict(optimizer_offload=2), dict(cuda_graphs="everything"), dict(cp_comm_type="ring"),
                                 # strict types: no float, bool or text for an integer, no number for a name
                                 dict(tp=1.7), dict(tp=2.0), dict(tp=True), dict(tp="2"), dict(tp=float("inf")),
                                 dict(cuda_graphs=5), dict(cuda_graphs=[5]), dict(precision=16),
                                 dict(optimizer_offload=float("nan")), dict(optimizer_offload=True),
                                 dict(distributed_optimizer="yes"), dict(recompute=3)])
def test_invalid_layouts_raise_spec_error(bad):
    with pytest.raises(SpecError) as err:
        Layout(**bad)
    name = next(iter(bad))
    assert name in str(err.value) or name == "mbs", err.value  # the line names the field


def test_every_dimension_round_trips_through_its_encoding():
    from search_spaces.layouts.layout import BY_NAME, DIMENSIONS

    layout = Layout.from_dict(dict(tp=2, cp=4, ep=8, etp=2, pp=4, vpp=2, mbs=2, gbs=64, recompute="moe_act,norm",
                                   cuda_graphs="attn,moe_router", precision="fp8", dispatcher="deepep",
                                   cp_comm_type="a2a+p2p", optimizer_offload=0.5, distributed_optimizer=False,
                                   sequence_parallel=False, routing="capacity:1.25"))
    params = layout.params()
    assert set(params) == {d.name for d in DIMENSIONS}
    assert all(isinstance(v, (int, float, str, bool)) for v in params.values())
    assert Layout.from_params(params) == layout
    # as text (a CSV cell, an MLflow param, a flag value)
    assert Layout.from_params({k: str(v) for k, v in params.items()}) == layout
    assert BY_NAME["sequence_parallel"].decode("auto") is None
    with pytest.raises(SpecError, match="tp"):
        Layout.from_params({"tp": "1.7"})


def test_routing_is_a_mode_with_an_optional_factor():
    from search_spaces.layouts.layout import BY_NAME, DEFAULT_FREE, SEARCH_DIMENSIONS

    dim = BY_NAME["routing"]
    assert Layout().routing == "dropless"  # Megatron-Core's default: no token dropped
    assert Layout(routing="Capacity:1.25").routing == "capacity:1.25" and Layout(routing="capacity:1").routing == \
        "capacity:1.0"
    assert Layout(routing="force_balance").routing == "forced_balance"  # the skill cards' spelling
    assert (dim.mode("capacity:1.25"), dim.parameter("capacity:1.25")) == ("capacity", 1.25)
    assert dim.values_text() == "dropless | capacity:F | forced_balance"
    for bad, words in (("capacity", "needs a number"), ("capacity:0", "needs F in"), ("capacity:inf", "needs F in"),
                       ("dropless:2", "takes no number"), ("balanced", "unknown routing")):
        with pytest.raises(SpecError, match=words):
            Layout(routing=bad)
    # searchable but opt-in: a sweep varies it only when asked; keys stay as they were at the default
    assert "routing" in SEARCH_DIMENSIONS and "routing" not in DEFAULT_FREE
    assert "routing" not in Layout().key() and "routing=capacity:1.25" in Layout(routing="capacity:1.25").key()
    # forced balance is for benchmarks only
    assert Layout(routing="forced_balance").benchmark_only() == ["routing=forced_balance"]
    assert Layout(routing="capacity:1.0").benchmark_only() == Layout().benchmark_only() == []


def test_sequence_parallel_follows_tp():
    assert Layout(tp=2).sp and not Layout().sp and not Layout(tp=2, sequence_parallel=False).sp


@pytest.mark.parametrize("layout", [
    Layout.from_dict(dict(tp=1, cp=32, ep=32, pp=8, vpp=4, gbs=128, precision="fp8", dispatcher="deepep",
                          recompute="mla_up_proj,layernorm,moe,mlp", optimizer_offload=1.0, cp_comm_type="a2a+p2p")),
    Layout.from_dict(dict(pp=2, gbs=8, recompute="full", recompute_method="block", recompute_num_layers=2,
                          cuda_graphs="full_iteration", distributed_optimizer=False)),
    Layout.from_dict(dict(tp=2, gbs=8, sequence_parallel=False)),
])
def test_to_flags_round_trips_through_estimate(layout, capsys):
    rc = main(["estimate", "--model", "deepseek-v3", "--gpu", "h100", "--num-gpus", "256", "--seq-len", "131072",
               *layout.to_flags(), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert Layout.from_dict(out["layout"]) == layout
    assert rc == (0 if out["legal"] else 2)


def test_full_recompute_keeps_method_and_layer_count():
    from search_spaces.layouts.layout import Layout

    layout = Layout.from_dict({"recompute": "full", "recompute_method": "block", "recompute_num_layers": 2})
    assert (layout.recompute_method, layout.recompute_num_layers) == ("block", 2)
    assert Layout.from_dict(layout.to_dict()) == layout
    assert layout.replace(recompute="full").recompute_method == "block"
    # records written before recompute was one field
    legacy = {"recompute_granularity": "selective", "recompute_modules": ["moe_act", "layernorm"], "tp": 2}
    assert Layout.from_dict(legacy).recompute == "moe_act,layernorm"


# Layout.of_canonical builds the space's layouts without parsing each field again: over every value the space's
# dimensions list (opt-in dimensions freed, GPU and CPU, dense and MoE), it builds the layout Layout() builds
_SPACES = [("deepseek-v3", "h100"), ("qwen3-next-80b-a3b", "gb200"), ("llama3-70b", "b200"), ("tiny-mla-moe", "cpu")]


@given(data=st.data())
@settings(deadline=None)
def test_a_layout_of_the_spaces_canonical_values_is_the_one_layout_builds(data):
    from search_spaces.catalog.hardware import load_gpu
    from search_spaces.catalog.models import load_model
    from search_spaces.layouts.space import OPT_IN, dimensions

    model, gpu = data.draw(st.sampled_from(_SPACES))
    dims = dimensions(load_model(model), load_gpu(gpu), 64, 32768, free=OPT_IN).values
    names = data.draw(st.sets(st.sampled_from(sorted(dims))))  # the others at their defaults
    values = {name: data.draw(st.sampled_from(dims[name])) for name in names}
    if values.get("gbs", 1) % values.get("mbs", 1):
        values["mbs"] = 1
    built = Layout(**values)
    fast = Layout.of_canonical(values)
    assert fast == built and hash(fast) == hash(built)
    assert fast.to_dict() == built.to_dict() and fast.key() == built.key()
    assert [type(getattr(fast, name)) for name in values] == [type(getattr(built, name)) for name in values]
