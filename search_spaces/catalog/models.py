"""Model catalog: Hugging Face config.json files normalised into one `ModelSpec`.

The catalog is data (search_spaces/catalog/hf_configs/<name>.json, in HF vocabulary) so a user can also pass the
path of any local config.json. Normalisation follows the field mappings Megatron-Bridge's *_bridge.py use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)

from search_spaces.bounded import read_json
from search_spaces.errors import SpecError
from search_spaces.inputs import MAX_EXPERTS, MAX_LAYERS, MAX_MODEL_WIDTH, MAX_MTP_LAYERS, check_size, excerpt
from search_spaces.pydantic_line import one_line

CATALOG_DIR = Path(__file__).parent / "hf_configs"
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


Size = Annotated[int, Strict(), Field(ge=1, le=MAX_MODEL_WIDTH)]  # a width or count that must be given as >= 1
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_MODEL_WIDTH)]  # 0 where it means none
LayerType: TypeAlias = Literal[tuple(LAYER_TYPES)]  # type: ignore[valid-type]


class HFConfig(BaseModel):
    """The fields of a Hugging Face config.json the cost model reads, with their names across model families
    (Megatron-Bridge's *_bridge.py mappings), types and ranges, and the relations between them. A field set to
    null counts as not given; every other field of the file is kept as it is (ModelSpec.hf_config)."""
    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

    hidden_size: Size
    """The model's width."""
    num_hidden_layers: Annotated[int, Strict(), Field(ge=1, le=MAX_LAYERS)]
    """Decoder layers (MTP layers apart)."""
    num_attention_heads: Size
    """Query heads of the softmax attention."""
    vocab_size: Size
    """Tokens of the vocabulary (before Megatron pads it)."""
    intermediate_size: Size | None = None
    """The dense MLP's width (default 4 x hidden_size)."""
    num_key_value_heads: Size | None = None
    """KV heads (default: one per attention head); they divide the attention heads."""
    head_dim: Size | None = None
    """Per-head width (default hidden_size / num_attention_heads)."""
    num_experts: Annotated[int, Strict(), Field(ge=0, le=MAX_EXPERTS)] = Field(
        0, validation_alias=AliasChoices("n_routed_experts", "num_experts", "num_local_experts"))
    """Routed experts (DeepSeek n_routed_experts, Qwen num_experts, gpt-oss num_local_experts); 0: dense."""
    moe_intermediate_size: Count | None = None
    """An expert's width (default intermediate_size); >= 1 in a MoE model."""
    num_experts_per_tok: Count | None = None
    """Top-k of the router; a MoE model must give it (1 to its experts)."""
    n_shared_experts: Count = 0
    """Shared experts, each of moe_intermediate_size (DeepSeek)."""
    shared_expert_intermediate_size: Count = 0
    """The shared expert's width where given whole (Qwen3-Next) rather than as n_shared_experts experts."""
    first_k_dense_replace: Count = 0
    """Leading dense layers of a MoE model (at least one MoE layer must be left)."""
    q_lora_rank: Count = 0
    """MLA's query latent rank (0: queries projected directly)."""
    kv_lora_rank: Count = 0
    """MLA's KV latent rank; > 0 makes the model MLA (then v_head_dim and a q/k head width must be >= 1)."""
    qk_nope_head_dim: Count = 0
    """MLA: the per-head query/key width without RoPE."""
    qk_rope_head_dim: Count = 0
    """MLA: the per-head query/key width with RoPE."""
    v_head_dim: Count = 0
    """MLA: the per-head value width."""
    layer_types: list[LayerType] | None = None
    """The attention kind of every layer (num_hidden_layers entries)."""
    full_attention_interval: Size | None = None
    """Without layer_types: every this-many-th layer is full attention, the others linear (Qwen3-Next)."""
    sliding_window: Count = 0
    """Tokens a sliding-window layer sees; >= 1 when some layer is sliding_attention."""
    linear_num_key_heads: Count = 0
    """Gated delta-net key heads (>= 1 when some layer is linear_attention, as the three below)."""
    linear_num_value_heads: Count = 0
    """Gated delta-net value heads."""
    linear_key_head_dim: Count = 0
    """Gated delta-net key head width."""
    linear_value_head_dim: Count = 0
    """Gated delta-net value head width."""
    linear_conv_kernel_dim: Count = 0
    """Gated delta-net short convolution's kernel width."""
    num_nextn_predict_layers: Annotated[int, Strict(), Field(ge=0, le=MAX_MTP_LAYERS)] = 0
    """MTP layers."""
    model_type: StrictStr = ""
    """Decides the defaults of the flags below (qwen3*, qwen3_next, gpt_oss)."""
    hidden_act: StrictStr = "silu"
    """silu / swiglu: a gated MLP (3 projections)."""
    attention_output_gate: StrictBool | None = None
    """A sigmoid gate on the attention output (default: qwen3_next)."""
    qk_layernorm: StrictBool | None = None
    """RMSNorm on q and k per head (default: the qwen3 family without MLA)."""
    linear_bias: StrictBool | None = None
    """A bias in every linear layer (default: gpt_oss)."""
    attention_sinks: StrictBool | None = None
    """A learnable softmax offset per head (default: gpt_oss)."""
    shared_expert_gate: StrictBool | None = None
    """A sigmoid gate on the shared expert's output (default: qwen3_next)."""
    tie_word_embeddings: StrictBool = False
    """The output layer shares the embedding's weights."""
    max_position_embeddings: Annotated[int, Strict(), Field(ge=0, le=2 ** 31 - 1)] = 0
    """The longest sequence the model was trained for (informational)."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _relations(self) -> "HFConfig":
        """The relations the cost model relies on, each refused in one line naming its field."""
        layers, heads, pattern = self.num_hidden_layers, self.num_attention_heads, self.attention_pattern
        if self.layer_types is not None and len(self.layer_types) != layers:
            raise ValueError(f"field layer_types must be a list of {layers} entries (num_hidden_layers), "
                             f"got {len(self.layer_types)}")
        if self.layer_types is None and (self.full_attention_interval or 0) > layers:
            raise ValueError(f"field full_attention_interval must be <= {layers} (num_hidden_layers), "
                             f"got {self.full_attention_interval}")
        if heads % self.kv_heads:
            raise ValueError(f"field num_key_value_heads ({self.kv_heads}) must divide num_attention_heads ({heads})")
        if self.kv_lora_rank:
            if self.qk_nope_head_dim + self.qk_rope_head_dim < 1:
                raise ValueError("an MLA model (kv_lora_rank > 0) needs qk_nope_head_dim or qk_rope_head_dim >= 1")
            if self.v_head_dim < 1:
                raise ValueError("field v_head_dim must be >= 1 in an MLA model (kv_lora_rank > 0)")
        elif self.head_dim is None and self.hidden_size % heads:
            raise ValueError(f"field num_attention_heads ({heads}) must divide hidden_size ({self.hidden_size}) "
                             "when no head_dim is given")
        if "S" in pattern and not self.sliding_window:
            raise ValueError("field sliding_window must be given for sliding_attention layers")
        missing = [n for n in LINEAR_FIELDS if "L" in pattern and not getattr(self, n)]
        if missing:
            raise ValueError(f"field {missing[0]} must be given for linear_attention layers")
        if self.num_experts:
            _check_moe(self, layers)
        return self

    @property
    def attention_pattern(self) -> str:
        """The attention kinds as ModelSpec.attention_pattern letters, the shortest repeating unit (so
        with_overrides(num_layers=...) keeps the pattern)."""
        if self.layer_types is not None:
            letters = "".join(LAYER_TYPES[t] for t in self.layer_types)
            for n in range(1, len(letters) + 1):
                if len(letters) % n == 0 and letters[:n] * (len(letters) // n) == letters:
                    return letters[:n]
            return letters
        interval = self.full_attention_interval
        return "L" * (interval - 1) + "F" if interval else "F"

    @property
    def ffn(self) -> int:
        return self.intermediate_size if self.intermediate_size is not None else 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads if self.num_key_value_heads is not None else self.num_attention_heads

    @property
    def moe_ffn(self) -> int:
        return self.moe_intermediate_size if self.moe_intermediate_size is not None else self.ffn


LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")


def _check_moe(c: HFConfig, layers: int) -> None:
    experts = c.num_experts
    if c.moe_ffn < 1:
        raise ValueError(f"field moe_intermediate_size must be >= 1 in a MoE model, got {c.moe_ffn}")
    if c.num_experts_per_tok is None:
        raise ValueError(f"lacks num_experts_per_tok, the top-k of its {experts} experts")
    if not 1 <= c.num_experts_per_tok <= experts:
        raise ValueError(f"field num_experts_per_tok ({c.num_experts_per_tok}) must be between 1 and the number "
                         f"of experts ({experts})")
    if c.first_k_dense_replace >= layers:
        raise ValueError(f"field first_k_dense_replace ({c.first_k_dense_replace}) leaves no MoE layer of {layers}")


def _moe(c: HFConfig) -> dict[str, int]:
    """Experts, expert width, top-k, shared experts, leading dense layers (all 0 for a dense model)."""
    if not c.num_experts:
        return dict(num_experts=0, moe_ffn_hidden_size=0, topk=0, num_shared_experts=0,
                    shared_expert_ffn_hidden_size=0, first_k_dense=0)
    if c.num_experts_per_tok is None:  # _check_moe refuses a MoE config without it
        raise ValueError(f"lacks num_experts_per_tok, the top-k of its {c.num_experts} experts")
    shared_n, shared_ffn = c.n_shared_experts, c.n_shared_experts * c.moe_ffn
    if c.shared_expert_intermediate_size:
        shared_n, shared_ffn = max(shared_n, 1), c.shared_expert_intermediate_size
    return dict(num_experts=c.num_experts, moe_ffn_hidden_size=c.moe_ffn, topk=c.num_experts_per_tok,
                num_shared_experts=shared_n, shared_expert_ffn_hidden_size=shared_ffn,
                first_k_dense=c.first_k_dense_replace)


def from_hf_config(cfg: dict, name: str, source: str | None = None) -> ModelSpec:
    """Normalise a Hugging Face config.json dict (DeepSeek-V3, Qwen3(-MoE/-Next), gpt-oss, Llama, Kimi).

    Fields are checked like the spec's (HFConfig): integers that are integers, sizes >= 1 (0 only where it means
    none: experts, MTP layers, LoRA ranks), and the relations the cost model relies on. `source` names the file."""
    try:
        c = HFConfig.model_validate(cfg)
    except ValidationError as exc:
        raise SpecError(f"model config {source or name!r}: {one_line(exc, HFConfig)}") from None
    kind, mla = c.model_type, c.kv_lora_rank > 0
    pattern = c.attention_pattern
    return ModelSpec(
        name=name, num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
        ffn_hidden_size=c.ffn, vocab_size=c.vocab_size, **_moe(c), num_kv_heads=c.kv_heads,
        head_dim=c.head_dim if c.head_dim is not None else c.hidden_size // c.num_attention_heads,
        sliding_window=c.sliding_window if "S" in pattern else 0, q_lora_rank=c.q_lora_rank,
        kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
        v_head_dim=c.v_head_dim, **{n: getattr(c, n) for n in LINEAR_FIELDS},
        linear_conv_kernel_dim=c.linear_conv_kernel_dim, mtp_layers=c.num_nextn_predict_layers,
        attention_pattern=pattern, attention_output_gate=_flag(c.attention_output_gate, kind == "qwen3_next"),
        qk_layernorm=_flag(c.qk_layernorm, kind.startswith("qwen3") and not mla),
        gated_mlp=c.hidden_act in ("silu", "swiglu") or kind == "gpt_oss",
        linear_bias=_flag(c.linear_bias, kind == "gpt_oss"), attention_sinks=_flag(c.attention_sinks,
                                                                                   kind == "gpt_oss"),
        shared_expert_gate=_flag(c.shared_expert_gate, kind == "qwen3_next"), tie_embeddings=c.tie_word_embeddings,
        max_position_embeddings=c.max_position_embeddings, hf_config=dict(cfg),
    )


def _flag(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _read_config(path: Path) -> dict:
    """A config.json as a dict: at most 1 MiB of UTF-8 JSON, an object, within search_spaces.bounded's bounds
    (nested at most MAX_CONFIG_DEPTH levels, integers of at most 64 digits, each key once)."""
    cfg = read_json(path, "model config", max_depth=MAX_CONFIG_DEPTH)
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
            raise SpecError(f"unknown model {excerpt(name_or_path, 100)}; known: {', '.join(MODEL_NAMES)} (or a "
                            "config.json path)")
        path = candidate
        name = candidate.parent.name if candidate.name == "config.json" else candidate.stem
    return from_hf_config(_read_config(path), name, source=str(path))


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name (see MODEL_NAMES) or the path of a Hugging Face config.json (or its folder)."""
    return _load_cached(str(name_or_path).strip())
