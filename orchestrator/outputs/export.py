"""A Layout (+ model + sequence length) as something a production job can run, and back.

Three renderings of the same layout:
- `megatron_args`: Megatron-LM `pretrain_gpt.py` flags (argv list; `megatron_args_text` one flag per line);
- `bridge_overrides`: Megatron-Bridge ConfigContainer overrides ({model,train,optimizer,ddp,dataset}.field);
- `sbatch_script`: a ready Slurm launch (torchrun per node under srun, running pretrain_gpt.py).
`layout_from_megatron_args` parses the flags back to a Layout (round trip).

Values are spelled as each dimension's declaration says (search_spaces.layouts.layout: `megatron_values`, ...). Every
flag, field name and value is checked against what consumes it: Megatron-LM's own argument parser and the
megatron-core 0.19.2 config dataclasses (tests/orchestrator/test_export.py), Megatron-Bridge's override loading and the
value
sets Megatron-Core / Transformer Engine accept (tests/orchestrator/test_consumers.py). No torch or megatron import here.
"""

from __future__ import annotations

import argparse
import re
import shlex
from typing import Any, Callable, Iterable

import yaml

from search_spaces.cost.pipeline import SPLIT_DEFAULTS, megatron_split_fields
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import BY_NAME, DIMENSIONS, Layout

# Megatron-LM flags whose name is not the config field's (`--field-name` otherwise).
_LM_FLAG_OF_FIELD = {"fp8": "--fp8-format"}


# ---- pieces shared by the renderings ---------------------------------------------------------------

def _cuda_graph_impl(layout: Layout) -> tuple[str, list[str]]:
    """(cuda_graph_impl, cuda_graph_modules). Per-layer scopes are captured with Transformer Engine."""
    graphs = list(layout.cuda_graphs)
    if not graphs:
        return "none", []
    if "full_iteration" in graphs:
        if len(graphs) > 1:
            raise SpecError("CUDA-graph scope full_iteration cannot be combined with per-layer scopes")
        return "full_iteration", []
    return "transformer_engine", graphs


def _megatron_fields(layout: Layout, name: str) -> dict[str, Any]:
    """The Megatron-Core config fields of one dimension's value, as its declaration spells them."""
    return BY_NAME[name].megatron_fields(getattr(layout, name))


def _offload_fields(layout: Layout) -> dict[str, Any]:
    """OptimizerConfig fields of an optimizer offload. Megatron's hybrid device optimizer runs through the
    precision-aware optimizer's code path: Megatron-LM refuses --optimizer-cpu-offload without it."""
    if layout.optimizer_offload <= 0:
        return {}
    return {"optimizer_cpu_offload": True, "optimizer_offload_fraction": layout.optimizer_offload,
            "use_precision_aware_optimizer": True}


def _activation_offload_fields(layout: Layout) -> dict[str, Any]:
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


def _optimizer_state_fields(layout: Layout) -> dict[str, Any]:
    """OptimizerConfig fields of the moments' precision: written for fp32 too, over a recipe that sets bf16."""
    return _megatron_fields(layout, "optimizer_states")


def _fp8_param_fields(layout: Layout) -> dict[str, Any]:
    """DDP fields of fp8 parameters (none when off). MXFP8 weights cannot be mapped into the param buffer: their
    all-gather borrows the gradient buffer (Megatron-Bridge refuses MXFP8 fp8_param_gather without it)."""
    if not layout.fp8_param_gather:
        return {}
    return {"fp8_param_gather": True,
            **({"reuse_grad_buf_for_mxfp8_param_ag": True} if layout.precision == "mxfp8" else {})}


def _attr(model: Any, name: str, default: Any = None) -> Any:
    value = getattr(model, name, default)
    return default if value is None else value


def _moe_kernel_fields(model: Any) -> dict[str, Any]:
    """Grouped expert GEMMs, as Megatron-Bridge's MoE providers and our trainer run them: Megatron-Core
    refuses the selective recompute of moe_act without them."""
    return {"moe_grouped_gemm": True} if _attr(model, "num_experts", 0) else {}


