"""A Layout read back from Megatron-LM flags (`layout_from_megatron_args`: an argv list, or megatron-args.txt's
text), the inverse of megatron_lm.py's `layout_args`: flags that are not about the layout are ignored, and a flag
left out reads as Megatron-LM's default."""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Iterable

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import BY_NAME, Layout


def _layout_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--context-parallel-size", type=int, default=1)
    p.add_argument("--expert-model-parallel-size", type=int, default=1)
    p.add_argument("--expert-tensor-parallel-size", type=int, default=None)
    p.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    p.add_argument("--pipeline-model-parallel-layout", default=None)  # its '|'-separated virtual stages
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--global-batch-size", type=int, default=None)
    p.add_argument("--recompute-granularity", choices=("full", "selective"), default=None)
    p.add_argument("--recompute-modules", nargs="+", default=None)
    p.add_argument("--recompute-method", choices=("uniform", "block"), default="uniform")
    p.add_argument("--recompute-num-layers", type=int, default=1)
    p.add_argument("--cuda-graph-impl", default="none")
    p.add_argument("--cuda-graph-modules", nargs="+", default=[])
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fp8-format", default=None)
    p.add_argument("--fp8-recipe", default="delayed")  # Megatron's default
    p.add_argument("--moe-token-dispatcher-type", default="allgather")  # Megatron's default
    p.add_argument("--moe-flex-dispatcher-backend", default="deepep")
    p.add_argument("--moe-expert-capacity-factor", type=float, default=None)  # Megatron's defaults below
    p.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    p.add_argument("--moe-token-drop-policy", default="probs")
    p.add_argument("--moe-router-force-load-balancing", action="store_true")
    p.add_argument("--cp-comm-type", nargs="+", default=["p2p"])
    p.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=int, default=None)
    p.add_argument("--use-distributed-optimizer", action="store_true")
    p.add_argument("--overlap-moe-expert-parallel-comm", action="store_true")
    p.add_argument("--optimizer-cpu-offload", action="store_true")
    p.add_argument("--optimizer-offload-fraction", type=float, default=1.0)  # Megatron-LM's default
    p.add_argument("--fine-grained-activation-offloading", action="store_true")
    p.add_argument("--offload-modules", nargs="+", default=[])
    p.add_argument("--activation-offload-fraction", type=float, default=1.0)
    p.add_argument("--moe-paged-stash", action="store_true")
    p.add_argument("--moe-expert-rank-capacity-factor", type=float, default=None)
    p.add_argument("--exp-avg-dtype", default="fp32")
    p.add_argument("--fp8-param-gather", action="store_true")
    return p


def _parsed(args: str | Iterable[str]) -> argparse.Namespace:
    """The layout's flags of `args`, with Megatron-LM's defaults for those left out; a global batch is required."""
    argv = shlex.split(args, comments=True) if isinstance(args, str) else list(args)
    try:
        ns, _ = _layout_parser().parse_known_args(argv)
    except SystemExit:
        raise SpecError("cannot parse the Megatron arguments (a flag is missing its value?)") from None
    if ns.global_batch_size is None:
        raise SpecError("Megatron arguments lack --global-batch-size")
    return ns


def _cuda_graphs(ns: argparse.Namespace) -> list[str]:
    if ns.cuda_graph_impl == "full_iteration":
        return ["full_iteration"]
    if ns.cuda_graph_impl in ("local", "transformer_engine"):
        graphs = list(ns.cuda_graph_modules)
        if not graphs:
            raise SpecError("whole-layer CUDA graphs (empty --cuda-graph-modules) are not a layout choice")
        return graphs
    return []


