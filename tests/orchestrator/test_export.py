"""Export of a layout to Megatron-LM flags, Megatron-Bridge overrides and sbatch; and the parse back.

Every exported name is checked against the installed megatron-core: the flag must be accepted by Megatron-LM's
own argument parser, and must name a field of Megatron-Core's config dataclasses (or, for the few that are
not config fields, a GPTModel constructor parameter), so no invented names slip through.
"""

import argparse
import dataclasses
import inspect
import shlex
import shutil
import subprocess
import warnings

import pytest
import yaml

from search_spaces.catalog.models import load_model
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.outputs import export

LAYOUTS = [
    Layout(),
    Layout.from_dict(dict(tp=2, cp=2, ep=4, etp=1, pp=2, vpp=2, mbs=1, gbs=8, recompute="core_attn,moe_act",
                          cuda_graphs="attn,moe_router", precision="fp8-blockwise", dispatcher="deepep",
                          cp_comm_type="a2a", optimizer_offload=0.5)),
    Layout.from_dict(dict(tp=4, ep=2, etp=2, pp=4, mbs=2, gbs=64, recompute="full", recompute_method="block",
                          recompute_num_layers=2, precision="fp8-delayed", dispatcher="hybridep",
                          distributed_optimizer=False, sequence_parallel=False, routing="capacity:1.25")),
    Layout.from_dict(dict(cp=4, gbs=4, cuda_graphs="full_iteration", precision="fp32", dispatcher="allgather",
                          cp_comm_type="a2a+p2p", hierarchical_cp="2,2", optimizer_offload=1.0,
                          routing="forced_balance")),
    Layout.from_dict(dict(tp=2, ep=8, gbs=16, precision="mxfp8", recompute="mla_up_proj,layernorm,moe")),
    Layout.from_dict(dict(ep=2, gbs=8, precision="fp8-tensorwise", cuda_graphs="moe_router,moe_preprocess")),
    Layout.from_dict(dict(ep=4, pp=2, vpp=2, gbs=16, dispatcher="hybridep", recompute="moe_act", ep_overlap=True,
                          cuda_graphs="attn,moe_router,moe_preprocess", precision="mxfp8")),
]
MODELS = ["tiny-moe", "tiny-mla-moe", "deepseek-v3", "qwen3-30b-a3b", "tiny-qwen3-next", "qwen3-next-80b-a3b",
          "tiny-gpt-oss", "gpt-oss-120b"]

# The few flags whose config field has another name (or that are GPTModel arguments, not config fields).
FLAG_TO_FIELD = {
    "num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
    "fp8-format": "fp8",
    "num-experts": "num_moe_experts",
    "swiglu": "gated_linear_unit",
    "disable-bias-linear": "add_bias_linear",
    "norm-epsilon": "layernorm_epsilon",
    "group-query-attention": "num_query_groups",
    "seq-length": "sequence_length",  # GPTDatasetConfig
    "max-position-embeddings": "max_sequence_length",  # GPTModel(...)
    "untie-embeddings-and-output-weights": "share_embeddings_and_output_weights",  # GPTModel(...)
    "quick-geglu": "activation_func",  # + gated_linear_unit
    "apply-layernorm-1p": "layernorm_zero_centered_gamma",
    "no-check-for-nan-in-loss-and-grad": "check_for_nan_in_loss",  # RerunStateMachineConfig
}
# Megatron-Bridge's own fields, beside Megatron-Core's: GPTModelProvider.seq_length and its GPTDatasetConfig's
# seq_length (tests/orchestrator/test_consumers.py loads them in Bridge).
BRIDGE_FIELDS = {"model": {"seq_length"}, "dataset": {"seq_length"}}


