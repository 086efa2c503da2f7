"""How a model's config.json was read, in words and as data (`moe-autotune model`): its decoder layers by kind in
compressed form (`12 × [dense+chunked, MoE+chunked, dense+chunked, MoE+global]`), its experts, top-k and shared
experts, its total and active parameters, the fields ignored and why, and what the cost terms approximate.

The figures are the ModelSpec's own (search_spaces/catalog/models.py): the same the cost model estimates with.
"""

from __future__ import annotations

from typing import Any

from search_spaces.catalog.models import MODEL_NAMES, ModelSpec

MAX_PERIOD = 16  # the longest repeating unit looked for (Llama-4: 4 layers; Qwen3-Next: 4)


def layer_label(model: ModelSpec, index: int) -> str:
    """`mlp+attention` of decoder layer `index`: dense / MoE, and full (global where some layers are local),
    sliding, chunked, linear, or MLA."""
    mlp = "MoE" if model.layer_is_moe(index) else "dense"
    kind = model.read_attention_kind(index)
    if model.is_mla and kind == "full":
        attention = "MLA"
    elif kind == "full":
        local = {model.read_attention_kind(i) for i in range(model.num_layers)} & {"sliding", "chunked"}
        attention = "global" if local else "full"
    else:
        attention = kind
    return f"{mlp}+{attention}"


def compress(labels: list[str]) -> list[tuple[int, list[str]]]:
    """Runs of a repeating unit: [(times, unit), ...] covering `labels` in order; at each position the unit (up
    to MAX_PERIOD long) whose repeats cover the most labels, the shortest among equals."""
    out: list[tuple[int, list[str]]] = []
    i, n = 0, len(labels)
    while i < n:
        best_p, best_k = 1, 1
        for p in range(1, min(MAX_PERIOD, n - i) + 1):
            unit = labels[i:i + p]
            k = 1
            while labels[i + k * p:i + (k + 1) * p] == unit:
                k += 1
            if k > 1 and k * p > best_p * best_k:
                best_p, best_k = p, k
        out.append((best_k, labels[i:i + best_p]))
        i += best_p * best_k
    return out


def pattern_text(model: ModelSpec) -> str:
    """The decoder layers by kind, compressed: `3 × dense+MLA, 58 × MoE+MLA`."""
    runs = compress([layer_label(model, i) for i in range(model.num_layers)])
    parts = []
    for times, unit in runs:
        body = unit[0] if len(unit) == 1 else "[" + ", ".join(unit) + "]"
        parts.append(f"{times} × {body}" if times > 1 else body)
    return ", ".join(parts)


def describe(model: ModelSpec) -> dict[str, Any]:
    """The reading as data (`moe-autotune model --json`)."""
    reading = model.reading or {}
    return {
        "model": model.name,
        "text_config": bool(reading.get("text_config")),
        "layers": model.num_layers,
        "pattern": pattern_text(model),
        "layer_kinds": [layer_label(model, i) for i in range(model.num_layers)],
        "moe_layers": model.num_moe_layers,
        "dense_layers": model.num_dense_layers,
        "dense_ffn_hidden_size": sorted({model.dense_ffn(i) for i in range(model.num_layers)
                                         if not model.layer_is_moe(i)}),
        "mtp_layers": model.mtp_layers,
        "experts": model.num_experts,
        "topk": model.topk,
        "expert_ffn_hidden_size": model.moe_ffn_hidden_size,
        "shared_experts": model.num_shared_experts,
        "shared_expert_ffn_hidden_size": model.shared_expert_ffn_hidden_size,
        "attention_chunk_size": model.attention_chunk_size,
        "sliding_window": model.sliding_window,
        "total_params": model.total_params(),
        "active_params": model.active_params(),
        "ignored": [{"field": f, "why": why} for f, why in reading.get("ignored", [])],
        "approximated": list(reading.get("approximated", [])),
        "notes": list(reading.get("notes", [])),
    }


def billions(n: int) -> str:
    return f"{n / 1e12:.3f} T" if n >= 1e12 else f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n:,}"


def config_reading(model: str, spec: ModelSpec) -> dict[str, Any] | None:
    """The reading of `spec` (describe) where `model`, a command's --model or a sweep spec's model, is the path of a
    config.json (or its folder), not a catalog name; None for a catalog name."""
    return None if str(model).strip() in MODEL_NAMES else describe(spec)


def reading_lines(d: dict[str, Any]) -> list[str]:
    """The lines `moe-autotune model` prints of a reading (describe); the docs' model-reading page and a sweep's
    MLflow parent run (model_reading.txt) show the same."""
    lines = [d["model"] + (" (the text model, read from text_config)" if d["text_config"] else ""),
             f"layers: {d['layers']} = {d['pattern']}"]
    if d["experts"]:
        shared = (f", {d['shared_experts']} shared ({d['shared_expert_ffn_hidden_size']:,} wide in all)"
                  if d["shared_experts"] else ", no shared expert")
        dense = f" ({', '.join(f'{w:,}' for w in d['dense_ffn_hidden_size'])} wide)" if d["dense_layers"] else ""
        lines.append(f"experts: {d['experts']} routed, each {d['expert_ffn_hidden_size']:,} wide, top-{d['topk']}"
                     f"{shared}; {d['moe_layers']} MoE and {d['dense_layers']} dense layers{dense}")
    if d["mtp_layers"]:
        lines.append(f"MTP layers: {d['mtp_layers']}")
    lines.append(f"parameters: {billions(d['total_params'])} total, {billions(d['active_params'])} active per token")
    lines += [f"approximated: {note}" for note in d["approximated"]]
    lines += [f"note: {note}" for note in d["notes"]]
    by_reason: dict[str, list[str]] = {}
    for item in d["ignored"]:
        by_reason.setdefault(item["why"], []).append(item["field"])
    lines += [f"ignored: {', '.join(fields)}: {why}" for why, fields in by_reason.items()]
    return lines
