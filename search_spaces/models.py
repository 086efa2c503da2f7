"""Model catalog: Hugging Face config.json files normalised into one `ModelSpec`.

The catalog is data (search_spaces/catalog/models/<name>.json, in HF vocabulary) so a user can also pass the
path of any local config.json. Normalisation follows the field mappings Megatron-Bridge's *_bridge.py use.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from search_spaces.errors import SpecError
from search_spaces.inputs import (MAX_EXPERTS, MAX_LAYERS, MAX_MODEL_WIDTH, MAX_MTP_LAYERS, check_size,
                                  read_text_file)

CATALOG_DIR = Path(__file__).parent / "catalog" / "models"
MODEL_NAMES: tuple[str, ...] = tuple(sorted(p.stem for p in CATALOG_DIR.glob("*.json")))

# One letter per attention kind in `attention_pattern` (cycled over the layers):
# F full (softmax) attention, S sliding-window attention, L linear attention (gated delta-net).
ATTENTION_KINDS = {"F": "full", "S": "sliding", "L": "linear"}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    num_experts: int = 0  # 0 = dense
    moe_ffn_hidden_size: int = 0
    topk: int = 0
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0
    first_k_dense: int = 0
    # MLA (DeepSeek-style multi-latent attention); 0 when not MLA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0
    # attention kind per layer, cycled: "F" everywhere, "LLLF" for Qwen3-Next, "SF" for gpt-oss
    attention_pattern: str = "F"
    sliding_window: int = 0
    attention_output_gate: bool = False
    qk_layernorm: bool = False  # RMSNorm on q and k per head (Qwen3 family)
    # gated delta-net (linear attention) dims
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    gated_mlp: bool = True  # SwiGLU: 3 projections per MLP
    # gpt-oss: a bias in every linear layer (attention, router, experts) and a learnable attention sink
    # (softmax offset) per head; Qwen3-Next: a sigmoid gate on the shared expert's output
    linear_bias: bool = False
    attention_sinks: bool = False
    shared_expert_gate: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 0
    hf_config: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        """MoE decoder layers (MTP layers not included)."""
        return self.num_layers - self.first_k_dense if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def layer_is_moe(self, index: int) -> bool:
        """Decoder layer `index` (0-based; MTP layers use index >= num_layers and are MoE like the last)."""
        return self.is_moe and index >= self.first_k_dense

    def attention_kind(self, index: int) -> str:
        """full | sliding | linear for decoder layer `index`; MTP layers (index >= num_layers) are full
        attention (Megatron builds an MTP block's layer from the full-attention layer spec)."""
        if index >= self.num_layers:
            return "full"
        return ATTENTION_KINDS[self.attention_pattern[index % len(self.attention_pattern)]]

    def attention_kinds(self) -> tuple[str, ...]:
        return tuple(self.attention_kind(i) for i in range(self.num_layers))

    @property
    def q_head_dim(self) -> int:
        """Per-head width of queries/keys (MLA: nope + rope)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    # ---- parameter counts (unsharded) -------------------------------------------------------------
    def attention_params(self, index: int = 0) -> int:
        h = self.hidden_size
        if self.attention_kind(index) == "linear":
            qk = self.linear_key_head_dim * self.linear_num_key_heads
            v = self.linear_value_head_dim * self.linear_num_value_heads
            # in_proj (q, k, v, z gate, b, a), conv1d, out_proj, norm
            return h * (2 * qk + 2 * v + 2 * self.linear_num_value_heads) + self.linear_conv_kernel_dim * (
                2 * qk + v) + v * h + 2 * self.linear_num_value_heads + self.linear_value_head_dim
        if self.is_mla:
            n = self.num_attention_heads
            q = (self.q_lora_rank * (h + n * self.q_head_dim) + self.q_lora_rank) if self.q_lora_rank \
                else h * n * self.q_head_dim
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * (
                n * (self.qk_nope_head_dim + self.v_head_dim)) + self.kv_lora_rank
            return q + kv + n * self.v_head_dim * h
        q = self.num_attention_heads * self.head_dim
        kv = 2 * self.num_kv_heads * self.head_dim
        gate = q if self.attention_output_gate else 0
        biases = (q + kv + gate + h) if self.linear_bias else 0
        sinks = self.num_attention_heads if self.attention_sinks else 0
        return h * (q + kv + gate) + q * h + (2 * self.head_dim if self.qk_layernorm else 0) + biases + sinks

    def mlp_params(self, ffn: int) -> int:
        glu = 2 if self.gated_mlp else 1
        biases = (glu * ffn + self.hidden_size) if self.linear_bias and ffn else 0
        return (glu + 1) * self.hidden_size * ffn + biases

    def router_params(self) -> int:
        """Router (and shared-expert gate) of one MoE layer: never sharded by TP."""
        return (self.hidden_size * self.num_experts + (self.num_experts if self.linear_bias else 0)
                + (self.hidden_size if self.shared_expert_gate else 0))

    def expert_params_per_layer(self) -> int:
        """Routed-expert parameters of one MoE layer (all experts)."""
        return self.num_experts * self.mlp_params(self.moe_ffn_hidden_size)

    def dense_params_per_layer(self, index: int) -> int:
        """Parameters of a decoder layer that are not routed experts (attention, norms, dense/shared MLP, router)."""
        p = self.attention_params(index) + 2 * self.hidden_size
        if self.layer_is_moe(index):
            p += self.router_params() + self.mlp_params(self.shared_expert_ffn_hidden_size)
        else:
            p += self.mlp_params(self.ffn_hidden_size)
        return p

    def mtp_extra_params(self) -> int:
        """Per MTP layer besides its transformer block: eh_proj and two norms."""
        return 2 * self.hidden_size * self.hidden_size + 3 * self.hidden_size

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        layers = sum(self.dense_params_per_layer(i) + (self.expert_params_per_layer() if self.layer_is_moe(i) else 0)
                     for i in range(self.num_layers))
        mtp = self.mtp_layers * (self.dense_params_per_layer(self.num_layers) + self.expert_params_per_layer()
                                 + self.mtp_extra_params()) if self.mtp_layers else 0
        heads = self.embedding_params() * (1 if self.tie_embeddings else 2)
        return layers + mtp + heads + self.hidden_size

    def with_overrides(self, num_layers: int | None = None, hidden_size: int | None = None) -> "ModelSpec":
        """A smaller/larger copy (for CPU runs): layers and width; head counts and head_dim are kept."""
        changes: dict[str, Any] = {}
        if num_layers is not None:
            changes["num_layers"] = check_size(num_layers, "num_layers", MAX_LAYERS)
            changes["first_k_dense"] = min(self.first_k_dense, int(num_layers) - 1) if self.is_moe else 0
        if hidden_size is not None:
            changes["hidden_size"] = check_size(hidden_size, "hidden_size", MAX_MODEL_WIDTH)
        if not changes:
            return self
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("hf_config")
        d.update(is_moe=self.is_moe, is_mla=self.is_mla)
        return d


LAYER_TYPES = {"full_attention": "F", "sliding_attention": "S", "linear_attention": "L"}
MAX_CONFIG_DEPTH = 64  # a config.json nests a few levels; deeper is not a model config


class _Fields:
    """Typed, range-checked reads of a config.json dict: every refusal is one line naming field and file."""

    def __init__(self, cfg: dict, source: str):
        self.cfg = cfg
        self.source = source

    def fail(self, why: str) -> SpecError:
        return SpecError(f"model config {self.source!r}: {why}")

    def integer(self, *names: str, default: int = 0, minimum: int = 0, maximum: int = MAX_MODEL_WIDTH) -> int:
        """The first of `names` that is set (not null): an integer (not bool/float/str) in [minimum, maximum]."""
        for n in names:
            value = self.cfg.get(n)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(f"field {n} must be an integer, got {_show(value)}")
            if value < minimum:
                raise self.fail(f"field {n} must be >= {minimum}, got {_show(value)}")
            if value > maximum:  # the ranges of search_spaces/inputs.py: enumerations stay bounded
                raise self.fail(f"field {n} must be <= {maximum:,}, got {_show(value)}")
            return value
        return default

    def required(self, name: str, maximum: int = MAX_MODEL_WIDTH) -> int:
        if self.cfg.get(name) is None:
            raise self.fail(f"lacks a required field {name!r}")
        return self.integer(name, minimum=1, maximum=maximum)

    def flag(self, name: str, default: bool) -> bool:
        value = self.cfg.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"field {name} must be true or false, got {_show(value)}")
        return value

    def text(self, name: str, default: str) -> str:
        value = self.cfg.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.fail(f"field {name} must be a string, got {_show(value)}")
        return value


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, (str, int, float, bool)) else f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def _attention_pattern(f: _Fields, layers: int) -> str:
    layer_types = f.cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != layers:
            raise f.fail(f"field layer_types must be a list of {layers} entries (num_hidden_layers), "
                         f"got {_show(layer_types) if not isinstance(layer_types, list) else len(layer_types)}")
        bad = [t for t in layer_types if not isinstance(t, str) or t not in LAYER_TYPES]
        if bad:
            raise f.fail(f"field layer_types has {_show(bad[0])}; allowed: {', '.join(LAYER_TYPES)}")
        letters = "".join(LAYER_TYPES[t] for t in layer_types)
        # shortest repeating unit, so with_overrides(num_layers=...) keeps the pattern
        for n in range(1, len(letters) + 1):
            if len(letters) % n == 0 and letters[:n] * (len(letters) // n) == letters:
                return letters[:n]
        return letters
    interval = f.integer("full_attention_interval", minimum=1, maximum=layers)
    return "L" * (interval - 1) + "F" if interval else "F"


def _moe(f: _Fields, ffn: int, layers: int) -> dict[str, int]:
    """Experts, expert width, top-k, shared experts, leading dense layers (all 0 for a dense model)."""
    names = ("n_routed_experts", "num_experts", "num_local_experts")
    experts = f.integer(*names, maximum=MAX_EXPERTS)
    if not experts:
        return dict(num_experts=0, moe_ffn_hidden_size=0, topk=0, num_shared_experts=0,
                    shared_expert_ffn_hidden_size=0, first_k_dense=0)
    moe_ffn = f.integer("moe_intermediate_size", default=ffn, minimum=1)
    if f.cfg.get("num_experts_per_tok") is None:
        raise f.fail(f"lacks num_experts_per_tok, the top-k of its {experts} experts")
    topk = f.integer("num_experts_per_tok", minimum=1)
    if topk > experts:
        raise f.fail(f"field num_experts_per_tok ({topk}) must not exceed the number of experts ({experts})")
    shared_n = f.integer("n_shared_experts")
    shared_ffn = shared_n * moe_ffn
    if f.integer("shared_expert_intermediate_size"):
        shared_n, shared_ffn = max(shared_n, 1), f.integer("shared_expert_intermediate_size")
    first_k_dense = f.integer("first_k_dense_replace")
    if first_k_dense >= layers:
        raise f.fail(f"field first_k_dense_replace ({first_k_dense}) leaves no MoE layer of {layers}")
    return dict(num_experts=experts, moe_ffn_hidden_size=moe_ffn, topk=topk, num_shared_experts=shared_n,
                shared_expert_ffn_hidden_size=shared_ffn, first_k_dense=first_k_dense)


def _attention(f: _Fields, hidden: int, heads: int, pattern: str) -> dict[str, int]:
    """Head counts and widths (MLA, sliding window, linear attention), with the relations between them."""
    kv_heads = f.integer("num_key_value_heads", default=heads, minimum=1)
    if heads % kv_heads:
        raise f.fail(f"field num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads})")
    mla = {n: f.integer(n) for n in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                 "v_head_dim")}
    if mla["kv_lora_rank"]:
        if mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] < 1:
            raise f.fail("an MLA model (kv_lora_rank > 0) needs qk_nope_head_dim or qk_rope_head_dim >= 1")
        if mla["v_head_dim"] < 1:
            raise f.fail("field v_head_dim must be >= 1 in an MLA model (kv_lora_rank > 0)")
    elif f.cfg.get("head_dim") is None and hidden % heads:
        raise f.fail(f"field num_attention_heads ({heads}) must divide hidden_size ({hidden}) "
                     "when no head_dim is given")
    head_dim = f.integer("head_dim", default=hidden // heads, minimum=1)
    window = f.integer("sliding_window", minimum=1) if "S" in pattern else 0
    if "S" in pattern and not window:
        raise f.fail("field sliding_window must be given for sliding_attention layers")
    linear = {n: f.integer(n, minimum=1 if "L" in pattern else 0) for n in (
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")}
    missing = [n for n, v in linear.items() if "L" in pattern and not v]
    if missing:
        raise f.fail(f"field {missing[0]} must be given for linear_attention layers")
    return dict(num_kv_heads=kv_heads, head_dim=head_dim, sliding_window=window, **mla,
                linear_num_key_heads=linear["linear_num_key_heads"],
                linear_num_value_heads=linear["linear_num_value_heads"],
                linear_key_head_dim=linear["linear_key_head_dim"],
                linear_value_head_dim=linear["linear_value_head_dim"],
                linear_conv_kernel_dim=f.integer("linear_conv_kernel_dim"))


def from_hf_config(cfg: dict, name: str, source: str | None = None) -> ModelSpec:
    """Normalise a Hugging Face config.json dict (DeepSeek-V3, Qwen3(-MoE/-Next), gpt-oss, Llama, Kimi).

    Fields are checked like the spec's: integers that are integers, sizes >= 1 (0 only where it means none:
    experts, MTP layers, LoRA ranks), and the relations the cost model relies on. `source` names the file."""
    f = _Fields(cfg, source or name)
    hidden, layers = f.required("hidden_size"), f.required("num_hidden_layers", maximum=MAX_LAYERS)
    heads, vocab = f.required("num_attention_heads"), f.required("vocab_size")
    ffn = f.integer("intermediate_size", default=4 * hidden, minimum=1)
    pattern = _attention_pattern(f, layers)
    model_type = str(cfg.get("model_type", ""))
    attention = _attention(f, hidden, heads, pattern)
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, ffn_hidden_size=ffn,
        vocab_size=vocab, **_moe(f, ffn, layers), **attention,
        mtp_layers=f.integer("num_nextn_predict_layers", maximum=MAX_MTP_LAYERS), attention_pattern=pattern,
        attention_output_gate=f.flag("attention_output_gate", model_type == "qwen3_next"),
        qk_layernorm=f.flag("qk_layernorm", model_type.startswith("qwen3") and not attention["kv_lora_rank"]),
        gated_mlp=f.text("hidden_act", "silu") in ("silu", "swiglu") or model_type == "gpt_oss",
        linear_bias=f.flag("linear_bias", model_type == "gpt_oss"),
        attention_sinks=f.flag("attention_sinks", model_type == "gpt_oss"),
        shared_expert_gate=f.flag("shared_expert_gate", model_type == "qwen3_next"),
        tie_embeddings=f.flag("tie_word_embeddings", False),
        max_position_embeddings=f.integer("max_position_embeddings", maximum=2 ** 31 - 1),
        hf_config=dict(cfg),
    )


def _too_deep(value: Any, limit: int = MAX_CONFIG_DEPTH) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def _read_config(path: Path) -> dict:
    """A config.json as a dict: at most 1 MiB of UTF-8 JSON, an object, nested at most 64 levels."""
    text = read_text_file(path, "model config")
    try:
        cfg = json.loads(text)
    except RecursionError:
        cfg = None
        deep = True
    except ValueError as exc:
        raise SpecError(f"model config {str(path)!r} is not valid JSON ({exc})") from None
    else:
        deep = _too_deep(cfg)
    if deep:
        raise SpecError(f"model config {str(path)!r} is nested too deep (more than {MAX_CONFIG_DEPTH} levels)")
    if not isinstance(cfg, dict):
        raise SpecError(f"model config {str(path)!r} is not a JSON object")
    return cfg


@lru_cache(maxsize=64)
def _load_cached(name_or_path: str) -> ModelSpec:
    path = CATALOG_DIR / f"{name_or_path}.json"
    name = name_or_path
    if not path.is_file():
        candidate = Path(name_or_path)
        if candidate.is_dir():
            candidate = candidate / "config.json"
        if not candidate.exists():
            raise SpecError(f"unknown model {name_or_path!r}; known: {', '.join(MODEL_NAMES)} (or a config.json path)")
        path = candidate
        name = candidate.parent.name if candidate.name == "config.json" else candidate.stem
    return from_hf_config(_read_config(path), name, source=str(path))


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name (see MODEL_NAMES) or the path of a Hugging Face config.json (or its folder)."""
    return _load_cached(str(name_or_path).strip())
