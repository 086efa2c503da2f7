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
from search_spaces.catalog.hf_fields import IGNORED, TOWERS, UNSUPPORTED
from search_spaces.errors import SpecError
from search_spaces.inputs import MAX_EXPERTS, MAX_LAYERS, MAX_MODEL_WIDTH, MAX_MTP_LAYERS, check_size, excerpt
from search_spaces.pydantic_line import one_line, short

CATALOG_DIR = Path(__file__).parent / "hf_configs"
MODEL_NAMES: tuple[str, ...] = tuple(sorted(p.stem for p in CATALOG_DIR.glob("*.json")))

# One letter per attention kind in `attention_pattern` (cycled over the layers):
# F full (softmax) attention, S sliding-window attention, L linear attention (gated delta-net).
ATTENTION_KINDS = {"F": "full", "S": "sliding", "L": "linear"}
# `attention_layout` adds C: chunked local attention (Llama-4), which the cost model counts as full attention
READ_ATTENTION_KINDS = {**ATTENTION_KINDS, "C": "chunked"}


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
    # the per-layer MLP pattern, where it is not `first_k_dense` dense layers then MoE: per decoder layer, 0 for a
    # MoE layer, else the width of its dense MLP (Llama-4's interleaved layers, Qwen's decoder_sparse_step and
    # mlp_only_layers, ERNIE's start/end/interval). Empty: that simple form (the catalog's models). `mlp_widths()`
    # gives the list either way.
    mlp_pattern: tuple[int, ...] = ()
    qkv_bias: bool = False  # a bias on the q, k and v projections (attention_bias / qkv_bias)
    # chunked local attention (Llama-4): the chunk's tokens; `attention_layout` says which layers (letters of
    # READ_ATTENTION_KINDS, cycled; empty: `attention_pattern`). The cost terms count chunked layers as full
    # attention (`attention_pattern` has F there): an upper bound, said in the model's reading.
    attention_chunk_size: int = 0
    attention_layout: str = ""
    # the config.json's fields (a multimodal config's: its text model's, text_config's with the outer fields it lacks)
    hf_config: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    # how the config was read (search_spaces/catalog/reading.py): the fields ignored and why, what is approximated
    reading: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

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
        if not self.is_moe:
            return 0
        if self.mlp_pattern:
            return self.mlp_pattern.count(0)
        return self.num_layers - self.first_k_dense

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def layer_is_moe(self, index: int) -> bool:
        """Decoder layer `index` (0-based; MTP layers use index >= num_layers and are MoE like the last)."""
        if not self.is_moe:
            return False
        if self.mlp_pattern:
            return self.mlp_pattern[min(index, self.num_layers - 1)] == 0
        return index >= self.first_k_dense

    def dense_ffn(self, index: int) -> int:
        """The width of decoder layer `index`'s dense MLP (for a dense layer; MTP layers: the last layer's)."""
        if self.mlp_pattern:
            return self.mlp_pattern[min(index, self.num_layers - 1)] or self.ffn_hidden_size
        return self.ffn_hidden_size

    def mlp_widths(self) -> tuple[int, ...]:
        """The per-layer MLP list: per decoder layer, 0 for a MoE layer, else its dense MLP's width."""
        return tuple(0 if self.layer_is_moe(i) else self.dense_ffn(i) for i in range(self.num_layers))

    def moe_layer_freq(self) -> list[int]:
        """Megatron-Core's `moe_layer_freq` as a list: 1 for each MoE decoder layer, 0 for a dense one."""
        return [int(self.layer_is_moe(i)) for i in range(self.num_layers)]

    def dense_width_gap(self) -> str | None:
        """Why Megatron-Core cannot build this model's dense layers, or None: it builds every dense MLP at
        ffn_hidden_size (the experts at moe_ffn_hidden_size), so a pattern of several dense widths (or one other
        than ffn_hidden_size) cannot be expressed."""
        widths = sorted({int(w) for w in self.mlp_pattern if w})
        if widths and widths != [self.ffn_hidden_size]:
            return (f"dense layers of widths {widths}: Megatron-Core builds every dense MLP at one ffn_hidden_size "
                    f"({self.ffn_hidden_size})")
        return None

    def moe_layer_list(self) -> list[int] | None:
        """Megatron-Core's moe_layer_freq as a per-layer list where the MLP pattern is not `first_k_dense` dense
        layers then MoE (a non-empty `mlp_pattern`: Llama-4's interleaved layers, Qwen's decoder_sparse_step),
        else None (that simple form, and a dense model). Each dense layer is built at ffn_hidden_size: a pattern
        of other dense widths is refused (SpecError)."""
        if not self.mlp_pattern or not self.is_moe:
            return None
        gap = self.dense_width_gap()
        if gap:
            raise SpecError(f"model {self.name}: {gap}")
        return self.moe_layer_freq()

    def read_attention_kind(self, index: int) -> str:
        """The attention kind of decoder layer `index` as the config describes it (READ_ATTENTION_KINDS: chunked
        where the cost terms' `attention_kind` says full)."""
        if self.attention_layout and index < self.num_layers:
            return READ_ATTENTION_KINDS[self.attention_layout[index % len(self.attention_layout)]]
        return self.attention_kind(index)

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
        biases = (q + kv + gate + h) if self.linear_bias else (q + kv) if self.qkv_bias else 0
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
            p += self.mlp_params(self.dense_ffn(index))
        return p

    def mtp_extra_params(self) -> int:
        """Per MTP layer besides its transformer block: eh_proj and two norms."""
        return 2 * self.hidden_size * self.hidden_size + 3 * self.hidden_size

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        """Every parameter: the decoder layers (following the per-layer MLP list), the MTP layers, the embedding,
        the output layer (unless tied) and the final norm."""
        layers = sum(self.dense_params_per_layer(i) + (self.expert_params_per_layer() if self.layer_is_moe(i) else 0)
                     for i in range(self.num_layers))
        heads = self.embedding_params() * (1 if self.tie_embeddings else 2)
        return layers + self.mtp_params() + heads + self.hidden_size

    def mtp_params(self) -> int:
        """The MTP layers' parameters (their transformer blocks, eh_proj and norms); in total_params."""
        if not self.mtp_layers:
            return 0
        experts = self.expert_params_per_layer() if self.layer_is_moe(self.num_layers) else 0
        return self.mtp_layers * (self.dense_params_per_layer(self.num_layers) + experts + self.mtp_extra_params())

    def idle_expert_params(self) -> int:
        """The routed experts a token does not use: (experts - top-k) per MoE layer, MTP layers included."""
        if not self.is_moe:
            return 0
        moe_layers = self.num_moe_layers + (self.mtp_layers if self.layer_is_moe(self.num_layers) else 0)
        return moe_layers * (self.num_experts - self.topk) * self.mlp_params(self.moe_ffn_hidden_size)

    def active_params(self) -> int:
        """The parameters one token uses: total_params less the routed experts it is not sent to (the same
        accounting as total_params: embedding, output layer and MTP layers included)."""
        return self.total_params() - self.idle_expert_params()

    def param_breakdown(self) -> dict[str, int]:
        """total_params and active_params with the parts publishers count differently: the MTP layers' share of
        each, the embedding table and the (untied) output layer."""
        mtp_idle = 0
        if self.mtp_layers and self.layer_is_moe(self.num_layers):
            mtp_idle = self.mtp_layers * (self.num_experts - self.topk) * self.mlp_params(self.moe_ffn_hidden_size)
        mtp = self.mtp_params()
        return {"total": self.total_params(), "active": self.active_params(), "mtp_total": mtp,
                "mtp_active": mtp - mtp_idle, "embedding": self.embedding_params(),
                "output_layer": 0 if self.tie_embeddings else self.embedding_params()}

    def with_overrides(self, num_layers: int | None = None, hidden_size: int | None = None) -> "ModelSpec":
        """A smaller/larger copy (for CPU runs): layers and width; head counts and head_dim are kept. Fewer
        layers keep the first ones of the per-layer pattern (at least one MoE layer: the last becomes one if none
        is left); more layers continue it with its repeating tail."""
        changes: dict[str, Any] = {}
        if num_layers is not None:
            n = changes["num_layers"] = check_size(num_layers, "num_layers", MAX_LAYERS)
            if self.mlp_pattern:
                pattern = list(resize_pattern(self.mlp_pattern, n))
                if self.is_moe and 0 not in pattern:
                    pattern[-1] = 0
                changes["mlp_pattern"] = tuple(pattern)
                changes["first_k_dense"] = leading_dense(pattern)
            else:
                changes["first_k_dense"] = min(self.first_k_dense, n - 1) if self.is_moe else 0
        if hidden_size is not None:
            changes["hidden_size"] = check_size(hidden_size, "hidden_size", MAX_MODEL_WIDTH)
        if not changes:
            return self
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("hf_config")
        d.pop("reading")
        d.update(is_moe=self.is_moe, is_mla=self.is_mla)
        return d


