"""Exports loaded by the programs that consume them, not by our own round trip.

- The bridge-yaml (what `promote` stores and `export --format bridge-yaml` prints) is applied to a Megatron-Bridge
  recipe's ConfigContainer exactly as Bridge applies a YAML of overrides, then `runtime_config_update` (the first
  thing Bridge's `pretrain()` does: mixed precision resolved, every config finalized and validated); one layout
  per CP communication type (tests/bridge_config.py says what, on CPU, is not the real thing).
- The Megatron-LM flags go through what `pretrain_gpt.py` does with them first: Megatron-LM's parser (also
  tests/orchestrator/test_export.py), `validate_args` and `core_transformer_config_from_args`.
- Every value our exports and the trainer spell is one the consumers accept: the sets are read from the
  installed megatron-core (Literal field types, enums, the validation in TransformerConfig.__post_init__);
  Transformer Engine's CP types from its documentation (it is not installed on CPU).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import os
import re
import typing
import warnings
from dataclasses import dataclass

import pytest
import yaml

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.layouts import rules
from search_spaces.layouts.layout import BY_NAME, CP_COMM_TYPES, DIMENSIONS, Layout

from orchestrator.outputs import export
from tests import bridge_config
from trainers import config as trainer_config

# Transformer Engine's DotProductAttention docstring (transformer_engine/pytorch/attention/
# dot_product_attention/dot_product_attention.py): "cp_comm_type : str, default = `p2p` ... Can be "p2p" or
# "all_gather" or "a2a" or "a2a+p2p"."; its context-parallel attention dispatches on exactly these.
TE_CP_COMM_TYPES = frozenset({"p2p", "all_gather", "a2a", "a2a+p2p"})


@dataclass(frozen=True)
class Case:
    """A layout our rules call legal, on H100s: what a sweep may promote."""
    name: str
    model: str
    layout: dict
    seq_len: int
    world: int

    def built(self):
        return load_model(self.model), Layout.from_dict(self.layout)


CASES = [
    Case("p2p", "qwen3-30b-a3b", dict(cp=4, ep=8, gbs=64, cp_comm_type="p2p", recompute="core_attn"), 32768, 64),
    Case("a2a", "qwen3-30b-a3b", dict(cp=4, ep=8, gbs=64, cp_comm_type="a2a", precision="fp8-blockwise",
                                      recompute="moe_act,layernorm"), 32768, 64),
    Case("allgather", "qwen3-30b-a3b", dict(cp=4, ep=8, gbs=64, cp_comm_type="allgather", dispatcher="deepep",
                                            cuda_graphs="attn,moe_router"), 32768, 64),
    # the README's estimate: DeepSeek-V3 128K on 256 H100 (61 layers and an MTP layer on PP8 x VPP4)
    Case("a2a+p2p", "deepseek-v3", dict(cp=32, ep=32, pp=8, vpp=4, gbs=128, precision="fp8-blockwise",
                                        dispatcher="deepep", recompute="mla_up_proj,layernorm,moe,mlp",
                                        optimizer_offload=1.0, cp_comm_type="a2a+p2p", hierarchical_cp="8,4"),
         131072, 256),
    Case("a2a+p2p-tp-full-recompute", "qwen3-30b-a3b",
         dict(tp=2, cp=8, ep=8, pp=2, vpp=2, mbs=2, gbs=64, cp_comm_type="a2a+p2p", hierarchical_cp="2,4",
              precision="fp8-delayed", dispatcher="hybridep", recompute="full", recompute_method="block",
              recompute_num_layers=2, cuda_graphs="full_iteration", distributed_optimizer=False), 131072, 256),
    Case("offload-tensorwise-capacity", "qwen3-30b-a3b", dict(ep=4, gbs=64, precision="fp8-tensorwise",
                                                               optimizer_offload=0.5, dispatcher="allgather",
                                                               routing="capacity:1.25"), 4096, 16),
    # the EP all-to-all overlap on an interleaved pipeline (what the Qwen3-235B recipes run)
    Case("ep-overlap", "qwen3-30b-a3b", dict(ep=8, pp=2, vpp=2, gbs=64, dispatcher="hybridep", ep_overlap=True,
                                             recompute="moe_act", cuda_graphs="attn,moe_router,moe_preprocess"),
         4096, 16),
    # the memory levers Megatron-LM can run (the paged stash needs Transformer Engine's op fuser, which only the
    # bridge-yaml sets: test_the_bridge_yaml_runs_the_paged_stash)
    Case("memory-levers", "qwen3-30b-a3b", dict(ep=8, pp=2, vpp=2, gbs=64, dispatcher="hybridep",
                                                activation_offload="qkv_linear,core_attn,attn_proj,expert_fc1",
                                                activation_offload_fraction=0.5, optimizer_states="bf16"),
         32768, 16),
    # fp8 weights gathered in fp8 (what Bridge's per-tensor recipe runs: the Llama-3.1-405B GB200 row)
    Case("fp8-params", "qwen3-30b-a3b", dict(ep=8, pp=2, gbs=64, precision="fp8-tensorwise", fp8_param_gather=True),
         4096, 16),
]
H100 = load_gpu("h100")
# What the launch script adds to the exported flags (orchestrator/outputs/export/slurm.py sbatch_script), and the one
# fused kernel Megatron-LM turns on by default that needs Transformer Engine's kernels, which this CPU machine lacks.
RUN_FLAGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "100", "--lr", "1e-4"]
NO_TE_KERNELS = ["--no-rope-fusion"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_cases_are_legal_layouts(case):
    model, layout = case.built()
    assert rules.check(model, H100, case.world, case.seq_len, layout) == []


def test_every_cp_communication_type_has_a_case():
    assert {Layout.from_dict(c.layout).cp_comm_type for c in CASES} == set(CP_COMM_TYPES)


# ---- the value sets the consumers accept ---------------------------------------------------------------

def _literal_values(cls, name: str) -> set[str]:
    hint = typing.get_type_hints(cls)[name]
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is typing.Literal:
            return set(typing.get_args(arg))
    raise AssertionError(f"{cls.__name__}.{name} is not a Literal: {hint}")


def _mcore_cp_comm_types(config_cls) -> set[str]:
    """Megatron-Core documents cp_comm_type's values on its field (it validates only the type)."""
    line = re.search(r"cp_comm_type of each layer can be ([^\n]*)", inspect.getsource(config_cls))
    assert line, "TransformerConfig no longer documents cp_comm_type's values"
    return set(re.findall(r'"([^"]+)"', line.group(1)))