def _moe_layer_freq(model: Any) -> str | None:
    """Megatron's --moe-layer-freq pattern: the first k layers dense, the rest MoE."""
    k = int(_attr(model, "first_k_dense", 0))
    if not k:
        return None
    return f"([0]*{k}+[1]*{int(model.num_layers) - k})"


# ---- Megatron-LM flags ---------------------------------------------------------------------------

def _recompute_flags(layout: Layout) -> list[str]:
    if layout.recompute_granularity == "selective":
        return ["--recompute-granularity", "selective", "--recompute-modules", *layout.recompute_modules]
    if layout.recompute_granularity == "full":
        return ["--recompute-granularity", "full"]
    return []


def _graph_flags(layout: Layout) -> list[str]:
    impl, modules = _cuda_graph_impl(layout)
    if impl == "none":
        return []
    if impl == "full_iteration":  # Megatron-LM refuses a graphed iteration that checks for NaNs
        return ["--cuda-graph-impl", impl, "--no-check-for-nan-in-loss-and-grad"]
    return ["--cuda-graph-impl", impl] + (["--cuda-graph-modules", *modules] if modules else [])


def _field_flags(fields: dict[str, Any]) -> list[str]:
    """Megatron-LM flags of Megatron-Core config fields: `--field-name value`, a true bool as the bare flag."""
    argv: list[str] = []
    for name, value in fields.items():
        flag = _LM_FLAG_OF_FIELD.get(name, "--" + name.replace("_", "-"))
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):  # nargs="+"
            argv += [flag, *map(str, value)]
        elif value is not False:
            argv += [flag, str(value)]
    return argv


def _full_recompute_only(name: str):
    dim = BY_NAME[name]
    return lambda layout: ([dim.megatron_lm, str(getattr(layout, name))]
                           if layout.recompute_granularity == "full" else [])


# Dimensions whose Megatron-LM spelling is more than `--flag value` (every other one is exactly that).
_LM_FLAGS: dict[str, Callable[[Layout], list[str]]] = {
    "vpp": lambda lay: ["--num-virtual-stages-per-pipeline-rank", str(lay.vpp)] if lay.vpp > 1 else [],
    "recompute": _recompute_flags,
    "recompute_method": _full_recompute_only("recompute_method"),
    "recompute_num_layers": _full_recompute_only("recompute_num_layers"),
    "cuda_graphs": _graph_flags,
    "precision": lambda lay: _field_flags(_megatron_fields(lay, "precision")),
    "dispatcher": lambda lay: _field_flags(_megatron_fields(lay, "dispatcher")),
    "routing": lambda lay: _field_flags(_megatron_fields(lay, "routing")),
    "optimizer_offload": lambda lay: _field_flags(_offload_fields(lay)),
    "distributed_optimizer": lambda lay: ["--use-distributed-optimizer"] if lay.distributed_optimizer else [],
    "sequence_parallel": lambda lay: ["--sequence-parallel"] if lay.sp else [],
    "ep_overlap": lambda lay: ["--overlap-moe-expert-parallel-comm"] if lay.ep_overlap else [],
    "hierarchical_cp": lambda lay: (["--hierarchical-context-parallel-sizes", *map(str, lay.hierarchical_cp)]
                                    if lay.hierarchical_cp else []),
    "activation_offload": lambda lay: _field_flags(_activation_offload_fields(lay)),
    "activation_offload_fraction": lambda lay: ["--activation-offload-fraction", str(lay.activation_offload_fraction)]
    if lay.activation_offload_fraction != 1.0 else [],
    # Megatron-LM 0.19.2 has no flag for Transformer Engine's op fuser, which HybridEP's rank budget needs: the
    # paged stash runs from the bridge-yaml
    "expert_stash": lambda lay: [] if lay.expert_stash == "none" else [
        "--moe-paged-stash", "--moe-expert-rank-capacity-factor",
        str(BY_NAME["expert_stash"].parameter(lay.expert_stash))],
    "optimizer_states": lambda lay: [] if lay.optimizer_states == "fp32" else [  # Megatron-LM's dtype names
        "--use-precision-aware-optimizer", "--exp-avg-dtype", lay.optimizer_states, "--exp-avg-sq-dtype",
        lay.optimizer_states],
    "fp8_param_gather": lambda lay: _field_flags(_fp8_param_fields(lay)),
}