def _declared_choices(ns: argparse.Namespace) -> dict[str, Any]:
    """The dimensions whose Megatron fields their declarations read back: CUDA graphs, precision, dispatcher,
    routing (one --cp-comm-type for every layer is checked here, read in `_layout_fields`)."""
    # Megatron reads --fp8-recipe only with an --fp8-format
    precision = BY_NAME["precision"].from_megatron(
        {"fp8_recipe": ns.fp8_recipe if ns.fp8_format else None, "fp8": ns.fp8_format, "bf16": ns.bf16})
    graphs = _cuda_graphs(ns)
    dispatcher = BY_NAME["dispatcher"].from_megatron({"moe_token_dispatcher_type": ns.moe_token_dispatcher_type,
                                                      "moe_flex_dispatcher_backend": ns.moe_flex_dispatcher_backend})
    routing = BY_NAME["routing"].from_megatron({
        "moe_expert_capacity_factor": ns.moe_expert_capacity_factor,
        "moe_pad_expert_input_to_capacity": ns.moe_pad_expert_input_to_capacity,
        "moe_token_drop_policy": ns.moe_token_drop_policy if ns.moe_expert_capacity_factor is not None else None,
        "moe_router_force_load_balancing": ns.moe_router_force_load_balancing})
    if len(ns.cp_comm_type) != 1:
        raise SpecError("per-layer --cp-comm-type lists are not a layout choice")
    return {"cuda_graphs": tuple(graphs), "precision": precision, "dispatcher": dispatcher, "routing": routing}


def _layout_fields(ns: argparse.Namespace, choices: dict[str, Any]) -> dict[str, Any]:
    """Layout's fields of the parsed flags, `choices` (`_declared_choices`) among them."""
    tp = ns.tensor_model_parallel_size
    gran = ns.recompute_granularity or "none"
    vpp = ns.num_virtual_stages_per_pipeline_rank
    if vpp is None and ns.pipeline_model_parallel_layout:
        vpp = len(ns.pipeline_model_parallel_layout.split("|")) // ns.pipeline_model_parallel_size
    fields: dict[str, Any] = dict(
        tp=tp, pp=ns.pipeline_model_parallel_size, cp=ns.context_parallel_size,
        ep=ns.expert_model_parallel_size, etp=ns.expert_tensor_parallel_size or tp,
        vpp=vpp or 1,
        mbs=ns.micro_batch_size, gbs=ns.global_batch_size,
        recompute=list(ns.recompute_modules or ["core_attn"]) if gran == "selective" else gran,
        **choices,
        cp_comm_type=BY_NAME["cp_comm_type"].from_megatron({"cp_comm_type": ns.cp_comm_type[0]}),
        hierarchical_cp=tuple(ns.hierarchical_context_parallel_sizes or ()),
        optimizer_offload=ns.optimizer_offload_fraction if ns.optimizer_cpu_offload else 0.0,
        distributed_optimizer=ns.use_distributed_optimizer,
        ep_overlap=ns.overlap_moe_expert_parallel_comm,
        sequence_parallel=None if ns.sequence_parallel == (tp > 1) else ns.sequence_parallel,
        activation_offload=tuple(ns.offload_modules) if ns.fine_grained_activation_offloading else (),
        activation_offload_fraction=ns.activation_offload_fraction,
        expert_stash=f"paged:{ns.moe_expert_rank_capacity_factor}" if ns.moe_paged_stash else "none",
        optimizer_states=ns.exp_avg_dtype,
        fp8_param_gather=ns.fp8_param_gather,
    )
    if gran == "full":
        fields.update(recompute_method=ns.recompute_method, recompute_num_layers=ns.recompute_num_layers)
    return fields


def layout_from_megatron_args(args: str | Iterable[str]) -> Layout:
    """Parse Megatron-LM flags (argv list, or text as in megatron-args.txt) back to a Layout.

    Flags that are not about the layout (model size, data, ...) are ignored. `sequence_parallel` comes back
    as None when it equals what Megatron requires (on iff TP > 1), as the search space writes it.
    """
    ns = _parsed(args)
    return Layout(**_layout_fields(ns, _declared_choices(ns)))
