"""The Megatron-Core config fields of a Layout's choices that both renderings write (Megatron-LM flags in
megatron_lm.py, Megatron-Bridge overrides in bridge.py): CUDA-graph scopes, optimizer and activation offload, fp8
parameters, and a dimension's fields as its declaration spells them (search_spaces.layouts.layout)."""

from __future__ import annotations

from typing import Any

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import BY_NAME, Layout


def cuda_graph_impl(layout: Layout) -> tuple[str, list[str]]:
    """(cuda_graph_impl, cuda_graph_modules). Per-layer scopes are captured with Transformer Engine."""
    graphs = list(layout.cuda_graphs)
    if not graphs:
        return "none", []
    if "full_iteration" in graphs:
        if len(graphs) > 1:
            raise SpecError("CUDA-graph scope full_iteration cannot be combined with per-layer scopes")
        return "full_iteration", []
    return "transformer_engine", graphs


def dimension_fields(layout: Layout, name: str) -> dict[str, Any]:
    """The Megatron-Core config fields of one dimension's value, as its declaration spells them."""
    return BY_NAME[name].megatron_fields(getattr(layout, name))


def offload_fields(layout: Layout) -> dict[str, Any]:
    """OptimizerConfig fields of an optimizer offload. Megatron's hybrid device optimizer runs through the
    precision-aware optimizer's code path: Megatron-LM refuses --optimizer-cpu-offload without it."""
    if layout.optimizer_offload <= 0:
        return {}
    return {"optimizer_cpu_offload": True, "optimizer_offload_fraction": layout.optimizer_offload,
            "use_precision_aware_optimizer": True}


def activation_offload_fields(layout: Layout) -> dict[str, Any]:
    """TransformerConfig fields of the fine-grained activation offload (none when off). Megatron-Core needs a cap on
    the offloads in flight under full-iteration graphs (one per module: each waits for its previous copy), and
    Transformer Engine's op fuser for fused_group_mlp."""
    if not layout.activation_offload:
        return {}
    fields: dict[str, Any] = {"fine_grained_activation_offloading": True,
                              "offload_modules": list(layout.activation_offload)}
    if "full_iteration" in layout.cuda_graphs:
        fields["fine_grained_offloading_max_inflight_offloads"] = 1
    if "fused_group_mlp" in layout.activation_offload:
        fields["use_transformer_engine_op_fuser"] = True
    return fields


def fp8_param_fields(layout: Layout) -> dict[str, Any]:
    """DDP fields of fp8 parameters (none when off). MXFP8 weights cannot be mapped into the param buffer: their
    all-gather borrows the gradient buffer (Megatron-Bridge refuses MXFP8 fp8_param_gather without it)."""
    if not layout.fp8_param_gather:
        return {}
    return {"fp8_param_gather": True,
            **({"reuse_grad_buf_for_mxfp8_param_ag": True} if layout.precision == "mxfp8" else {})}