def _quiet_import():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import GPTDatasetConfig  # noqa: F401  (returned by locals())
        from megatron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig  # noqa: F401
        from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: F401
        from megatron.core.optimizer.optimizer_config import OptimizerConfig  # noqa: F401
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig  # noqa: F401
        from megatron.training.arguments import add_megatron_arguments  # noqa: F401
        from megatron.training.config import RerunStateMachineConfig  # noqa: F401
        from megatron.training.config.training_config import TrainingConfig  # noqa: F401
    return locals()


@pytest.fixture(scope="module")
def mcore():
    pytest.importorskip("megatron.core")
    return _quiet_import()


@pytest.fixture(scope="module")
def megatron_parser(mcore):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # argparse deprecations inside Megatron-LM's own parser
        return mcore["add_megatron_arguments"](argparse.ArgumentParser(allow_abbrev=False))


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.key())
def test_round_trip_through_text_and_argv(layout):
    model = load_model("tiny-mla-moe")
    text = export.megatron_args_text(layout, model, 8192)
    assert export.layout_from_megatron_args(text) == layout
    assert export.layout_from_megatron_args(export.megatron_args(layout, model, 8192)) == layout


def test_an_explicit_pipeline_layout_carries_the_virtual_stages():
    """61 layers and an MTP layer on PP8 x VPP4: Megatron-LM gets the cost model's explicit placement and takes
    the virtual stages from it (it refuses the VPP flag beside a layout); the parse back recovers VPP."""
    layout = Layout.from_dict(dict(cp=32, ep=32, pp=8, vpp=4, gbs=128))
    argv = export.megatron_args(layout, load_model("deepseek-v3"), 131072)
    assert "--num-virtual-stages-per-pipeline-rank" not in argv
    assert argv[argv.index("--pipeline-model-parallel-layout") + 1].count("|") == 8 * 4 - 1
    assert export.layout_from_megatron_args(argv) == layout


def test_sequence_parallel_explicit_value_survives():
    # on iff TP > 1 is the default (None); an explicit "off at TP 2" must come back explicitly
    explicit = Layout(tp=2, gbs=2, sequence_parallel=False)
    assert export.layout_from_megatron_args(export.layout_args(explicit)).sequence_parallel is False
    default_on = Layout(tp=2, gbs=2, sequence_parallel=True)
    assert export.layout_from_megatron_args(export.layout_args(default_on)).sp is True


@pytest.mark.parametrize("model_name", MODELS)
def test_every_flag_is_accepted_by_megatron_lm(model_name, megatron_parser):
    model = load_model(model_name)
    for layout in LAYOUTS:
        argv = export.megatron_args(layout, model, 131072)
        ns = megatron_parser.parse_args(argv)  # unknown flags or bad choices exit here
        assert ns.tensor_model_parallel_size == layout.tp
        assert ns.context_parallel_size == layout.cp
        assert ns.expert_model_parallel_size == layout.ep
        assert ns.expert_tensor_parallel_size == layout.etp
        assert ns.pipeline_model_parallel_size == layout.pp
        assert _virtual_stages(ns) == layout.vpp
        assert (ns.micro_batch_size, ns.global_batch_size) == (layout.mbs, layout.gbs)
        assert ns.sequence_parallel == layout.sp
        assert ns.use_distributed_optimizer == layout.distributed_optimizer
        assert ns.cp_comm_type == [{"allgather": "all_gather"}.get(layout.cp_comm_type, layout.cp_comm_type)]
        assert (ns.hierarchical_context_parallel_sizes or []) == list(layout.hierarchical_cp)
        assert ns.seq_length == 131072
        assert ns.num_layers == model.num_layers and ns.hidden_size == model.hidden_size
        assert ns.bf16 == (layout.precision != "fp32")
        if model.is_moe:
            assert ns.num_experts == model.num_experts and ns.moe_router_topk == model.topk
        if model.first_k_dense:
            assert ns.moe_layer_freq == [0] * model.first_k_dense + [1] * (model.num_layers - model.first_k_dense)
        assert ns.multi_latent_attention == model.is_mla
        assert ns.position_embedding_type == "rope"
        routing = {"dropless": (None, False, False), "capacity:1.25": (1.25, True, False),
                   "forced_balance": (None, False, True)}[layout.routing]
        assert (ns.moe_expert_capacity_factor, ns.moe_pad_expert_input_to_capacity,
                ns.moe_router_force_load_balancing) == routing
        assert ns.moe_token_drop_policy == "probs"
        _assert_layer_kinds(ns, model)