def layout_args(layout: Layout) -> list[str]:
    """The layout's own flags, one rendering per dimension of the registry."""
    argv: list[str] = []
    for dim in DIMENSIONS:
        render = _LM_FLAGS.get(dim.name)
        if render:
            argv += render(layout)
            continue
        assert dim.megatron_lm is not None, f"dimension {dim.name}: no Megatron-LM flag and no rendering"
        argv += [dim.megatron_lm, str(dim.megatron_value(getattr(layout, dim.name)))]
    return argv


def _layer_pattern(kinds: list[str], kind: str, last: str) -> str:
    """Megatron's per-layer frequency argument (1 = `kind`): the integer N when every N-th layer is `last`
    and the others `kind` (Megatron's int form), else a list expression Megatron-LM evaluates."""
    bits = [int(k == kind) for k in kinds]
    for n in range(2, len(bits) + 1):
        if bits == [0 if (i + 1) % n == 0 else 1 for i in range(len(bits))] and kinds[n - 1] == last:
            return str(n)
    return "[" + ",".join(map(str, bits)) + "]"


def family_fields(model: Any) -> dict[str, Any]:
    """TransformerConfig fields of the layer kinds besides full attention, as Megatron-Bridge's Qwen3-Next and
    gpt-oss bridges set them: gated delta-net layers (experimental attention variant), sliding windows,
    attention sinks, gated attention output, the shared-expert gate, linear biases and gpt-oss's clamped GLU
    (its quick-GELU activation is a function: Megatron-LM's --quick-geglu, Bridge's provider sets it)."""
    kinds = list(model.attention_kinds()) if hasattr(model, "attention_kinds") else []
    hf = _attr(model, "hf_config", {}) or {}
    out: dict[str, Any] = {}
    if "linear" in kinds:
        out.update(experimental_attention_variant="gated_delta_net",
                   linear_attention_freq=_layer_pattern(kinds, "linear", "full"),
                   linear_conv_kernel_dim=int(_attr(model, "linear_conv_kernel_dim", 4) or 4),
                   linear_key_head_dim=int(model.linear_key_head_dim),
                   linear_value_head_dim=int(model.linear_value_head_dim),
                   linear_num_key_heads=int(model.linear_num_key_heads),
                   linear_num_value_heads=int(model.linear_num_value_heads))
    if "sliding" in kinds:  # HF's window counts the query itself, Megatron's does not
        out.update(window_size=[int(model.sliding_window) - 1, 0],
                   window_attn_skip_freq=_layer_pattern(kinds, "sliding", "full"))
    if _attr(model, "attention_sinks", False):
        out["softmax_type"] = "learnable"
    for flag, field in (("attention_output_gate", "attention_output_gate"), ("qk_layernorm", "qk_layernorm"),
                        ("shared_expert_gate", "moe_shared_expert_gate")):
        if _attr(model, flag, False):
            out[field] = True
    if str(hf.get("model_type", "")) == "qwen3_next":
        out["layernorm_zero_centered_gamma"] = True  # Qwen3-Next's (1 + weight) norms
    if _attr(model, "linear_bias", False):
        out.update(add_bias_linear=True, glu_linear_offset=1.0,
                   activation_func_clamp_value=float(hf.get("swiglu_limit", 7.0)))
    return out