def _mcore_recompute_modules(config_cls) -> set[str]:
    """The modules TransformerConfig.__post_init__ allows, from the message with which it refuses another."""
    with pytest.raises(AssertionError, match="Allowed modules are") as refused, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config_cls(num_layers=2, hidden_size=64, num_attention_heads=4, recompute_granularity="selective",
                   recompute_modules=["no_such_module"])
    return ast.literal_eval(str(refused.value).split("Allowed modules are:", 1)[1].strip())


@pytest.fixture(scope="module")
def accepted():
    """Per Megatron-Core config field: the values it accepts (list fields: per element)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.enums import Fp8Recipe
        from megatron.core.transformer.enums import CudaGraphModule
        from megatron.core.transformer.transformer_config import TransformerConfig
    cp = _mcore_cp_comm_types(TransformerConfig)
    assert cp == TE_CP_COMM_TYPES, "Megatron-Core and Transformer Engine disagree on the CP types"
    fp8_recipes = {r.value for r in Fp8Recipe}
    assert fp8_recipes == _literal_values(TransformerConfig, "fp8_recipe")
    return {
        "cp_comm_type": cp,
        "moe_token_dispatcher_type": _literal_values(TransformerConfig, "moe_token_dispatcher_type"),
        "moe_flex_dispatcher_backend": _literal_values(TransformerConfig, "moe_flex_dispatcher_backend"),
        "recompute_granularity": _literal_values(TransformerConfig, "recompute_granularity"),
        "recompute_method": _literal_values(TransformerConfig, "recompute_method"),
        "recompute_modules": _mcore_recompute_modules(TransformerConfig),
        "cuda_graph_impl": _literal_values(TransformerConfig, "cuda_graph_impl"),
        "cuda_graph_modules": {m.name for m in CudaGraphModule},
        "fp8_recipe": fp8_recipes,
        "fp8": _literal_values(TransformerConfig, "fp8"),
        "moe_token_drop_policy": _literal_values(TransformerConfig, "moe_token_drop_policy"),
    }


def _every_value_layouts() -> list[Layout]:
    """Each value of each choice and module dimension, one dimension at a time (with what it needs)."""
    needs = {"a2a+p2p": dict(cp=4, hierarchical_cp="2,2"), "full": dict(cuda_graphs="full_iteration")}
    out = [Layout(cp=2, recompute="full", recompute_method=m) for m in BY_NAME["recompute_method"].choices]
    for dim in DIMENSIONS:
        if dim.kind == "choice" or dim.name == "cuda_graphs":
            values = [f"{v}:{max(1.0, dim.parametrised[v][0])}" if v in dim.parametrised else v
                      for v in dim.choices]  # a parametrised value with its parameter (capacity:1.0)
            out += [Layout.from_dict({"cp": 2, dim.name: v, **needs.get(v, {})}) for v in values]
        elif dim.kind == "recompute":
            out += [Layout(recompute=m) for m in dim.choices] + [Layout(recompute="full")]
    return out


def _spelled(fields: dict, accepted: dict) -> dict[str, set]:
    seen: dict[str, set] = {}
    for key, value in fields.items():
        if key in accepted and value is not None:
            values = value if isinstance(value, (list, tuple)) else [value]
            seen.setdefault(key, set()).update(v.name if isinstance(v, enum.Enum) else v for v in values)
    return seen


def test_every_value_the_exports_and_the_trainer_spell_is_accepted(accepted, megatron_parser):
    model = load_model("tiny-mla-moe")
    spelled: dict[str, dict[str, set]] = {"bridge-yaml": {}, "megatron-args": {}, "trainer": {}}
    for layout in _every_value_layouts():
        sources = {
            "bridge-yaml": export.bridge_overrides(layout, 4096, model)["model"],
            "megatron-args": vars(megatron_parser.parse_args(export.megatron_args(layout, model, 4096))),
            "trainer": trainer_config.transformer_config_kwargs(model, layout, on_cpu=False, have_te=True),
        }
        for source, fields in sources.items():
            for key, values in _spelled(fields, accepted).items():
                spelled[source].setdefault(key, set()).update(values)
    for source, fields in spelled.items():
        for key, values in fields.items():
            assert values <= accepted[key], f"{source} spells {key} as {values - accepted[key]}"
    # none of the checks is vacuous: each field is spelled by the exports (and the layout fields by the trainer)
    assert set(spelled["bridge-yaml"]) == set(accepted) == set(spelled["megatron-args"])
    assert {"cp_comm_type", "recompute_modules", "fp8_recipe", "moe_flex_dispatcher_backend"} <= set(
        spelled["trainer"])
    assert spelled["bridge-yaml"]["cp_comm_type"] == {BY_NAME["cp_comm_type"].megatron_value(v)
                                                      for v in CP_COMM_TYPES} == TE_CP_COMM_TYPES


# ---- Megatron-LM: what pretrain_gpt.py does with the flags first -------------------------------------------

@pytest.fixture(scope="module")
def megatron_parser():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.training.arguments import add_megatron_arguments

        return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_megatron_lm_validates_the_flags_and_builds_the_config(case, megatron_parser, monkeypatch):
    import megatron.training.arguments as mlm_arguments
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
    from megatron.training.argument_utils import core_transformer_config_from_args

    model, layout = case.built()
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # the launch script's settings
    if "export NVTE_CPU_OFFLOAD_V1=1" in export.sbatch_script(layout, model, case.seq_len, case.world):
        monkeypatch.setenv("NVTE_CPU_OFFLOAD_V1", "1")
    argv = export.megatron_args(layout, model, case.seq_len) + RUN_FLAGS + NO_TE_KERNELS + [
        "--vocab-size", str(model.vocab_size)]
    with bridge_config.on_h100_node(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = megatron_parser.parse_args(argv)
        args.world_size, args.rank = case.world, 0
        mlm_arguments.validate_args(args)
        cfg = core_transformer_config_from_args(args, MLATransformerConfig if model.is_mla else TransformerConfig)
    assert args.data_parallel_size == layout.dp(case.world)
    fields = export.bridge_overrides(layout, case.seq_len, model)["model"]  # the same names, Bridge's rendering
    for key in ("cp_comm_type", "hierarchical_context_parallel_sizes", "recompute_granularity", "recompute_modules",
                "recompute_method", "fp8_recipe", "fp8", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                "cuda_graph_impl", "account_for_embedding_in_pipeline_split", "expert_model_parallel_size",
                "virtual_pipeline_model_parallel_size", "moe_grouped_gemm", "moe_expert_capacity_factor",
                "moe_pad_expert_input_to_capacity", "moe_token_drop_policy", "fine_grained_activation_offloading",
                "offload_modules", "activation_offload_fraction"):
        if fields.get(key) is not None:  # unset: Megatron's default
            assert _plain(getattr(cfg, key)) == fields[key], key
    assert (cfg.pipeline_model_parallel_layout is None) == (fields["pipeline_model_parallel_layout"] is None)


# ---- Megatron-Bridge: the bridge-yaml applied to a recipe's ConfigContainer --------------------------------

@pytest.fixture(scope="module")
def bridge():
    if not bridge_config.installed():
        reason = (f"megatron-bridge is not installed (scripts/setup.sh installs megatron-bridge=="
                  f"{bridge_config.BRIDGE_VERSION} with --no-deps)")
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI installs it: a missing install step must not pass as a skip
        pytest.skip(reason)
    return bridge_config.load()


def _plain(value):
    """A config value as YAML writes it: enums by name, tuples as lists, objects (a pipeline layout) as text."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, dict)) else str(value)