def _virtual_stages(ns) -> int:
    """VPP as Megatron-LM reads it: the flag, or the virtual stages of an explicit pipeline layout."""
    if ns.pipeline_model_parallel_layout:
        return len(ns.pipeline_model_parallel_layout.split("|")) // ns.pipeline_model_parallel_size
    return ns.num_virtual_stages_per_pipeline_rank or 1


def _assert_layer_kinds(ns, model):
    """The parsed flags give Megatron-Core the model's layer pattern, as its own helpers read them."""
    from types import SimpleNamespace

    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_linear_attention_pattern
    from megatron.core.transformer.utils import is_layer_window_attention

    kinds = model.attention_kinds()
    if "linear" in kinds:
        assert ns.experimental_attention_variant == "gated_delta_net"
        cfg = SimpleNamespace(linear_attention_freq=ns.linear_attention_freq, num_layers=ns.num_layers,
                              experimental_attention_variant=ns.experimental_attention_variant)
        assert get_linear_attention_pattern(cfg) == [int(k == "linear") for k in kinds]
        assert (ns.linear_key_head_dim, ns.linear_value_head_dim, ns.linear_num_key_heads,
                ns.linear_num_value_heads) == (model.linear_key_head_dim, model.linear_value_head_dim,
                                               model.linear_num_key_heads, model.linear_num_value_heads)
        assert ns.attention_output_gate and ns.moe_shared_expert_gate and ns.qk_layernorm
        assert ns.layernorm_zero_centered_gamma and ns.rotary_percent == 0.25 and not ns.add_bias_linear
    else:
        assert ns.experimental_attention_variant is None
    if "sliding" in kinds:
        assert ns.window_size == (model.sliding_window - 1, 0)
        assert [is_layer_window_attention(ns.window_size, ns.window_attn_skip_freq, n + 1)
                for n in range(model.num_layers)] == [k == "sliding" for k in kinds]
        assert ns.softmax_type == "learnable" and ns.add_bias_linear and ns.quick_geglu and not ns.swiglu
        assert (ns.glu_linear_offset, ns.activation_func_clamp_value) == (1.0, 7.0)
    else:
        assert ns.window_size is None and ns.softmax_type == "vanilla"


def test_uneven_layer_patterns_are_exported_as_lists(megatron_parser):
    model = load_model("tiny-qwen3-next").with_overrides(num_layers=7)  # LLLFLLL: still Megatron's "4"
    assert "4" == export.family_fields(model)["linear_attention_freq"]
    assert "3" == export.family_fields(dataclasses.replace(load_model("tiny-gpt-oss"), attention_pattern="SSF"))[
        "window_attn_skip_freq"]  # S S F S: every third layer full
    odd = dataclasses.replace(load_model("tiny-gpt-oss"), attention_pattern="SFF")  # S F F S: no every-Nth form
    assert export.family_fields(odd)["window_attn_skip_freq"] == "[1,0,0,1]"
    ns = megatron_parser.parse_args(export.megatron_args(Layout(), odd, 4096))
    assert ns.window_attn_skip_freq == [1, 0, 0, 1]
    assert export.bridge_overrides(Layout(), 4096, odd)["model"]["window_attn_skip_freq"] == [1, 0, 0, 1]