def _family_flags(model: Any) -> list[str]:
    argv: list[str] = []
    for field, value in family_fields(model).items():
        flag = {"layernorm_zero_centered_gamma": "--apply-layernorm-1p"}.get(field, "--" + field.replace("_", "-"))
        if field == "add_bias_linear":
            continue  # Megatron-LM's default; model_args leaves out --disable-bias-linear
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return argv


def model_args(model: Any, seq_len: int) -> list[str]:
    """Architecture flags from a ModelSpec (RMSNorm, RoPE, no linear bias unless the model has them), with the
    layer kinds of Qwen3-Next (gated delta-net) and gpt-oss (sliding window, sinks, biases): `family_fields`.
    """
    heads = int(model.num_attention_heads)
    argv = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--num-attention-heads", str(heads)]
    ffn = _attr(model, "ffn_hidden_size")
    if ffn:
        argv += ["--ffn-hidden-size", str(ffn)]
    if _attr(model, "is_mla", False):
        argv += ["--multi-latent-attention"]
        if _attr(model, "q_lora_rank"):
            argv += ["--q-lora-rank", str(model.q_lora_rank)]
        argv += ["--kv-lora-rank", str(model.kv_lora_rank),
                 "--qk-head-dim", str(model.qk_nope_head_dim),
                 "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim),
                 "--v-head-dim", str(model.v_head_dim)]
    else:
        kv_heads = int(_attr(model, "num_kv_heads", heads))
        if kv_heads != heads:
            argv += ["--group-query-attention", "--num-query-groups", str(kv_heads)]
        if _attr(model, "head_dim"):
            argv += ["--kv-channels", str(model.head_dim)]
    if _attr(model, "num_experts", 0):
        argv += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.topk),
                 "--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size), *_field_flags(_moe_kernel_fields(model))]
        shared = int(_attr(model, "shared_expert_ffn_hidden_size", 0))  # all shared experts together
        if shared:
            argv += ["--moe-shared-expert-intermediate-size", str(shared)]
        freq = _moe_layer_freq(model)
        if freq:
            argv += ["--moe-layer-freq", freq]
    if _attr(model, "mtp_layers", 0):
        argv += ["--mtp-num-layers", str(model.mtp_layers)]
    if not _attr(model, "tie_embeddings", False):
        argv += ["--untie-embeddings-and-output-weights"]
    argv += ["--normalization", "RMSNorm"]
    if _attr(model, "linear_bias", False):
        argv += ["--quick-geglu"]  # gpt-oss: gated quick-GELU (clamp and offset in family_fields)
    elif _attr(model, "gated_mlp", True):
        argv += ["--swiglu"]
    argv += ([] if _attr(model, "linear_bias", False) else ["--disable-bias-linear"])
    argv += ["--position-embedding-type", "rope"]
    rotary = float((_attr(model, "hf_config", {}) or {}).get("partial_rotary_factor", 1.0))
    if rotary != 1.0:
        argv += ["--rotary-percent", repr(rotary)]
    argv += _family_flags(model)
    eps = (_attr(model, "hf_config", {}) or {}).get("rms_norm_eps")
    if eps:
        argv += ["--norm-epsilon", repr(float(eps))]
    argv += ["--seq-length", str(int(seq_len)), "--max-position-embeddings", str(int(seq_len))]
    return argv


def megatron_args(layout: Layout, model: Any, seq_len: int) -> list[str]:
    """The exact `pretrain_gpt.py` flags for this layout on this model (data/tokenizer/run flags not included)."""
    split = {k: v for k, v in megatron_split_fields(model, layout.pp, layout.vpp).items() if v != SPLIT_DEFAULTS[k]}
    argv = layout_args(layout)
    if "pipeline_model_parallel_layout" in split and layout.vpp > 1:
        # Megatron-LM takes the virtual stages from the explicit layout and refuses both flags together
        at = argv.index("--num-virtual-stages-per-pipeline-rank")
        del argv[at:at + 2]
    return model_args(model, seq_len) + argv + _field_flags(split)