@pytest.fixture
def fused_adam(monkeypatch):
    """Transformer Engine's FusedAdam, its signature only: Megatron-Core's OptimizerConfig checks that it takes the
    precision-aware optimizer's arguments (TE is not installed on CPU; nothing is stepped here)."""
    import sys
    import types

    class FusedAdam:  # the arguments OptimizerConfig.__post_init__ looks for
        def __init__(self, params=None, master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None,
                     use_decoupled_grad=False):
            pass

    optimizers = types.ModuleType("transformer_engine.pytorch.optimizers")
    optimizers.FusedAdam = FusedAdam
    for name, module in (("transformer_engine", types.ModuleType("transformer_engine")),
                         ("transformer_engine.pytorch", types.ModuleType("transformer_engine.pytorch")),
                         ("transformer_engine.pytorch.optimizers", optimizers)):
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_bridge_yaml_loads_in_megatron_bridge(case, bridge, tmp_path, request):
    model, layout = case.built()
    if layout.optimizer_states != "fp32":
        request.getfixturevalue("fused_adam")
    path = tmp_path / "bridge-overrides.yaml"
    path.write_text(export.bridge_overrides_yaml(layout, case.seq_len, model))  # what promote stores
    # the model's recipe, as the trainer builds its TransformerConfig (plus the MTP layers it does not build)
    architecture = {**trainer_config.transformer_config_kwargs(model, Layout(), on_cpu=False),
                    "mtp_num_layers": model.mtp_layers or None}
    cfg, refused = bridge_config.apply_yaml(bridge, architecture, model.is_mla, str(path), case.world)
    assert refused == []
    overrides = yaml.safe_load(path.read_text())
    for section, values in overrides.items():
        if section == "mixed_precision":
            continue
        if section == "env_vars":  # the environment defaults Bridge applies before finalizing
            assert {k: cfg.env_vars[k] for k in values} == values
            continue
        for key, value in values.items():
            if key == "_target_":  # the class a section is built as (comm_overlap, where the recipe has none)
                assert type(getattr(cfg, section)).__name__ == value.rsplit(".", 1)[-1]
                continue
            assert _plain(getattr(getattr(cfg, section), key)) == value, f"{section}.{key}"
    assert cfg.data_parallel_size == layout.dp(case.world)
    mixed = overrides["mixed_precision"]
    assert dataclasses.asdict(cfg.mixed_precision) == dataclasses.asdict(bridge.get_mixed_precision_config(mixed))
    if layout.precision.startswith(("fp8", "mxfp8")):  # the named recipe is the layout's FP8 recipe
        assert (cfg.mixed_precision.fp8_recipe, cfg.mixed_precision.fp8) == (
            overrides["model"]["fp8_recipe"], overrides["model"]["fp8"])