def test_every_flag_names_a_megatron_core_field(mcore):
    fields = set()
    for cls in ("MLATransformerConfig", "OptimizerConfig", "DistributedDataParallelConfig", "TrainingConfig",
                "GPTDatasetConfig", "RerunStateMachineConfig"):
        fields |= _names(mcore[cls])
    fields |= set(inspect.signature(mcore["GPTModel"].__init__).parameters)
    seen = set()
    for model_name in MODELS:
        for layout in LAYOUTS:
            for token in export.megatron_args(layout, load_model(model_name), 4096):
                if token.startswith("--"):
                    flag = token[2:]
                    seen.add(flag)
                    field = FLAG_TO_FIELD.get(flag, flag.replace("-", "_"))
                    assert field in fields, f"--{flag} maps to no Megatron-Core field ({field})"
    # the layout's own knobs are all exercised
    for flag in ("tensor-model-parallel-size", "context-parallel-size", "expert-model-parallel-size",
                 "expert-tensor-parallel-size", "pipeline-model-parallel-size", "num-virtual-stages-per-pipeline-rank",
                 "micro-batch-size", "global-batch-size", "recompute-granularity", "recompute-modules",
                 "recompute-method", "recompute-num-layers", "cuda-graph-impl", "cuda-graph-modules", "fp8-format",
                 "fp8-recipe", "moe-token-dispatcher-type", "moe-flex-dispatcher-backend", "cp-comm-type",
                 "optimizer-cpu-offload", "optimizer-offload-fraction", "use-distributed-optimizer",
                 "sequence-parallel", "seq-length", "bf16", "hierarchical-context-parallel-sizes",
                 "moe-expert-capacity-factor", "moe-pad-expert-input-to-capacity", "moe-token-drop-policy",
                 "moe-router-force-load-balancing"):
        assert flag in seen


def test_bridge_override_keys_are_megatron_core_fields(mcore):
    sections = {"model": _names(mcore["MLATransformerConfig"]), "optimizer": _names(mcore["OptimizerConfig"]),
                "ddp": _names(mcore["DistributedDataParallelConfig"]), "train": _names(mcore["TrainingConfig"]),
                "dataset": _names(mcore["GPTDatasetConfig"]),
                "rerun_state_machine": _names(mcore["RerunStateMachineConfig"])}
    for section, names in BRIDGE_FIELDS.items():
        sections[section] |= names
    for layout in LAYOUTS:
        overrides = export.bridge_overrides(layout, 65536)
        assert set(overrides) <= set(sections) | {"mixed_precision", "comm_overlap"}
        for section, values in overrides.items():
            # Bridge's own: tests/orchestrator/test_consumers.py checks them
            if section in ("mixed_precision", "comm_overlap"):
                continue
            for key in values:
                assert key in sections[section], f"{section}.{key} is not a Megatron-Core field"
        model = overrides["model"]
        assert (model["tensor_model_parallel_size"], model["context_parallel_size"],
                model["expert_model_parallel_size"], model["pipeline_model_parallel_size"]) == (
                    layout.tp, layout.cp, layout.ep, layout.pp)
        assert overrides["train"] == {"micro_batch_size": layout.mbs, "global_batch_size": layout.gbs}
        assert overrides["dataset"]["seq_length"] == overrides["model"]["seq_length"] == 65536
    # Literal-typed values are among Megatron-Core's allowed values
    hints = {f.name: f.type for f in dataclasses.fields(mcore["TransformerConfig"])}
    for layout in LAYOUTS:
        model = export.bridge_overrides(layout, 4096)["model"]
        for key in ("cuda_graph_impl", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "fp8_recipe",
                    "moe_token_drop_policy"):
            if key in model:
                assert repr(model[key]) in str(hints[key]) or f"'{model[key]}'" in str(hints[key])


