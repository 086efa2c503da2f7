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
        return h * (q + kv + gate) + q * h + (2 * self.head_dim if self.qk_layernorm else 0)

    def mlp_params(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * ffn

    def expert_params_per_layer(self) -> int:
        """Routed-expert parameters of one MoE layer (all experts)."""
        return self.num_experts * self.mlp_params(self.moe_ffn_hidden_size)

    def dense_params_per_layer(self, index: int) -> int:
        """Parameters of a decoder layer that are not routed experts (attention, norms, dense/shared MLP, router)."""
        p = self.attention_params(index) + 2 * self.hidden_size
        if self.layer_is_moe(index):
            p += self.hidden_size * self.num_experts + self.mlp_params(self.shared_expert_ffn_hidden_size)
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
            if int(num_layers) < 1:
                raise SpecError(f"num_layers must be >= 1, got {num_layers}")
            changes["num_layers"] = int(num_layers)
            changes["first_k_dense"] = min(self.first_k_dense, int(num_layers) - 1) if self.is_moe else 0
        if hidden_size is not None:
            if int(hidden_size) < 1:
                raise SpecError(f"hidden_size must be >= 1, got {hidden_size}")
            changes["hidden_size"] = int(hidden_size)
        if not changes:
            return self
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("hf_config")
        d.update(is_moe=self.is_moe, is_mla=self.is_mla)
        return d


def _get(cfg: dict, *names: str, default: Any = 0) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _attention_pattern(cfg: dict) -> str:
    layer_types = cfg.get("layer_types")
    if layer_types:
        letters = "".join({"sliding_attention": "S", "linear_attention": "L"}.get(t, "F") for t in layer_types)
        # shortest repeating unit, so with_overrides(num_layers=...) keeps the pattern
        for n in range(1, len(letters) + 1):
            if len(letters) % n == 0 and letters[:n] * (len(letters) // n) == letters:
                return letters[:n]
        return letters
    interval = cfg.get("full_attention_interval")
    if interval:
        return "L" * (int(interval) - 1) + "F"
    return "F"


def from_hf_config(cfg: dict, name: str) -> ModelSpec:
    """Normalise a Hugging Face config.json dict (DeepSeek-V3, Qwen3(-MoE/-Next), gpt-oss, Llama, Kimi)."""
    try:
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"model config {name!r} lacks a required field ({exc})") from None
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    ffn = int(_get(cfg, "intermediate_size", default=4 * hidden))
    experts = int(_get(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0))
    moe_ffn = int(_get(cfg, "moe_intermediate_size", default=ffn)) if experts else 0
    shared_n = int(_get(cfg, "n_shared_experts", default=0))
    shared_ffn = shared_n * moe_ffn
    if cfg.get("shared_expert_intermediate_size"):
        shared_n, shared_ffn = max(shared_n, 1), int(cfg["shared_expert_intermediate_size"])
    pattern = _attention_pattern(cfg)
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, ffn_hidden_size=ffn, vocab_size=vocab,
        num_experts=experts, moe_ffn_hidden_size=moe_ffn, topk=int(_get(cfg, "num_experts_per_tok")) if experts else 0,
        num_shared_experts=shared_n if experts else 0, shared_expert_ffn_hidden_size=shared_ffn if experts else 0,
        first_k_dense=int(_get(cfg, "first_k_dense_replace")) if experts else 0,
        q_lora_rank=int(_get(cfg, "q_lora_rank")), kv_lora_rank=int(_get(cfg, "kv_lora_rank")),
        qk_nope_head_dim=int(_get(cfg, "qk_nope_head_dim")), qk_rope_head_dim=int(_get(cfg, "qk_rope_head_dim")),
        v_head_dim=int(_get(cfg, "v_head_dim")), mtp_layers=int(_get(cfg, "num_nextn_predict_layers")),
        attention_pattern=pattern, sliding_window=int(_get(cfg, "sliding_window")) if "S" in pattern else 0,
        attention_output_gate=bool(cfg.get("attention_output_gate", cfg.get("model_type") == "qwen3_next")),
        qk_layernorm=bool(cfg.get("qk_layernorm", str(cfg.get("model_type", "")).startswith("qwen3")
                                  and not cfg.get("kv_lora_rank"))),
        linear_num_key_heads=int(_get(cfg, "linear_num_key_heads")),
        linear_num_value_heads=int(_get(cfg, "linear_num_value_heads")),
        linear_key_head_dim=int(_get(cfg, "linear_key_head_dim")),
        linear_value_head_dim=int(_get(cfg, "linear_value_head_dim")),
        linear_conv_kernel_dim=int(_get(cfg, "linear_conv_kernel_dim")),
        gated_mlp=cfg.get("hidden_act", "silu") in ("silu", "swiglu") or cfg.get("model_type") == "gpt_oss",
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(_get(cfg, "max_position_embeddings")),
        hf_config=dict(cfg),
    )


@lru_cache(maxsize=64)
def _load_cached(name_or_path: str) -> ModelSpec:
    path = CATALOG_DIR / f"{name_or_path}.json"
    name = name_or_path
    if not path.is_file():
        candidate = Path(name_or_path)
        if candidate.is_dir():
            candidate = candidate / "config.json"
        if not candidate.is_file():
            raise SpecError(f"unknown model {name_or_path!r}; known: {', '.join(MODEL_NAMES)} (or a config.json path)")
        path = candidate
        name = candidate.parent.name if candidate.name == "config.json" else candidate.stem
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read model config {str(path)!r}: {exc}") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"model config {str(path)!r} is not a JSON object")
    return from_hf_config(cfg, name)


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name (see MODEL_NAMES) or the path of a Hugging Face config.json (or its folder)."""
    return _load_cached(str(name_or_path).strip())