def megatron_args_text(layout: Layout, model: Any, seq_len: int) -> str:
    """One flag (with its values) per line, shell-quoted: `shlex.split` of the text gives the argv back."""
    lines: list[list[str]] = []
    for token in megatron_args(layout, model, seq_len):
        if token.startswith("--"):
            lines.append([token])
        else:
            lines[-1].append(token)
    return "\n".join(" ".join(shlex.quote(t) for t in line) for line in lines) + "\n"


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


def layout_from_megatron_args(args: str | Iterable[str]) -> Layout:
    """Parse Megatron-LM flags (argv list, or text as in megatron-args.txt) back to a Layout.

    Flags that are not about the layout (model size, data, ...) are ignored. `sequence_parallel` comes back
    as None when it equals what Megatron requires (on iff TP > 1), as the search space writes it.
    """
    argv = shlex.split(args, comments=True) if isinstance(args, str) else list(args)
    try:
        ns, _ = _layout_parser().parse_known_args(argv)
    except SystemExit:
        raise SpecError("cannot parse the Megatron arguments (a flag is missing its value?)") from None
    if ns.global_batch_size is None:
        raise SpecError("Megatron arguments lack --global-batch-size")
    # Megatron reads --fp8-recipe only with an --fp8-format
    precision = BY_NAME["precision"].from_megatron(
        {"fp8_recipe": ns.fp8_recipe if ns.fp8_format else None, "fp8": ns.fp8_format, "bf16": ns.bf16})
    if ns.cuda_graph_impl == "full_iteration":
        graphs: list[str] = ["full_iteration"]
    elif ns.cuda_graph_impl in ("local", "transformer_engine"):
        graphs = list(ns.cuda_graph_modules)
        if not graphs:
            raise SpecError("whole-layer CUDA graphs (empty --cuda-graph-modules) are not a layout choice")
    else:
        graphs = []
    dispatcher = BY_NAME["dispatcher"].from_megatron({"moe_token_dispatcher_type": ns.moe_token_dispatcher_type,
                                                      "moe_flex_dispatcher_backend": ns.moe_flex_dispatcher_backend})
    routing = BY_NAME["routing"].from_megatron({
        "moe_expert_capacity_factor": ns.moe_expert_capacity_factor,
        "moe_pad_expert_input_to_capacity": ns.moe_pad_expert_input_to_capacity,
        "moe_token_drop_policy": ns.moe_token_drop_policy if ns.moe_expert_capacity_factor is not None else None,
        "moe_router_force_load_balancing": ns.moe_router_force_load_balancing})
    if len(ns.cp_comm_type) != 1:
        raise SpecError("per-layer --cp-comm-type lists are not a layout choice")
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
        cuda_graphs=tuple(graphs), precision=precision, dispatcher=dispatcher, routing=routing,
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
    return Layout(**fields)


# ---- Megatron-Bridge overrides -------------------------------------------------------------------

def _bridge_recompute(layout: Layout) -> dict[str, Any]:
    gran = layout.recompute_granularity
    out: dict[str, Any] = {"model.recompute_granularity": None if gran == "none" else gran}
    if gran == "selective":
        out["model.recompute_modules"] = list(layout.recompute_modules)
    return out