@pytest.mark.parametrize("ep_overlap", [False, True])
def test_the_bridge_yaml_sets_the_ep_overlap_over_a_recipes_own_comm_overlap(bridge, tmp_path, ep_overlap):
    """A recipe with its own CommOverlapConfig (Qwen3-MoE on GB200 turns the EP overlap on there): the layout's
    EP overlap is what the model runs with after Bridge's setup, and the recipe's other fields are kept."""
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    model = load_model("qwen3-30b-a3b")
    layout = Layout.from_dict(dict(ep=8, pp=2, vpp=2, gbs=64, dispatcher="hybridep", ep_overlap=ep_overlap))
    path = tmp_path / "bridge-overrides.yaml"
    path.write_text(export.bridge_overrides_yaml(layout, 4096, model))
    architecture = {**trainer_config.transformer_config_kwargs(model, Layout(), on_cpu=False),
                    "mtp_num_layers": None}
    recipe_block = CommOverlapConfig(tp_comm_overlap=False, overlap_moe_expert_parallel_comm=not ep_overlap,
                                     bucket_size=64 * 1024 * 1024)
    cfg, refused = bridge_config.apply_yaml(bridge, architecture, False, str(path), 16, comm_overlap=recipe_block)
    assert refused == []
    assert cfg.model.overlap_moe_expert_parallel_comm is ep_overlap
    assert cfg.comm_overlap.bucket_size == 64 * 1024 * 1024  # the recipe's own field survives the merge


