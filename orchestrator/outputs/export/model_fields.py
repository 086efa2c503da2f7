"""The Megatron-Core config fields of a model (a ModelSpec) beyond its sizes, which both renderings write: its layer
kinds besides full attention (`family_fields`: Qwen3-Next's gated delta-net, gpt-oss's sliding windows, sinks and
biases) and the grouped expert GEMMs of an MoE; `model_attr` reads a model field with its default."""

from __future__ import annotations

from typing import Any


def model_attr(model: Any, name: str, default: Any = None) -> Any:
    value = getattr(model, name, default)
    return default if value is None else value


def moe_layer_list(model: Any) -> list[int] | None:
    """ModelSpec.moe_layer_list, for a model that has it (None: the first-k-dense form or a dense model)."""
    return model.moe_layer_list() if hasattr(model, "moe_layer_list") else None


def moe_kernel_fields(model: Any) -> dict[str, Any]:
    """Grouped expert GEMMs, as Megatron-Bridge's MoE providers and our trainer run them: Megatron-Core
    refuses the selective recompute of moe_act without them."""
    return {"moe_grouped_gemm": True} if model_attr(model, "num_experts", 0) else {}


def list_expression(bits: list[int]) -> str:
    """A per-layer list as the Python list expression Megatron-LM's --moe-layer-freq evaluates: its shortest
    repeating unit times the repeats ("([0,1]*24)"), or the whole list."""
    for n in range(1, len(bits) + 1):
        if len(bits) % n == 0 and bits[:n] * (len(bits) // n) == bits:
            unit = "[" + ",".join(map(str, bits[:n])) + "]"
            return f"({unit}*{len(bits) // n})" if len(bits) > n else unit
    return "[" + ",".join(map(str, bits)) + "]"


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
    if str(hf.get("model_type", "")) in ("llama4", "llama4_text"):  # Llama4TextMoe: top-1 sigmoid score, applied
        out.update(moe_router_score_function="sigmoid", moe_apply_probs_on_input=True)  # to the expert's input
    if str(hf.get("model_type", "")) == "qwen3_next":
        out["layernorm_zero_centered_gamma"] = True  # Qwen3-Next's (1 + weight) norms
    if model_attr(model, "linear_bias", False):
        out.update(add_bias_linear=True, glu_linear_offset=1.0,
                   activation_func_clamp_value=float(hf.get("swiglu_limit", 7.0)))
    return out