def leading_dense(pattern) -> int:
    """Dense layers before the first MoE layer of a per-layer MLP list (0: MoE)."""
    return next((i for i, width in enumerate(pattern) if width == 0), len(pattern))


def smallest_period(seq) -> int:
    """The shortest p such that seq is its first p items repeated (the last repeat may be cut)."""
    n = len(seq)
    return next(p for p in range(1, n + 1) if all(seq[i] == seq[i - p] for i in range(p, n)))


def resize_pattern(pattern: tuple, n: int) -> tuple:
    """`pattern` cut to its first n items, or continued to n with the repeating unit of its tail (from its first
    MoE layer: DeepSeek's dense prefix is not repeated, Llama-4's dense/MoE alternation is)."""
    if n <= len(pattern):
        return pattern[:n]
    start = min(leading_dense(pattern), len(pattern) - 1)
    tail = pattern[start:]
    p = smallest_period(tail)
    return pattern + tuple(tail[(len(pattern) - start + i) % p] for i in range(n - len(pattern)))


LAYER_TYPES = {"full_attention": "F", "sliding_attention": "S", "linear_attention": "L", "chunked_attention": "C"}
MAX_CONFIG_DEPTH = 64  # a config.json nests a few levels; deeper is not a model config


Size = Annotated[int, Strict(), Field(ge=1, le=MAX_MODEL_WIDTH)]  # a width or count that must be given as >= 1
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_MODEL_WIDTH)]  # 0 where it means none
LayerIndex = Annotated[int, Strict(), Field(ge=0, le=MAX_MODEL_WIDTH)]  # a layer's index (checked < layers)
LayerType: TypeAlias = Literal[tuple(LAYER_TYPES)]  # type: ignore[valid-type]

