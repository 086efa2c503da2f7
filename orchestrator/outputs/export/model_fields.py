"""The Megatron-Core config fields of a model (a ModelSpec) beyond its sizes, which both renderings write: its layer
kinds besides full attention (`family_fields`: Qwen3-Next's gated delta-net, gpt-oss's sliding windows, sinks and
biases) and the grouped expert GEMMs of an MoE; `model_attr` reads a model field with its default."""

from __future__ import annotations

from typing import Any


def model_attr(model: Any, name: str, default: Any = None) -> Any:
    value = getattr(model, name, default)
    return default if value is None else value


def moe_kernel_fields(model: Any) -> dict[str, Any]:
    """Grouped expert GEMMs, as Megatron-Bridge's MoE providers and our trainer run them: Megatron-Core
    refuses the selective recompute of moe_act without them."""
    return {"moe_grouped_gemm": True} if model_attr(model, "num_experts", 0) else {}


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
    hf = model_attr(model, "hf_config", {}) or {}
    out: dict[str, Any] = {}
    if "linear" in kinds:
        out.update(experimental_attention_variant="gated_delta_net",
                   linear_attention_freq=_layer_pattern(kinds, "linear", "full"),
                   linear_conv_kernel_dim=int(model_attr(model, "linear_conv_kernel_dim", 4) or 4),
                   linear_key_head_dim=int(model.linear_key_head_dim),
                   linear_value_head_dim=int(model.linear_value_head_dim),
                   linear_num_key_heads=int(model.linear_num_key_heads),
                   linear_num_value_heads=int(model.linear_num_value_heads))
    if "sliding" in kinds:  # HF's window counts the query itself, Megatron's does not
        out.update(window_size=[int(model.sliding_window) - 1, 0],
                   window_attn_skip_freq=_layer_pattern(kinds, "sliding", "full"))
    if model_attr(model, "attention_sinks", False):
        out["softmax_type"] = "learnable"
    for flag, field in (("attention_output_gate", "attention_output_gate"), ("qk_layernorm", "qk_layernorm"),
                        ("shared_expert_gate", "moe_shared_expert_gate")):
        if model_attr(model, flag, False):
            out[field] = True
    if str(hf.get("model_type", "")) == "qwen3_next":
        out["layernorm_zero_centered_gamma"] = True  # Qwen3-Next's (1 + weight) norms
    if model_attr(model, "linear_bias", False):
        out.update(add_bias_linear=True, glu_linear_offset=1.0,
                   activation_func_clamp_value=float(hf.get("swiglu_limit", 7.0)))
    return out
