"""Grouped expert linears for CPU, so CPU runs use Megatron-Core's grouped-expert MLP (TEGroupedMLP).

The local (no-TE) spec builds routed experts as SequentialMLP, which ignores selective recompute of
`moe_act`; TEGroupedMLP implements it but needs grouped linear layers from Transformer Engine. This module
supplies them in plain torch (one weight per local expert, sharded over expert-TP like TE's column/row
grouped linears with explicit expert communication: the token dispatcher does the ETP gather/scatter).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from megatron.core import parallel_state


class CPUGroupedLinear(torch.nn.Module):
    """`forward(x, tokens_per_expert)`: rows of x grouped by expert, each through its own weight."""

    def __init__(self, num_local_experts, input_size, output_size, /, *, config, init_method, bias, skip_bias_add,
                 is_expert, tp_comm_buffer_name, pg_collection, name=None, parallel_mode="column"):
        super().__init__()
        etp = parallel_state.get_expert_tensor_parallel_world_size()
        if bias and etp > 1:
            raise NotImplementedError("expert biases need ETP = 1 (as Megatron-Core's MoE)")
        if parallel_mode == "column":
            shape, partition_dim = (output_size // etp, input_size), 0
        else:
            shape, partition_dim = (output_size, input_size // etp), 1
        self.num_local_experts = num_local_experts
        for index in range(num_local_experts):
            weight = torch.nn.Parameter(torch.empty(*shape, dtype=config.params_dtype))
            if config.perform_initialization:
                init_method(weight)
            # Megatron's DDP and optimizer tell expert parameters by allreduce=False. (Megatron's own attributes
            # on Parameters: torch's types do not know them.)
            weight.allreduce = False  # type: ignore[attr-defined]
            weight.tensor_model_parallel = etp > 1  # type: ignore[attr-defined]
            weight.partition_dim = partition_dim  # type: ignore[attr-defined]
            weight.partition_stride = 1  # type: ignore[attr-defined]
            self.register_parameter(f"weight{index}", weight)
        # TE's GroupedLinear: one zero-initialised bias per expert; with skip_bias_add (fc2) the biases are
        # returned for Megatron to add scaled by the routing probabilities.
        self.return_bias = bias and skip_bias_add
        for index in range(num_local_experts if bias else 0):
            bias_param = torch.nn.Parameter(torch.zeros(shape[0], dtype=config.params_dtype))
            bias_param.allreduce = False  # type: ignore[attr-defined]  # Megatron's attribute, as above
            self.register_parameter(f"bias{index}", bias_param)
        self.use_bias = bias

    def forward(self, x, tokens_per_expert):
        counts = tokens_per_expert.tolist() if torch.is_tensor(tokens_per_expert) else list(tokens_per_expert)
        biases = [getattr(self, f"bias{i}") if self.use_bias and not self.return_bias else None
                  for i in range(self.num_local_experts)]
        outputs = [F.linear(rows, getattr(self, f"weight{i}"), biases[i])
                   for i, rows in enumerate(torch.split(x, counts))]
        if self.return_bias:
            return torch.cat(outputs, dim=0), [getattr(self, f"bias{i}") for i in range(self.num_local_experts)]
        return torch.cat(outputs, dim=0), None

    def backward_dw(self):
        pass


def grouped_experts_builder():
    """What MoESubmodules.experts should be on CPU: Megatron's TEGroupedMLP over CPUGroupedLinear."""
    from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, TEGroupedMLP

    return partial(TEGroupedMLP, submodules=GroupedMLPSubmodules(
        linear_fc1=partial(CPUGroupedLinear, parallel_mode="column"),
        linear_fc2=partial(CPUGroupedLinear, parallel_mode="row")))