# Model types whose fields mean more than their names say (the transformers configuration classes):
QWEN = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next")  # use_sliding_window decides sliding_window
LLAMA4 = ("llama4", "llama4_text")  # chunked attention on the RoPE layers; one shared expert
WINDOWED = ("mistral", "mixtral")  # sliding_window (not null): every layer slides
FIRST_K_DENSE_DEFAULT = {"deepseek_v3": 3, "glm4_moe": 1}  # first_k_dense_replace when not given
ERNIE = "ernie4_5_moe"  # moe_layer_start_index 1 when not given; use_bias: a bias in every linear layer
LLAMA4_CHUNK_DEFAULT = 8192  # Llama4TextConfig's attention_chunk_size
QWEN2_SHARED_DEFAULT = 5632  # Qwen2MoeConfig's shared_expert_intermediate_size
# one field under several names: they must agree where more than one is given
ALIASES = {"num_experts": ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"),
           "num_experts_per_tok": ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_k"),
           "n_shared_experts": ("n_shared_experts", "moe_num_shared_experts")}
# the fields that say which layers are MoE (named when they leave none)
PATTERN_FIELDS = ("first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers",
                  "interleave_moe_layer_step", "moe_layers", "moe_layer_start_index", "moe_layer_end_index",
                  "moe_layer_interval")