@pytest.mark.parametrize("routing", ["dropless", "capacity:1.25", "forced_balance"])
def test_routing_exports_are_what_megatron_core_validates_and_reads_back(mcore, megatron_parser, routing):
    """The router fields of both exports: TransformerConfig accepts them (its __post_init__ checks the capacity
    factor against the load balancing and padding) and they spell the same routing back."""
    from search_spaces.layouts.layout import BY_NAME

    layout = Layout(ep=2, gbs=2, routing=routing)
    dim = BY_NAME["routing"]
    overrides = export.bridge_overrides(layout, 4096)["model"]
    bridge = {k: v for k, v in overrides.items() if k in dim.megatron_field_names()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = mcore["TransformerConfig"](num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=4,
                                         moe_router_topk=2, moe_router_load_balancing_type="aux_loss", **bridge)
    assert dim.from_megatron({k: getattr(cfg, k) for k in dim.megatron_field_names()}) == routing
    ns = megatron_parser.parse_args(export.megatron_args(layout, load_model("tiny-moe"), 4096))
    assert dim.from_megatron({k: getattr(ns, k) for k in dim.megatron_field_names()}) == routing
    assert export.layout_from_megatron_args(export.layout_args(layout)).routing == routing


@pytest.mark.parametrize("model_name", ["tiny-qwen3-next", "qwen3-next-80b-a3b", "tiny-gpt-oss", "gpt-oss-120b"])
def test_bridge_overrides_carry_the_layer_kinds_megatron_core_accepts(mcore, model_name):
    model = load_model(model_name)
    overrides = export.bridge_overrides(Layout(), 65536, model)["model"]
    hints = {f.name: str(f.type) for f in dataclasses.fields(mcore["TransformerConfig"])}
    family = export.family_fields(model)
    assert family and set(family) <= set(overrides) <= set(hints) | BRIDGE_FIELDS["model"]
    for key in ("experimental_attention_variant", "softmax_type"):
        if key in overrides:
            assert f"'{overrides[key]}'" in hints[key]
    # Megatron-Core's own validation accepts the fields with the model's sizes
    arch = dict(num_layers=model.num_layers, hidden_size=model.hidden_size,
                num_attention_heads=model.num_attention_heads, num_query_groups=model.num_kv_heads,
                kv_channels=model.head_dim, num_moe_experts=model.num_experts, moe_router_topk=model.topk,
                moe_ffn_hidden_size=model.moe_ffn_hidden_size, normalization="RMSNorm",
                moe_shared_expert_intermediate_size=model.shared_expert_ffn_hidden_size or None)
    model_fields = {k: v for k, v in overrides.items() if k in family}
    if "window_size" in model_fields:
        model_fields["window_size"] = tuple(model_fields["window_size"])
    model_fields.setdefault("add_bias_linear", False)
    cfg = mcore["TransformerConfig"](**arch, **model_fields, bias_dropout_fusion=False)
    assert cfg.num_layers == model.num_layers
    assert yaml.safe_load(export.bridge_overrides_yaml(Layout(), 65536, model))["model"] == overrides


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sbatch_script_runs_torchrun_with_the_flags(tmp_path):
    """Run the script with stand-ins for scontrol/srun/torchrun that record what pretrain_gpt.py would get."""
    layout = LAYOUTS[1]
    model = load_model("tiny-mla-moe")
    script = export.sbatch_script(layout, model, 4096, num_gpus=16, gpus_per_node=8)
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {"scontrol": 'echo node-a; echo node-b',
             "srun": 'while [[ "$1" == --* ]]; do shift; done; exec "$@"',
             "torchrun": 'printf "%s\\n" "$@" > "$RECORD"'}
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "launch.sbatch").write_text(script)
    record = tmp_path / "argv.txt"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MEGATRON_LM": "/opt/megatron-lm", "RECORD": str(record),
           "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2", "SLURM_JOB_ID": "42"}
    subprocess.run(["bash", str(tmp_path / "launch.sbatch"), "--exit-interval", "5"], env=env, check=True,
                   timeout=60)
    argv = record.read_text().splitlines()
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--nproc-per-node") + 1] == "8"
    assert "node-a:29500" in argv[argv.index("--rdzv-endpoint") + 1]
    script_args = argv[argv.index("/opt/megatron-lm/pretrain_gpt.py") + 1:]
    assert export.layout_from_megatron_args(script_args) == layout
    assert script_args[-2:] == ["--exit-interval", "5"]  # extra arguments pass through
    assert "--mock-data" in script_args and script_args[script_args.index("--vocab-size") + 1] == "256"
    with pytest.raises(SpecError, match="do not fill nodes"):
        export.sbatch_script(layout, model, 4096, num_gpus=12, gpus_per_node=8)


