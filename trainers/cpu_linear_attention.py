"""CPU stand-ins for the Transformer Engine pieces of Megatron-Core's gated delta-net (Qwen3-Next) layers.

Megatron-Core 0.19.2 builds its experimental attention variant from TE modules only: the GatedDeltaNet input
projection is TE's LayerNormColumnParallelLinear (the input norm fused into the projection) and the full-
attention layers between come from the TE layer spec. On CPU, `cpu_compat` points Megatron's own spec
builder (`get_transformer_block_with_experimental_attention_variant_spec`) at `CPUSpecProvider` and
`local_self_attention_spec`, so the layer pattern, MoE/dense choice and pipeline slicing stay Megatron's.

CPU runs initialise every TP-sharded weight from one full-size draw (Megatron's use_cpu_initialization) so
that TP does not change the model; GatedDeltaNet draws its conv1d and A_log per TP shard and its fused
in_proj holds a TP shard of each section (q, k, v, gate, beta, alpha): `make_gdn_init_tp_invariant` and
`CPULayerNormColumnParallelLinear` keep those TP-invariant as well.
"""

from __future__ import annotations

import functools
import math

import torch
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.tensor_parallel.layers import ColumnParallelLinear
from megatron.core.transformer.torch_norm import WrappedTorchNorm


def gdn_in_proj_sections(config) -> list[int]:
    """Widths of GatedDeltaNet's in_proj output sections: q, k, v, gate z, beta, alpha (unsharded)."""
    qk = config.linear_key_head_dim * config.linear_num_key_heads
    v = config.linear_value_head_dim * config.linear_num_value_heads
    heads = config.linear_num_value_heads
    return [qk, qk, v, v, heads, heads]


def tp_shard_of_sections(full: torch.Tensor, sections: list[int], rank: int, world: int) -> torch.Tensor:
    """The TP rank's part of a tensor made of sections along dim 0: its 1/world of every section."""
    return torch.cat([part.chunk(world, dim=0)[rank] for part in torch.split(full, sections, dim=0)])


class CPULayerNormColumnParallelLinear(ColumnParallelLinear):
    """TE's LayerNormColumnParallelLinear as GatedDeltaNet uses it: the input norm, then a column-parallel
    projection whose TP shard holds a slice of every in_proj section (as Megatron's GDN checkpoints lay it
    out), so TP=2 starts from the same weights as TP=1."""

    def __init__(self, input_size, output_size, *, config, init_method, gather_output=False, bias=False,
                 skip_bias_add=False, is_expert=False, tp_comm_buffer_name=None, tp_group=None, name=None):
        sections = gdn_in_proj_sections(config)
        if sum(sections) != output_size:
            raise ValueError(f"CPU LayerNormColumnParallelLinear serves GatedDeltaNet's in_proj only "
                             f"(sections {sections} do not add up to {output_size})")
        super().__init__(input_size, output_size, config=config, init_method=init_method, bias=bias,
                         gather_output=gather_output, skip_bias_add=skip_bias_add, is_expert=is_expert,
                         keep_master_weight_for_test=True, tp_comm_buffer_name=tp_comm_buffer_name,
                         tp_group=tp_group, name=name)
        master = self.__dict__.pop("master_weight", None)  # the full-size draw, all ranks alike
        world = self.tp_group.size()
        if master is not None and world > 1:
            with torch.no_grad():
                self.weight.copy_(tp_shard_of_sections(master, sections, self.tp_group.rank(), world))
        self.layer_norm = WrappedTorchNorm(config=config, hidden_size=input_size, eps=config.layernorm_epsilon)

    def forward(self, input_, weight=None, runtime_gather_output=None):
        return super().forward(self.layer_norm(input_), weight=weight, runtime_gather_output=runtime_gather_output)


class CPUSpecProvider(LocalSpecProvider):
    """Megatron's local (no-TE) modules, plus the norm+projection GatedDeltaNet's spec asks for."""

    def column_parallel_layer_norm_linear(self):
        return CPULayerNormColumnParallelLinear


def local_self_attention_spec(config, backend=None):  # noqa: ARG001 -- the signature it stands in for
    """The full-attention layers of a hybrid model from Megatron's local layer spec (its TE twin,
    `_get_self_attention_module_spec`, needs Transformer Engine)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules

    submodules = get_gpt_layer_local_submodules(
        qk_layernorm=config.qk_layernorm, multi_latent_attention=config.multi_latent_attention,
        normalization=config.normalization, qk_l2_norm=config.qk_l2_norm)
    attention = submodules.self_attention
    attention.metainfo["fuse_input_layernorm"] = False  # the local spec has a separate input norm
    return attention


def make_gdn_init_tp_invariant(gdn_class) -> None:
    """Wrap GatedDeltaNet's constructor: conv1d and A_log are drawn full-size from the default generator and
    sliced for this TP rank (Megatron draws them per shard: TP would change the model on CPU)."""
    if getattr(gdn_class.__init__, "_tp_invariant", False):
        return
    original = gdn_class.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        reset = torch.nn.Conv1d.reset_parameters
        # drawn full-size below instead (mypy: replacing the method is the point; torch's stub calls it self)
        torch.nn.Conv1d.reset_parameters = lambda module: None  # type: ignore[method-assign, assignment]
        try:
            original(self, *args, **kwargs)
        finally:
            torch.nn.Conv1d.reset_parameters = reset  # type: ignore[method-assign]
        _draw_full_size_and_shard(self)

    __init__._tp_invariant = True  # type: ignore[attr-defined]  # a marker on the wrapper function
    gdn_class.__init__ = __init__


def _draw_full_size_and_shard(gdn) -> None:
    if not gdn.config.perform_initialization:
        return
    rank, world = gdn.tp_group.rank(), gdn.tp_size
    sections = [gdn.qk_dim, gdn.qk_dim, gdn.v_dim]
    with torch.no_grad():
        conv = torch.empty(gdn.conv_dim, 1, gdn.conv_kernel_dim)
        if gdn.conv_init is not None:
            conv.uniform_(-gdn.conv_init, gdn.conv_init)
        else:
            torch.nn.init.kaiming_uniform_(conv, a=math.sqrt(5))  # nn.Conv1d's own default
        gdn.conv1d.weight.copy_(tp_shard_of_sections(conv, sections, rank, world))
        if gdn.conv1d.bias is not None:
            bound = 1 / math.sqrt(gdn.conv_kernel_dim)
            bias = torch.empty(gdn.conv_dim).uniform_(-bound, bound)
            gdn.conv1d.bias.copy_(tp_shard_of_sections(bias, sections, rank, world))
        decay = torch.empty(gdn.num_value_heads).uniform_(*gdn.A_init_range)
        gdn.A_log.copy_(torch.log(decay).chunk(world)[rank])
