"""The activations the CPU trainer saved (trainers/measure.py, by saving module) as the memory model's terms.

search_spaces/cost/memory.py keys a layer's activations by the recompute module that frees them (residual,
layernorm, attention, core_attn, mla_up_proj, mlp, router, moe, moe_act, shared_experts); the trainer records
them by the module that saved each tensor. TERM_RULES maps one onto the other, so that each term can be
checked on its own (bench/memory_accuracy.py, tests/search_spaces/test_memory_match.py). Pure Python: no torch.
"""

from __future__ import annotations

import fnmatch
import re

# The saving module (relative to its decoder layer; `:in` = one of its inputs, `:child` = the output of its
# submodule `child`, as trainers/measure.py names them) -> the term of search_spaces/cost/memory.py it belongs
# to. First match wins. Checkpoints save what they will recompute from: those inputs stay with the term
# that is kept (the layer input: residual; the pre-MLP norm output: layernorm).
TERM_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("residual", ("", ":in", ":pre_cross_attn_layernorm", ".input_layernorm:in", ".pre_mlp_layernorm:in")),
    ("layernorm", (".input_layernorm", ".pre_mlp_layernorm", ":pre_mlp_layernorm", ".mlp:in",
                   ".self_attention.linear_qkv:in", ".self_attention.linear_q_down_proj:in",
                   ".self_attention.linear_q_proj:in", ".self_attention.linear_kv_down_proj:in",
                   ".mlp.router:in", ".mlp.linear_fc1:in", ".mlp.shared_experts.linear_fc1:in")),
    ("core_attn", (".self_attention.core_attention", ".self_attention.core_attention.*")),
    ("mla_up_proj*", (".self_attention.core_attention:in", ".self_attention")),
    ("attention", (".self_attention*",)),
    ("router", (".mlp.router*",)),
    ("moe_act", (".mlp.experts", ".mlp.experts.linear_fc2:in")),
    ("moe", (".mlp", ".mlp.experts*", ".mlp.token_dispatcher*")),
    ("shared_experts", (".mlp.shared_experts*",)),
    ("mlp", (".mlp*",)),
]
LAYER = re.compile(r"^layer(\d+)(.*)$")


def term_of(owner: str, mla: bool, moe_layers: set[int]) -> str:
    """The memory-model term of one saving module (see TERM_RULES); outside the decoder layers: embedding,
    head, or recompute_inputs for what full recompute's checkpoints keep."""
    match = LAYER.match(owner)
    if not match:
        if owner.startswith("embedding"):
            return "embedding"
        return "recompute_inputs" if owner.startswith("decoder") and "final_layernorm" not in owner else "head"
    rest = match.group(2)
    for term, patterns in TERM_RULES:
        if any(fnmatch.fnmatchcase(rest, p) for p in patterns):
            if term == "mla_up_proj*":  # MLA's q/k/v and RoPE tables; with GQA they are plain attention
                return "mla_up_proj" if mla else "attention"
            if term == "moe" and int(match.group(1)) not in moe_layers:
                return "mlp"  # what a dense layer's MLP makes itself (the SwiGLU tensors)
            return term
    raise ValueError(f"no memory-model term for the saving module {owner!r}")


def moe_layers_of(by_module: dict[str, int]) -> set[int]:
    """Decoder layers whose records show a router or routed experts (whole-MoE recompute hides both, and
    then the layer's MLP saved nothing but its checkpoint's input)."""
    return {int(m.group(1)) for owner in by_module if (m := LAYER.match(owner))
            and m.group(2).startswith((".mlp.router", ".mlp.experts"))}


def measured_terms(by_module: dict[str, int], mla: bool) -> dict[str, float]:
    moe_layers = moe_layers_of(by_module)
    terms: dict[str, float] = {}
    for owner, nbytes in by_module.items():
        term = term_of(owner, mla, moe_layers)
        terms[term] = terms.get(term, 0.0) + nbytes
    return terms