def _bridge_graphs(layout: Layout) -> dict[str, Any]:
    impl, modules = _cuda_graph_impl(layout)
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
    ddp = _fp8_param_fields(layout)
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
    "optimizer_offload": lambda lay: {f"optimizer.{k}": v for k, v in _offload_fields(lay).items()},
    "distributed_optimizer": lambda lay: {"optimizer.use_distributed_optimizer": lay.distributed_optimizer,
                                          "ddp.use_distributed_optimizer": lay.distributed_optimizer},
    "sequence_parallel": lambda lay: {"model.sequence_parallel": lay.sp},
    "ep_overlap": lambda lay: {"model.overlap_moe_expert_parallel_comm": lay.ep_overlap,
                               "comm_overlap": _bridge_comm_overlap(lay)},
    "hierarchical_cp": lambda lay: {"model.hierarchical_context_parallel_sizes": list(lay.hierarchical_cp) or None},
    # off is written too (a recipe may turn these on: Qwen3-MoE's full-iteration recipes stash, its GB200 ones keep
    # bf16 moments), so the run is what the cost model assumed
    "activation_offload": lambda lay: {"model.fine_grained_activation_offloading": False, "model.offload_modules": [],
                                       **{f"model.{k}": v for k, v in _activation_offload_fields(lay).items()},
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
    model_fields = {} if model is None else {**_moe_kernel_fields(model),
                                             **megatron_split_fields(model, layout.pp, layout.vpp)}
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


def layout_yaml(layout: Layout, **context: Any) -> str:
    """layout.yaml: the Layout.to_dict() fields (what `--layout FILE` reads), context as comments."""
    header = "".join(f"# {k}: {v}\n" for k, v in context.items() if v is not None)
    return header + yaml.safe_dump(layout.to_dict(), sort_keys=False)


# ---- Slurm launch --------------------------------------------------------------------------------

def sbatch_script(layout: Layout, model: Any, seq_len: int, num_gpus: int, gpus_per_node: int = 8,
                  job_name: str | None = None, time_limit: str = "04:00:00") -> str:
    """A ready sbatch file: one torchrun per node (srun), pretrain_gpt.py with the exported flags.

    The caller sets MEGATRON_LM (checkout with pretrain_gpt.py) and, for real data, DATA_ARGS (defaults to
    Megatron's mock data with a null tokenizer of the model's vocabulary size) and TRAIN_ARGS.
    """
    num_gpus = int(num_gpus)
    gpus_per_node = max(1, min(int(gpus_per_node), num_gpus))
    if num_gpus % gpus_per_node:
        raise SpecError(f"{num_gpus} GPUs do not fill nodes of {gpus_per_node} GPUs")
    nodes = num_gpus // gpus_per_node
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", job_name or f"{getattr(model, 'name', 'model')}-{seq_len}")
    flags = " \\\n    ".join(megatron_args_text(layout, model, seq_len).splitlines())
    vocab = int(_attr(model, "vocab_size", 32000))
    dp = layout.dp(num_gpus) or "?"
    # Megatron-LM refuses fine-grained activation offload under Transformer Engine >= 2.10 without TE's v1 offload
    # path (which offloads activations, not weights)
    offload_env = "\nexport NVTE_CPU_OFFLOAD_V1=1" if layout.activation_offload else ""
    return f"""#!/bin/bash
# Launch generated by moe-autotune: {layout.key()}
# {num_gpus} GPUs = {nodes} node(s) x {gpus_per_node}; TP{layout.tp} CP{layout.cp} PP{layout.pp} DP{dp} EP{layout.ep}
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --exclusive
#SBATCH --time={time_limit}
set -euo pipefail

: "${{MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (with pretrain_gpt.py)}}"
DATA_ARGS=${{DATA_ARGS:---mock-data --tokenizer-type NullTokenizer --vocab-size {vocab}}}
TRAIN_ARGS=${{TRAIN_ARGS:---train-iters 100 --lr 1e-4 --log-interval 1}}
# sed reads every line: `head -n 1` would close the pipe early and pipefail turn the SIGPIPE into a failure
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
MASTER_PORT=${{MASTER_PORT:-29500}}
export CUDA_DEVICE_MAX_CONNECTIONS=${{CUDA_DEVICE_MAX_CONNECTIONS:-{layout.cuda_device_max_connections}}}{offload_env}

# DATA_ARGS / TRAIN_ARGS are split into words on purpose.
# shellcheck disable=SC2086
srun --kill-on-bad-exit=1 torchrun \\
    --nnodes "$SLURM_NNODES" --nproc-per-node {gpus_per_node} \\
    --rdzv-backend c10d --rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\
    "$MEGATRON_LM/pretrain_gpt.py" \\
    {flags} \\
    $DATA_ARGS $TRAIN_ARGS "$@"
"""
