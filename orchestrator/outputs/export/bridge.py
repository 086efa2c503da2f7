"""A Layout (+ model + sequence length) as Megatron-Bridge ConfigContainer overrides: `bridge_overrides` (the
{model,train,optimizer,ddp,dataset}.field tree, one rendering per dimension, with the model's layer kinds and
pipeline split) and `bridge_overrides_yaml` (the bridge-yaml export)."""

from __future__ import annotations

from typing import Any, Callable

import yaml

from search_spaces.cost.pipeline import megatron_split_fields
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import BY_NAME, DIMENSIONS, Layout

from orchestrator.outputs.export.layout_fields import (
    activation_offload_fields,
    cuda_graph_impl,
    dimension_fields,
    fp8_param_fields,
    offload_fields,
)
from orchestrator.outputs.export.model_fields import family_fields, moe_kernel_fields, moe_layer_list


def _optimizer_state_fields(layout: Layout) -> dict[str, Any]:
    """OptimizerConfig fields of the moments' precision: written for fp32 too, over a recipe that sets bf16."""
    return dimension_fields(layout, "optimizer_states")


def _bridge_recompute(layout: Layout) -> dict[str, Any]:
    gran = layout.recompute_granularity
    out: dict[str, Any] = {"model.recompute_granularity": None if gran == "none" else gran}
    if gran == "selective":
        out["model.recompute_modules"] = list(layout.recompute_modules)
    return out


def _bridge_graphs(layout: Layout) -> dict[str, Any]:
    impl, modules = cuda_graph_impl(layout)
    # Bridge refuses a graphed iteration whose rerun state machine checks the loss for NaNs
    nan_check = {"rerun_state_machine.check_for_nan_in_loss": False} if impl == "full_iteration" else {}
    return {"model.cuda_graph_impl": impl, **({"model.cuda_graph_modules": modules} if modules else {}), **nan_check}


def _bridge_fields(name: str):
    """A dimension's model fields (model.*) and the other ConfigContainer entries its value sets."""
    dim = BY_NAME[name]
    return lambda layout: {**{f"model.{k}": v for k, v in dim.megatron_fields(getattr(layout, name)).items()},
                           **dim.bridge_extra.get(getattr(layout, name), {})}


def _bridge_precision(layout: Layout) -> dict[str, Any]:
    return {**_bridge_fields("precision")(layout), "optimizer.bf16": layout.precision != "fp32"}


def _bridge_full_only(name: str):
    dim = BY_NAME[name]
    return lambda layout: {dim.megatron: getattr(layout, name)} if layout.recompute_granularity == "full" else {}


def _bridge_fp8_params(layout: Layout) -> dict[str, Any]:
    """fp8 parameters in Bridge. The named mixed-precision recipe is applied over model.*, ddp.* and optimizer.* at
    run time and decides them: its fp8 recipes with per-tensor or MXFP8 scaling gather fp8 parameters, the blockwise
    one does not (megatron/bridge/training/mixed_precision.py). So on is written where the recipe agrees (the
    consumer test holds the run to it) and refused where it cannot; off writes nothing: a bridge-yaml of an fp8
    layout then runs with the recipe's fp8 weights, 1-2 B per parameter less than the model charges."""
    if not layout.fp8_param_gather:
        return {}
    if layout.precision == "fp8-blockwise":
        raise SpecError("fp8_param_gather with fp8-blockwise: Megatron-Bridge's blockwise recipe "
                        "(bf16_with_fp8_subchannel_scaling_mixed) keeps bf16 weights; export megatron-args instead")
    ddp = fp8_param_fields(layout)
    return {"model.fp8_param": True, **{f"ddp.{k}": v for k, v in ddp.items()},
            **({"optimizer.reuse_grad_buf_for_mxfp8_param_ag": True} if layout.precision == "mxfp8" else {})}


def _bridge_comm_overlap(layout: Layout) -> dict[str, Any]:
    """Bridge's CommOverlapConfig, whole enough to build on its own. Where a recipe has one (Qwen3-MoE on GB200
    turns the EP overlap on there), `setup` writes its fields over the model's, the EP overlap False unless set;
    where a recipe has none (Qwen3-MoE's common recipes), this one is built. It says what the cost model assumes:
    the EP all-to-all overlapped exactly when the layout says, the sequence-parallel collectives overlapped
    where TP > 1 (`tp_exposed`); the recipe's other fields are kept (YAML merges key by key)."""
    return {"_target_": "megatron.bridge.training.comm_overlap.CommOverlapConfig",
            "tp_comm_overlap": layout.tp > 1 and layout.sp,
            "overlap_moe_expert_parallel_comm": layout.ep_overlap}