class HFConfig(BaseModel):
    """The fields of a Hugging Face config.json the cost model reads, with their names across model families
    (Megatron-Bridge's *_bridge.py mappings; meanings and defaults of the `transformers` configuration classes),
    types and ranges, and the relations between them. A field set to null counts as not given; every other field
    of the file is kept as it is (ModelSpec.hf_config) and must be one the reader reads or knows not to change the
    cost (search_spaces/catalog/hf_fields.py)."""
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
    """The dense MLP's width (default 4 x hidden_size); Llama-4: the experts' and the shared expert's."""
    intermediate_size_mlp: Size | None = None
    """Llama-4: the width of the dense (non-MoE) layers' MLP."""
    num_key_value_heads: Size | None = None
    """KV heads (default: one per attention head); they divide the attention heads."""
    head_dim: Size | None = None
    """Per-head width (default hidden_size / num_attention_heads)."""
    num_experts: Annotated[int, Strict(), Field(ge=0, le=MAX_EXPERTS)] = Field(
        0, validation_alias=AliasChoices(*ALIASES["num_experts"]))
    """Routed experts (DeepSeek/GLM n_routed_experts, Qwen num_experts, Mixtral/gpt-oss/Llama-4 num_local_experts,
    ERNIE moe_num_experts); 0: dense."""
    moe_intermediate_size: Count | None = None
    """An expert's width (default intermediate_size); >= 1 in a MoE model."""
    num_experts_per_tok: Count | None = Field(None, validation_alias=AliasChoices(*ALIASES["num_experts_per_tok"]))
    """Top-k of the router (gpt-oss also experts_per_token, ERNIE moe_k); a MoE model must give it."""
    n_shared_experts: Count = Field(0, validation_alias=AliasChoices(*ALIASES["n_shared_experts"]))
    """Shared experts, each of moe_intermediate_size (DeepSeek, GLM; ERNIE moe_num_shared_experts)."""
    shared_expert_intermediate_size: Count | None = None
    """The shared expert's width where given whole (Qwen2-MoE, default 5632; Qwen3-Next)."""
    first_k_dense_replace: Count | None = None
    """Leading dense layers (DeepSeek-V3 default 3, GLM-4.5 default 1, else 0)."""
    moe_layer_freq: Size = 1
    """DeepSeek: a layer past the leading dense ones is MoE when its index divides by this."""
    decoder_sparse_step: Size = 1
    """Qwen: layer i is MoE when (i + 1) divides by this (and i is not in mlp_only_layers)."""
    mlp_only_layers: list[LayerIndex] = Field(default_factory=list, max_length=MAX_LAYERS)
    """Qwen: layers with a dense MLP."""
    interleave_moe_layer_step: Size = 1
    """Llama-4: every this-many-th layer is MoE (layers step-1, 2*step-1, ...), unless moe_layers is given."""
    moe_layers: list[LayerIndex] | None = Field(None, max_length=MAX_LAYERS)
    """Llama-4: the MoE layers' indices."""
    moe_layer_start_index: LayerIndex | None = None
    """ERNIE-4.5: the first layer that may be MoE (default 1)."""
    moe_layer_end_index: Annotated[int, Strict(), Field(ge=-1, le=MAX_MODEL_WIDTH)] = -1
    """ERNIE-4.5: the last layer that may be MoE (-1: the last layer)."""
    moe_layer_interval: Size = 1
    """ERNIE-4.5: layer i is MoE when (i + 1) divides by this."""
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
    """Without layer_types: every this-many-th layer is full attention, the others linear (Qwen3-Next, default 4)."""
    sliding_window: Count = 0
    """Tokens a sliding-window layer sees; >= 1 when some layer is sliding_attention (Mistral/Mixtral: every
    layer slides when it is given)."""
    use_sliding_window: StrictBool = False
    """Qwen: whether sliding_window is used (true is refused without layer_types: not modelled)."""
    max_window_layers: Count | None = None
    """Qwen: the layers a sliding window applies from (read only with use_sliding_window)."""
    attention_chunk_size: Count | None = None
    """Llama-4: the chunk of chunked local attention, on the layers that use RoPE (default 8192)."""
    no_rope_layers: list[Annotated[int, Strict(), Field(ge=0, le=1)]] | None = Field(None, max_length=2 * MAX_LAYERS)
    """Llama-4: per layer, 1 where it uses RoPE (chunked attention), 0 for a NoPE (global) layer."""
    no_rope_layer_interval: Size = 4
    """Llama-4 without no_rope_layers: every this-many-th layer is NoPE."""
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
    """Decides the family's defaults and meanings (qwen*, llama4*, deepseek_v3, glm4_moe, ernie4_5_moe, mixtral,
    gpt_oss)."""
    hidden_act: StrictStr = "silu"
    """silu / swiglu: a gated MLP (3 projections)."""
    attention_output_gate: StrictBool | None = None
    """A sigmoid gate on the attention output (default: qwen3_next)."""
    qk_layernorm: StrictBool | None = None
    """RMSNorm on q and k per head (default: the qwen3 family without MLA; else use_qk_norm)."""
    use_qk_norm: StrictBool | None = None
    """GLM-4.5: RMSNorm on q and k per head; Llama-4: an L2 norm without weights (no parameters)."""
    attention_bias: StrictBool | None = None
    """A bias on the q, k and v projections."""
    qkv_bias: StrictBool | None = None
    """Qwen2-MoE's name for it (default true)."""
    use_bias: StrictBool | None = None
    """ERNIE-4.5: a bias in every linear layer."""
    mlp_bias: StrictBool = False
    """A bias on every MLP projection: true is refused (not modelled)."""
    linear_bias: StrictBool | None = None
    """A bias in every linear layer (default: gpt_oss)."""
    attention_sinks: StrictBool | None = None
    """A learnable softmax offset per head (default: gpt_oss)."""
    shared_expert_gate: StrictBool | None = None
    """A sigmoid gate on the shared expert's output (default: qwen3_next, and qwen2_moe with a shared expert)."""
    tie_word_embeddings: StrictBool = False
    """The output layer shares the embedding's weights."""
    max_position_embeddings: Annotated[int, Strict(), Field(ge=0, le=2 ** 31 - 1)] = 0
    """The longest sequence the model was trained for (informational)."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        given = {k: v for k, v in data.items() if v is not None}
        for names in ALIASES.values():
            values = {n: given[n] for n in names if n in given}
            if len({repr(v) for v in values.values()}) > 1:
                raise ValueError("fields " + " and ".join(f"{n} ({short(v)})" for n, v in values.items())
                                 + " name one thing and disagree")
        return given

    @model_validator(mode="after")
    def _relations(self) -> "HFConfig":
        """The relations the cost model relies on, each refused in one line naming its field."""
        layers, heads = self.num_hidden_layers, self.num_attention_heads
        if self.layer_types is not None and len(self.layer_types) != layers:
            raise ValueError(f"field layer_types must be a list of {layers} entries (num_hidden_layers), "
                             f"got {len(self.layer_types)}")
        if self.layer_types is None and (self.full_attention_interval or 0) > layers:
            raise ValueError(f"field full_attention_interval must be <= {layers} (num_hidden_layers), "
                             f"got {self.full_attention_interval}")
        if self.no_rope_layers and len(self.no_rope_layers) < layers:
            raise ValueError(f"field no_rope_layers must have an entry per layer ({layers}), got "
                             f"{len(self.no_rope_layers)}")
        for name in ("mlp_only_layers", "moe_layers"):
            late = [i for i in getattr(self, name) or () if i >= layers]
            if late:
                raise ValueError(f"field {name}: {late[0]} is not a layer of {layers} (num_hidden_layers)")
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
        _check_attention(self)
        if self.mlp_bias:
            raise ValueError("field mlp_bias: true (a bias on every MLP projection) is not modelled")
        if self.num_experts:
            _check_moe(self, layers)
        return self

    # ---- the per-layer pattern -----------------------------------------------------------------------------
    @property
    def attention_letters(self) -> str:
        """Each layer's attention kind as the config describes it (letters of READ_ATTENTION_KINDS), by the
        family's rule where layer_types is not given."""
        layers, kind = self.num_hidden_layers, self.model_type
        if self.layer_types is not None:
            return "".join(LAYER_TYPES[t] for t in self.layer_types)
        if kind in LLAMA4:
            rope = self.no_rope_layers or [int((i + 1) % self.no_rope_layer_interval != 0) for i in range(layers)]
            return "".join("C" if rope[i] else "F" for i in range(layers))
        if kind in WINDOWED and self.sliding_window:
            return "S" * layers
        if kind == "gpt_oss":
            return "".join("S" if (i + 1) % 2 else "F" for i in range(layers))
        interval = self.full_attention_interval or (4 if kind == "qwen3_next" else None)
        if interval:
            return "".join("F" if (i + 1) % interval == 0 else "L" for i in range(layers))
        return "F" * layers

    @property
    def attention_pattern(self) -> str:
        """The attention kinds the cost terms read (ModelSpec.attention_pattern letters: chunked counts as full),
        the shortest repeating unit (so with_overrides(num_layers=...) keeps the pattern)."""
        return shortest_unit(self.attention_letters.replace("C", "F"))

    @property
    def chunk_size(self) -> int:
        if "C" not in self.attention_letters:
            return 0
        return self.attention_chunk_size or LLAMA4_CHUNK_DEFAULT

    @property
    def first_k_dense(self) -> int:
        if self.first_k_dense_replace is not None:
            return self.first_k_dense_replace
        return FIRST_K_DENSE_DEFAULT.get(self.model_type, 0)

    def layer_is_moe(self, i: int) -> bool:
        """Whether layer i is MoE: each family's rule, all of them together (a family's fields keep their
        defaults in another's config, where they say every layer is MoE)."""
        layers = self.num_hidden_layers
        llama = (i in self.moe_layers if self.moe_layers is not None
                 else (i + 1) % self.interleave_moe_layer_step == 0)
        start = self.moe_layer_start_index if self.moe_layer_start_index is not None else (
            1 if self.model_type == ERNIE else 0)
        end = layers - 1 if self.moe_layer_end_index == -1 else self.moe_layer_end_index
        return (self.num_experts > 0 and i >= self.first_k_dense and i % self.moe_layer_freq == 0  # DeepSeek, GLM
                and (i + 1) % self.decoder_sparse_step == 0 and i not in self.mlp_only_layers  # Qwen
                and llama  # Llama-4
                and start <= i <= end and (i + 1) % self.moe_layer_interval == 0)  # ERNIE-4.5

    @property
    def mlp_pattern(self) -> tuple[int, ...]:
        """Per layer: 0 for a MoE layer, else its dense MLP's width."""
        return tuple(0 if self.layer_is_moe(i) else self.dense_ffn for i in range(self.num_hidden_layers))

    @property
    def ffn(self) -> int:
        return self.intermediate_size if self.intermediate_size is not None else 4 * self.hidden_size

    @property
    def dense_ffn(self) -> int:
        return self.intermediate_size_mlp if self.intermediate_size_mlp is not None else self.ffn

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads if self.num_key_value_heads is not None else self.num_attention_heads

    @property
    def moe_ffn(self) -> int:
        return self.moe_intermediate_size if self.moe_intermediate_size is not None else self.ffn


LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")


def shortest_unit(letters: str) -> str:
    """The shortest string that `letters` is whole repeats of."""
    for n in range(1, len(letters) + 1):
        if len(letters) % n == 0 and letters[:n] * (len(letters) // n) == letters:
            return letters[:n]
    return letters


def _check_attention(c: HFConfig) -> None:
    letters, kind = c.attention_letters, c.model_type
    if c.use_sliding_window and c.layer_types is None and kind in QWEN:
        raise ValueError(f"field use_sliding_window: true is not modelled for model_type {kind} (which layers "
                         "slide); give layer_types")
    if "S" in letters and not c.sliding_window:
        raise ValueError("field sliding_window must be given for sliding_attention layers")
    if c.sliding_window and "S" not in letters and kind not in QWEN:
        raise ValueError("field sliding_window is given but no layer is sliding_attention (give layer_types)")
    if c.attention_chunk_size and kind not in LLAMA4 and "C" not in letters:
        raise ValueError(f"field attention_chunk_size is read for Llama-4 (model_type llama4_text), not {kind!r}: "
                         "give layer_types with chunked_attention")
    if "C" in letters and kind not in LLAMA4 and not c.attention_chunk_size:
        raise ValueError("field attention_chunk_size must be given for chunked_attention layers")
    missing = [n for n in LINEAR_FIELDS if "L" in letters and not getattr(c, n)]
    if missing:
        raise ValueError(f"field {missing[0]} must be given for linear_attention layers")


def _check_moe(c: HFConfig, layers: int) -> None:
    experts = c.num_experts
    if c.moe_ffn < 1:
        raise ValueError(f"field moe_intermediate_size must be >= 1 in a MoE model, got {c.moe_ffn}")
    if c.num_experts_per_tok is None:
        raise ValueError(f"lacks num_experts_per_tok, the top-k of its {experts} experts")
    if not 1 <= c.num_experts_per_tok <= experts:
        raise ValueError(f"field num_experts_per_tok ({c.num_experts_per_tok}) must be between 1 and the number "
                         f"of experts ({experts})")
    if c.first_k_dense >= layers:
        raise ValueError(f"field first_k_dense_replace ({c.first_k_dense}) leaves no MoE layer of {layers}")
    if 0 not in c.mlp_pattern:
        given = [n for n in PATTERN_FIELDS if n in c.model_fields_set] or ["first_k_dense_replace"]
        raise ValueError(f"fields {', '.join(given)} leave no MoE layer of {layers}")


def _moe(c: HFConfig) -> dict[str, Any]:
    """Experts, expert width, top-k, shared experts, the per-layer MLP list (all 0 / empty for a dense model)."""
    if not c.num_experts:
        return dict(num_experts=0, moe_ffn_hidden_size=0, topk=0, num_shared_experts=0,
                    shared_expert_ffn_hidden_size=0, first_k_dense=0, mlp_pattern=())
    if c.num_experts_per_tok is None:  # _check_moe refuses a MoE config without it
        raise ValueError(f"lacks num_experts_per_tok, the top-k of its {c.num_experts} experts")
    shared_n, shared_ffn = c.n_shared_experts, c.n_shared_experts * c.moe_ffn
    width = c.shared_expert_intermediate_size
    if width is None and c.model_type == "qwen2_moe":
        width = QWEN2_SHARED_DEFAULT
    if width:
        shared_n, shared_ffn = max(shared_n, 1), width
    if c.model_type in LLAMA4:  # Llama4TextMoe: one shared expert of intermediate_size beside the routed ones
        shared_n, shared_ffn = 1, c.moe_ffn
    pattern = c.mlp_pattern
    first = leading_dense(pattern)
    simple = pattern == (c.dense_ffn,) * first + (0,) * (len(pattern) - first)
    return dict(num_experts=c.num_experts, moe_ffn_hidden_size=c.moe_ffn, topk=c.num_experts_per_tok,
                num_shared_experts=shared_n, shared_expert_ffn_hidden_size=shared_ffn, first_k_dense=first,
                mlp_pattern=() if simple else pattern)


def from_hf_config(cfg: dict, name: str, source: str | None = None) -> ModelSpec:
    """Normalise a Hugging Face config.json dict (DeepSeek-V2/V3, Kimi-K2, GLM-4.5, Qwen2/3-MoE, Qwen3-Next,
    gpt-oss, Llama(-4), Mixtral, ERNIE-4.5-MoE; a multimodal config's text model from its text_config).

    Fields are checked like the spec's (HFConfig): integers that are integers, sizes >= 1 (0 only where it means
    none: experts, MTP layers, LoRA ranks), and the relations the cost model relies on; a field the reader does
    not read must be one known not to change the cost (listed in the model's reading), else the config is refused
    naming it. `source` names the file."""
    where = source or name
    text, outer = _text_model(cfg, where)
    try:
        c = HFConfig.model_validate(text)
    except ValidationError as exc:
        _refuse_unknown(where, _unknown_names(outer, text))  # a misnamed field first: it is why the rest disagrees
        raise SpecError(f"model config {where!r}: {one_line(exc, HFConfig)}") from None
    ignored = _known_fields(where, outer, text, c)
    kind, mla = c.model_type, c.kv_lora_rank > 0
    pattern = c.attention_pattern
    moe = _moe(c)
    letters = c.attention_letters
    spec = ModelSpec(
        name=name, num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
        ffn_hidden_size=c.dense_ffn, vocab_size=c.vocab_size, **moe, num_kv_heads=c.kv_heads,
        head_dim=c.head_dim if c.head_dim is not None else c.hidden_size // c.num_attention_heads,
        sliding_window=c.sliding_window if "S" in pattern else 0, q_lora_rank=c.q_lora_rank,
        kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
        v_head_dim=c.v_head_dim, **{n: getattr(c, n) for n in LINEAR_FIELDS},
        linear_conv_kernel_dim=c.linear_conv_kernel_dim, mtp_layers=c.num_nextn_predict_layers,
        attention_pattern=pattern, attention_output_gate=_flag(c.attention_output_gate, kind == "qwen3_next"),
        qk_layernorm=_flag(c.qk_layernorm, kind.startswith("qwen3") and not mla
                           or (bool(c.use_qk_norm) and kind not in LLAMA4)),
        gated_mlp=c.hidden_act in ("silu", "swiglu") or kind == "gpt_oss",
        linear_bias=_flag(c.linear_bias, kind == "gpt_oss" or (kind == ERNIE and bool(c.use_bias))),
        attention_sinks=_flag(c.attention_sinks, kind == "gpt_oss"),
        shared_expert_gate=_flag(c.shared_expert_gate, kind == "qwen3_next" or (
            kind == "qwen2_moe" and moe["shared_expert_ffn_hidden_size"] > 0)),
        qkv_bias=_qkv_bias(c), tie_embeddings=c.tie_word_embeddings,
        attention_chunk_size=c.chunk_size, attention_layout=shortest_unit(letters) if "C" in letters else "",
        max_position_embeddings=c.max_position_embeddings, hf_config=dict(text),
    )
    return dataclasses.replace(spec, reading=_reading_notes(c, spec, text is not cfg, ignored))


def _reading_notes(c: HFConfig, spec: ModelSpec, nested: bool, ignored: list[tuple[str, str]]) -> dict:
    """How the config was read, beside the ModelSpec's figures: the fields ignored and why, what the cost terms
    approximate, and what else a user should know (`moe-autotune model`)."""
    layers, letters = spec.num_layers, c.attention_letters
    approximated: list[str] = []
    notes: list[str] = []
    if nested:
        notes.append("the text model's fields are read from text_config; another modality's tower is not counted")
    if "C" in letters:
        approximated.append(f"chunked local attention ({spec.attention_chunk_size:,}-token chunks) in "
                            f"{letters.count('C')} of {layers} layers is costed as full causal attention: an upper "
                            "bound on those layers' attention time and activations at longer sequences")
        if "F" in letters:
            notes.append(f"{letters.count('F')} of {layers} layers use no position encoding (NoPE) and full "
                         "attention; RoPE is element-wise, so NoPE costs the same")
    if spec.mlp_pattern:
        notes.append("the estimate, the Megatron-LM and Megatron-Bridge exports (a moe_layer_freq list) and the CPU "
                     "trainer follow this per-layer MLP pattern")
    if "C" in letters:
        notes.append("Megatron-Core has no chunked local attention: the CPU trainer refuses this model, and an "
                     "exported job builds full attention in those layers")
    if spec.mtp_layers:
        notes.append(f"{spec.mtp_layers} MTP layer(s) are counted in the total and active parameters")
    return {"text_config": nested, "ignored": [[k, why] for k, why in ignored], "approximated": approximated,
            "notes": notes}


def _qkv_bias(c: HFConfig) -> bool:
    """A bias on q, k and v: qkv_bias (Qwen2-MoE, default true), attention_bias, ERNIE's use_bias."""
    for value in (c.qkv_bias, c.attention_bias, c.use_bias if c.model_type == ERNIE else None):
        if value is not None:
            return value
    return c.model_type == "qwen2_moe"


def _text_model(cfg: dict, where: str) -> tuple[dict, dict]:
    """The text model's fields and the outer fields beside them: a multimodal config (Llama-4, ...) nests them
    in `text_config`; an outer field the text_config lacks is read from the outer config."""
    inner = cfg.get("text_config")
    if inner is None:
        return cfg, {}
    if not isinstance(inner, dict):
        raise SpecError(f"model config {where!r}: field text_config must be an object (the text model's fields), "
                        f"got {short(inner)}")
    outer = {k: v for k, v in cfg.items() if k != "text_config"}
    merged = dict(inner)
    for key, value in outer.items():
        if key in READ_NAMES and key not in inner and value is not None:
            merged[key] = value
    return merged, outer


def _field_list(names: list[str]) -> str:
    shown = ", ".join(excerpt(n, 60) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _known_fields(where: str, outer: dict, text: dict, c: HFConfig) -> list[tuple[str, str]]:
    """The fields read from neither list and why (hf_fields.IGNORED, the towers beside a text_config, fields a
    family's rule leaves unused); refuses (SpecError, one line) a field known to change the cost and not modelled
    (hf_fields.UNSUPPORTED) and a field the reader does not know."""
    ignored: list[tuple[str, str]] = []
    unsupported: list[str] = []
    for key, value in [*text.items(), *((k, v) for k, v in outer.items() if k not in text)]:
        if value is None or key in READ_NAMES:
            continue
        if key in UNSUPPORTED:
            unsupported.append(key)
        elif key in IGNORED:
            ignored.append((key, IGNORED[key]))
        elif key in TOWERS and key not in text:
            ignored.append((key, TOWERS[key]))
    ignored += [(key, "the outer config's value: the text_config's is read") for key, value in outer.items()
                if key in text and key in READ_NAMES and key != "model_type" and value != text[key]]
    if "model_type" in outer and outer["model_type"] != text.get("model_type"):
        ignored.append(("model_type", f"the outer config's ({short(outer['model_type'])}): the text_config's "
                                      f"({short(c.model_type)}) is read"))
    if unsupported:
        raise SpecError(f"model config {where!r}: field(s) {_field_list(unsupported)} change what the model costs "
                        f"and are not modelled ({UNSUPPORTED[unsupported[0]]})")
    _refuse_unknown(where, _unknown_names(outer, text))
    return ignored + _unused(c, text)


def _unknown_names(outer: dict, text: dict) -> list[str]:
    """The fields of the config that no list of the reader's names (read, ignored, not modelled, the towers)."""
    known = (*READ_NAMES, *IGNORED, *UNSUPPORTED)
    return [k for k in text if k not in known and k != "text_config"] + [
        k for k in outer if k not in text and k not in known and k not in TOWERS]


def _refuse_unknown(where: str, unknown: list[str]) -> None:
    if unknown:
        raise SpecError(f"model config {where!r}: unknown field(s) {_field_list(unknown)}: the reader cannot tell "
                        "whether they change the model's cost (see `moe-autotune model --help` for the families it "
                        "reads); remove them from a copy of the config only if they do not")


def _unused(c: HFConfig, text: dict) -> list[tuple[str, str]]:
    """Fields read but left unused by their family's rule (said in the reading, not silently skipped)."""
    out: list[tuple[str, str]] = []
    given = {k for k, v in text.items() if v is not None}
    if "sliding_window" in given and "S" not in c.attention_letters:
        out.append(("sliding_window", "unused: use_sliding_window is false"))
    if "max_window_layers" in given and not c.use_sliding_window:
        out.append(("max_window_layers", "unused: use_sliding_window is false"))
    if "use_qk_norm" in given and c.model_type in LLAMA4:
        out.append(("use_qk_norm", "Llama-4's L2 norm of q and k has no weights"))
    if "use_qk_norm" in given and c.model_type.startswith("qwen3"):
        out.append(("use_qk_norm", "the qwen3 family always normalises q and k (counted)"))
    if "interleave_moe_layer_step" in given and c.moe_layers is not None:
        out.append(("interleave_moe_layer_step", "moe_layers is given and wins"))
    if "shared_expert_intermediate_size" in given and c.model_type in LLAMA4:
        out.append(("shared_expert_intermediate_size", "Llama-4's shared expert is intermediate_size wide"))
    if not c.num_experts:
        out += [(n, "a dense model (no experts)") for n in PATTERN_FIELDS + ("num_experts_per_tok",
                                                                            "moe_intermediate_size")
                if n in given]
    return out


def _flag(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _read_names() -> frozenset[str]:
    names: set[str] = set()
    for field_name, info in HFConfig.model_fields.items():
        names.add(field_name)
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice) for choice in alias.choices)
    return frozenset(names)


READ_NAMES = _read_names()


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