def test_the_bridge_yaml_runs_the_paged_stash(bridge, tmp_path, fused_adam):
    """The paged expert stash over a recipe that stashes with its own pool (Qwen3-MoE's full-iteration recipes:
    rank budget 1.5, a 1.2x CUDA pool and a host spill pool): after Bridge's setup the model runs the layout's
    budget and the pool the cost model sized (search_spaces/cost/offload.py), and bf16 moments reach the optimizer."""
    model = load_model("qwen3-30b-a3b")
    layout = Layout.from_dict(dict(ep=8, gbs=64, dispatcher="hybridep", expert_stash="paged:1.25",
                                   optimizer_states="bf16", activation_offload="core_attn,attn_proj"))
    assert rules.check(model, H100, 8, 4096, layout) == []
    path = tmp_path / "bridge-overrides.yaml"
    path.write_text(export.bridge_overrides_yaml(layout, 4096, model))
    architecture = {**trainer_config.transformer_config_kwargs(model, Layout(), on_cpu=False), "mtp_num_layers": None,
                    "moe_paged_stash": True, "moe_expert_rank_capacity_factor": 1.5,
                    "moe_paged_stash_buffer_size_factor_cuda": 1.2, "moe_paged_stash_buffer_size_factor_cpu": 1.0}
    cfg, refused = bridge_config.apply_yaml(bridge, architecture, False, str(path), 8)
    assert refused == []
    m = cfg.model
    assert (m.moe_paged_stash, m.moe_expert_rank_capacity_factor, m.use_transformer_engine_op_fuser) == (
        True, 1.25, True)
    assert (m.moe_paged_stash_buffer_size_factor_cuda, m.moe_paged_stash_buffer_size_factor_cpu) == (1.1, 0.0)
    assert m.fine_grained_activation_offloading and list(m.offload_modules) == ["core_attn", "attn_proj"]
    import torch
    assert (cfg.optimizer.use_precision_aware_optimizer, cfg.optimizer.exp_avg_dtype, cfg.optimizer.exp_avg_sq_dtype) \
        == (True, torch.bfloat16, torch.bfloat16)