# Dimensions whose Bridge override is more than `path: value` (every other one is exactly that).
_BRIDGE: dict[str, Callable[[Layout], dict[str, Any]]] = {
    "vpp": lambda lay: {"model.virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None},
    "recompute": _bridge_recompute,
    "recompute_method": _bridge_full_only("recompute_method"),
    "recompute_num_layers": _bridge_full_only("recompute_num_layers"),
    "cuda_graphs": _bridge_graphs,
    "precision": _bridge_precision,
    "dispatcher": _bridge_fields("dispatcher"),
    "routing": _bridge_fields("routing"),
    "optimizer_offload": lambda lay: {f"optimizer.{k}": v for k, v in offload_fields(lay).items()},
    "distributed_optimizer": lambda lay: {"optimizer.use_distributed_optimizer": lay.distributed_optimizer,
                                          "ddp.use_distributed_optimizer": lay.distributed_optimizer},
    "sequence_parallel": lambda lay: {"model.sequence_parallel": lay.sp},
    "ep_overlap": lambda lay: {"model.overlap_moe_expert_parallel_comm": lay.ep_overlap,
                               "comm_overlap": _bridge_comm_overlap(lay)},
    "hierarchical_cp": lambda lay: {"model.hierarchical_context_parallel_sizes": list(lay.hierarchical_cp) or None},
    # off is written too (a recipe may turn these on: Qwen3-MoE's full-iteration recipes stash, its GB200 ones keep
    # bf16 moments), so the run is what the cost model assumed
    "activation_offload": lambda lay: {"model.fine_grained_activation_offloading": False, "model.offload_modules": [],
                                       **{f"model.{k}": v for k, v in activation_offload_fields(lay).items()},
                                       # Bridge refuses the offload under TE >= 2.10 without TE's v1 offload path
                                       **({"env_vars": {"NVTE_CPU_OFFLOAD_V1": 1}} if lay.activation_offload else {})},
    "activation_offload_fraction": lambda lay: {"model.activation_offload_fraction": lay.activation_offload_fraction},
    "expert_stash": _bridge_fields("expert_stash"),
    "optimizer_states": lambda lay: {f"optimizer.{k}": v for k, v in _optimizer_state_fields(lay).items()},
    "fp8_param_gather": _bridge_fp8_params,
}


def bridge_overrides(layout: Layout, seq_len: int, model: Any = None) -> dict[str, Any]:
    """ConfigContainer overrides: model.* (TransformerConfig), train.*, optimizer.*, ddp.*, dataset.* and
    mixed_precision (a Bridge recipe name: it is applied over model.* at run time); one rendering per
    dimension of the registry; with `model`, also its layer kinds (`family_fields`), grouped expert GEMMs and
    the pipeline split the cost model assumed (search_spaces.cost.pipeline)."""
    family = family_fields(model) if model is not None else {}
    if "linear_attention_freq" in family:  # Bridge takes the Python value, not Megatron-LM's string
        family["linear_attention_freq"] = _pattern_value(family["linear_attention_freq"])
    if "window_attn_skip_freq" in family:
        family["window_attn_skip_freq"] = _pattern_value(family["window_attn_skip_freq"])
    # The sequence length under Bridge's names: GPTModelProvider.seq_length (checked equal to the dataset's)
    # and GPTDatasetConfig.seq_length, which Bridge copies over Megatron-Core's sequence_length at finalize.
    # With the model, the pipeline split is written whole (a recipe's own layout would not fit another PP).
    model_fields = {} if model is None else {**moe_kernel_fields(model),
                                             **megatron_split_fields(model, layout.pp, layout.vpp)}
    layers = None if model is None else moe_layer_list(model)
    if layers is not None:  # interleaved dense and MoE layers: a recipe's first-k-dense pattern would not fit
        model_fields["moe_layer_freq"] = layers
    out: dict[str, Any] = {"model": {"seq_length": int(seq_len), **family, **model_fields},
                           "train": {}, "optimizer": {}, "ddp": {}, "dataset": {"seq_length": int(seq_len)}}
    for dim in DIMENSIONS:
        render = _BRIDGE.get(dim.name)
        if render:
            fields = render(layout)
        else:
            assert dim.megatron is not None, f"dimension {dim.name}: no Bridge path and no rendering"
            fields = {dim.megatron: dim.megatron_value(getattr(layout, dim.name))}
        for path, value in fields.items():
            if "." not in path:  # a ConfigContainer entry of its own (the mixed-precision recipe)
                out[path] = value
                continue
            section, name = path.split(".", 1)
            out.setdefault(section, {})[name] = value
    return out


def _pattern_value(text: str) -> int | list[int]:
    return [int(b) for b in text.strip("[]").split(",")] if text.startswith("[") else int(text)


def bridge_overrides_yaml(layout: Layout, seq_len: int, model: Any = None) -> str:
    return yaml.safe_dump(bridge_overrides(layout, seq_len, model), sort_keys=False)
