"""A Layout on a model as Megatron-LM `pretrain_gpt.py` flags: `megatron_args` (an argv list), `megatron_args_text`
(one flag per line), `layout_args` (the layout's own flags, one rendering per dimension) and `model_args` (the
architecture flags of a ModelSpec). megatron_lm_reader.py reads a layout back from such flags."""

from __future__ import annotations

import shlex
from typing import Any, Callable

from search_spaces.cost.pipeline import SPLIT_DEFAULTS, megatron_split_fields
from search_spaces.layouts.layout import BY_NAME, DIMENSIONS, Layout

from orchestrator.outputs.export.layout_fields import (
    activation_offload_fields,
    cuda_graph_impl,
    dimension_fields,
    fp8_param_fields,
    offload_fields,
)
from orchestrator.outputs.export.model_fields import (
    family_fields,
    list_expression,
    model_attr,
    moe_kernel_fields,
    moe_layer_list,
)

# Megatron-LM flags whose name is not the config field's (`--field-name` otherwise).
_LM_FLAG_OF_FIELD = {"fp8": "--fp8-format"}


# ---- the layout's flags --------------------------------------------------------------------------

def _recompute_flags(layout: Layout) -> list[str]:
    if layout.recompute_granularity == "selective":
        return ["--recompute-granularity", "selective", "--recompute-modules", *layout.recompute_modules]
    if layout.recompute_granularity == "full":
        return ["--recompute-granularity", "full"]
    return []


def _graph_flags(layout: Layout) -> list[str]:
    impl, modules = cuda_graph_impl(layout)
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
    "precision": lambda lay: _field_flags(dimension_fields(lay, "precision")),
    "dispatcher": lambda lay: _field_flags(dimension_fields(lay, "dispatcher")),
    "routing": lambda lay: _field_flags(dimension_fields(lay, "routing")),
    "optimizer_offload": lambda lay: _field_flags(offload_fields(lay)),
    "distributed_optimizer": lambda lay: ["--use-distributed-optimizer"] if lay.distributed_optimizer else [],
    "sequence_parallel": lambda lay: ["--sequence-parallel"] if lay.sp else [],
    "ep_overlap": lambda lay: ["--overlap-moe-expert-parallel-comm"] if lay.ep_overlap else [],
    "hierarchical_cp": lambda lay: (["--hierarchical-context-parallel-sizes", *map(str, lay.hierarchical_cp)]
                                    if lay.hierarchical_cp else []),
    "activation_offload": lambda lay: _field_flags(activation_offload_fields(lay)),
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
    "fp8_param_gather": lambda lay: _field_flags(fp8_param_fields(lay)),
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


# ---- the model's flags ---------------------------------------------------------------------------

def _moe_layer_freq(model: Any) -> str | None:
    """Megatron's --moe-layer-freq pattern: the model's per-layer list (`moe_layer_list`: interleaved dense and
    MoE layers), else the first k layers dense, the rest MoE."""
    layers = moe_layer_list(model)
    if layers is not None:
        return list_expression(layers)
    k = int(model_attr(model, "first_k_dense", 0))
    if not k:
        return None
    return f"([0]*{k}+[1]*{int(model.num_layers) - k})"


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


def _size_flags(model: Any) -> list[str]:
    heads = int(model.num_attention_heads)
    argv = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--num-attention-heads", str(heads)]
    ffn = model_attr(model, "ffn_hidden_size")
    if ffn:
        argv += ["--ffn-hidden-size", str(ffn)]
    return argv


def _attention_flags(model: Any) -> list[str]:
    """Multi-latent attention's ranks and head sizes, or grouped-query attention's groups and head size."""
    argv: list[str] = []
    if model_attr(model, "is_mla", False):
        argv += ["--multi-latent-attention"]
        if model_attr(model, "q_lora_rank"):
            argv += ["--q-lora-rank", str(model.q_lora_rank)]
        argv += ["--kv-lora-rank", str(model.kv_lora_rank),
                 "--qk-head-dim", str(model.qk_nope_head_dim),
                 "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim),
                 "--v-head-dim", str(model.v_head_dim)]
    else:
        heads = int(model.num_attention_heads)
        kv_heads = int(model_attr(model, "num_kv_heads", heads))
        if kv_heads != heads:
            argv += ["--group-query-attention", "--num-query-groups", str(kv_heads)]
        if model_attr(model, "head_dim"):
            argv += ["--kv-channels", str(model.head_dim)]
    return argv


def _moe_flags(model: Any) -> list[str]:
    """The experts, their grouped GEMMs, the shared experts and the dense first layers (none for a dense model)."""
    if not model_attr(model, "num_experts", 0):
        return []
    argv = ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.topk),
            "--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size), *_field_flags(moe_kernel_fields(model))]
    shared = int(model_attr(model, "shared_expert_ffn_hidden_size", 0))  # all shared experts together
    if shared:
        argv += ["--moe-shared-expert-intermediate-size", str(shared)]
    freq = _moe_layer_freq(model)
    if freq:
        argv += ["--moe-layer-freq", freq]
    return argv


def _mlp_flags(model: Any) -> list[str]:
    """The MLP's gated activation and its linear biases."""
    argv: list[str] = []
    if model_attr(model, "linear_bias", False):
        argv += ["--quick-geglu"]  # gpt-oss: gated quick-GELU (clamp and offset in family_fields)
    elif model_attr(model, "gated_mlp", True):
        argv += ["--swiglu"]
    argv += ([] if model_attr(model, "linear_bias", False) else ["--disable-bias-linear"])
    return argv


def _rope_flags(model: Any) -> list[str]:
    argv = ["--position-embedding-type", "rope"]
    rotary = float((model_attr(model, "hf_config", {}) or {}).get("partial_rotary_factor", 1.0))
    if rotary != 1.0:
        argv += ["--rotary-percent", repr(rotary)]
    return argv


def model_args(model: Any, seq_len: int) -> list[str]:
    """Architecture flags from a ModelSpec (RMSNorm, RoPE, no linear bias unless the model has them), with the
    layer kinds of Qwen3-Next (gated delta-net) and gpt-oss (sliding window, sinks, biases): `family_fields`.
    """
    argv = _size_flags(model) + _attention_flags(model) + _moe_flags(model)
    if model_attr(model, "mtp_layers", 0):
        argv += ["--mtp-num-layers", str(model.mtp_layers)]
    if not model_attr(model, "tie_embeddings", False):
        argv += ["--untie-embeddings-and-output-weights"]
    argv += ["--normalization", "RMSNorm"]
    argv += _mlp_flags(model)
    argv += _rope_flags(model)
    argv += _family_flags(model)
    eps = (model_attr(model, "hf_config", {}) or {}).get("rms_norm_eps")
    if eps:
        argv += ["--norm-epsilon", repr(float(eps))]
    argv += ["--seq-length", str(int(seq_len)), "--max-position-embeddings", str(int(seq_len))]
    return argv


# ---- both together -------------------------------------------------------------------------------

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