def test_the_launch_gives_the_ep_overlap_its_hardware_queues():
    """Megatron-LM wants CUDA_DEVICE_MAX_CONNECTIONS=1 for TP/CP comm overlap and more for the EP overlap
    (arguments.py): the launch script's default follows the layout; a value the user exports wins."""
    model = load_model("tiny-moe")
    overlap = Layout.from_dict(dict(ep=4, gbs=8, ep_overlap=True))
    assert "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}" in export.sbatch_script(
        overlap, model, 4096, num_gpus=8)
    for layout in (overlap.replace(tp=2), Layout.from_dict(dict(ep=4, gbs=8))):
        assert "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}" in export.sbatch_script(
            layout, model, 4096, num_gpus=8)


def test_bad_megatron_args_are_one_line_errors():
    with pytest.raises(SpecError, match="global-batch-size"):
        export.layout_from_megatron_args("--tensor-model-parallel-size 2")
    with pytest.raises(SpecError, match="fp8_recipe='custom'"):
        export.layout_from_megatron_args("--global-batch-size 8 --bf16 --fp8-format e4m3 --fp8-recipe custom")
    with pytest.raises(SpecError, match="cp_comm_type='allgather'"):  # Transformer Engine's name is all_gather
        export.layout_from_megatron_args("--global-batch-size 8 --cp-comm-type allgather")
    with pytest.raises(SpecError):
        export.layout_args(Layout(cuda_graphs=("full_iteration", "attn")))
    # token dropping without padding to capacity, or by position, is not a routing of the layout space
    with pytest.raises(SpecError, match="no routing is spelled"):
        export.layout_from_megatron_args("--global-batch-size 8 --moe-expert-capacity-factor 1.25")
    with pytest.raises(SpecError, match="no routing is spelled"):
        export.layout_from_megatron_args("--global-batch-size 8 --moe-expert-capacity-factor 1.25 "
                                         "--moe-pad-expert-input-to-capacity --moe-token-drop-policy position")
    assert shlex.split(export.megatron_args_text(Layout(), load_model("tiny-moe"), 4096))


def test_every_layout_dimension_reaches_both_exports():
    """No dimension of the registry is dropped on the way to production: changing any one of them changes
    the Megatron-LM flags and the Bridge overrides."""
    from search_spaces.layouts.layout import DIMENSIONS

    base = Layout.from_dict(dict(tp=2, pp=2, gbs=8, recompute="full"))
    other = {"tp": 4, "cp": 2, "ep": 2, "etp": 2, "pp": 4, "vpp": 2, "mbs": 2, "gbs": 16, "precision": "fp8",
             "recompute": "layernorm", "recompute_method": "block", "recompute_num_layers": 2,
             "cuda_graphs": "attn", "dispatcher": "deepep", "cp_comm_type": "a2a", "optimizer_offload": 0.5,
             "distributed_optimizer": False, "sequence_parallel": False, "hierarchical_cp": "2,2",
             "routing": "capacity:1.5", "ep_overlap": True, "activation_offload": "core_attn",
             "activation_offload_fraction": 0.5, "expert_stash": "paged:1.5", "optimizer_states": "bf16",
             "fp8_param_gather": True}
    assert set(other) == {d.name for d in DIMENSIONS}, "a new dimension needs a value here"
    for name, value in other.items():
        changed = base.replace(**{name: value})
        assert export.layout_args(changed) != export.layout_args(base), name
        assert export.bridge_overrides(changed, 4096) != export.bridge_overrides(base, 4096), name