def test_the_bridge_yaml_keeps_mxfp8_weights_in_fp8(bridge, tmp_path):
    """MXFP8 weights gathered in fp8 (the Llama GB300 rows' recipe): after Bridge's setup the model keeps fp8
    parameters and the all-gather borrows the gradient buffer, as Bridge requires; the blockwise recipe, which keeps
    bf16 weights, is refused rather than exported as something else."""
    model = load_model("qwen3-30b-a3b")
    layout = Layout.from_dict(dict(ep=8, gbs=64, precision="mxfp8", fp8_param_gather=True))
    assert rules.check(model, load_gpu("gb200"), 8, 4096, layout) == []
    path = tmp_path / "bridge-overrides.yaml"
    path.write_text(export.bridge_overrides_yaml(layout, 4096, model))
    architecture = {**trainer_config.transformer_config_kwargs(model, Layout(), on_cpu=False), "mtp_num_layers": None}
    cfg, refused = bridge_config.apply_yaml(bridge, architecture, False, str(path), 8)
    assert refused == []
    assert (cfg.model.fp8_param, cfg.ddp.fp8_param_gather, cfg.ddp.reuse_grad_buf_for_mxfp8_param_ag,
            cfg.optimizer.reuse_grad_buf_for_mxfp8_param_ag) == (True, True, True, True)
    from search_spaces.errors import SpecError
    with pytest.raises(SpecError, match="blockwise"):
        export.bridge_overrides(layout.replace(precision="fp8-blockwise"), 4096, model)


# ---- a model read from its config.json whose dense and MoE layers interleave (issue 55) -------------------

MAVERICK = "tests/data/hf_configs/llama-4-maverick-17b-128e-instruct.json"  # every other layer MoE


def test_megatron_lm_builds_an_interleaved_models_moe_layers(megatron_parser, monkeypatch):
    """Llama-4-Maverick's dense and MoE layers alternate: Megatron-LM's parser evaluates the exported
    --moe-layer-freq to the model's per-layer list, and the dense layers' own width (intermediate_size_mlp) is
    ffn_hidden_size beside the experts' moe_ffn_hidden_size."""
    import megatron.training.arguments as mlm_arguments
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.training.argument_utils import core_transformer_config_from_args

    model, layout, world = load_model(MAVERICK), Layout.from_dict(dict(ep=8, gbs=8)), 8
    assert model.moe_layer_freq() == [0, 1] * 24
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    argv = export.megatron_args(layout, model, 4096) + RUN_FLAGS + NO_TE_KERNELS + [
        "--vocab-size", str(model.vocab_size)]
    assert argv[argv.index("--moe-layer-freq") + 1] == "([0,1]*24)"
    with bridge_config.on_h100_node(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = megatron_parser.parse_args(argv)
        args.world_size, args.rank = world, 0
        mlm_arguments.validate_args(args)
        cfg = core_transformer_config_from_args(args, TransformerConfig)
    assert list(cfg.moe_layer_freq) == model.moe_layer_freq()
    assert (cfg.ffn_hidden_size, cfg.moe_ffn_hidden_size, cfg.moe_shared_expert_intermediate_size) == (
        16384, 8192, 8192)


def test_the_bridge_yaml_sets_an_interleaved_models_moe_layers(bridge, tmp_path):
    """Over a recipe of first-k-dense layers, the bridge-yaml's moe_layer_freq is what Bridge builds."""
    model, layout = load_model(MAVERICK), Layout.from_dict(dict(ep=8, gbs=8))
    path = tmp_path / "bridge-overrides.yaml"
    path.write_text(export.bridge_overrides_yaml(layout, 4096, model))
    recipe = {**trainer_config.transformer_config_kwargs(model, Layout(), on_cpu=False), "mtp_num_layers": None,
              "moe_layer_freq": [0] + [1] * (model.num_layers - 1)}
    cfg, refused = bridge_config.apply_yaml(bridge, recipe, False, str(path), 8)
    assert refused == []
    assert list(cfg.model.moe_layer_freq) == model.moe_layer_freq() == yaml.safe_load(path.read_text())["model"][
        "moe_layer_freq"]


def test_catalog_models_keep_their_first_k_dense_moe_layers():
    """The catalog's models (no per-layer pattern) keep the first-k-dense rendering and no Bridge override."""
    for name, freq in (("deepseek-v3", "([0]*3+[1]*58)"), ("qwen3-30b-a3b", None)):
        model = load_model(name)
        argv = export.megatron_args(Layout(), model, 4096)
        assert (argv[argv.index("--moe-layer-freq") + 1] if "--moe-layer-freq" in argv else None) == freq
        assert "moe_layer_freq" not in export.bridge_overrides(Layout(), 4096, model)["model"]
