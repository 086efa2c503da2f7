"""Measured memory: the four components the cost model predicts, and the peak.

Each component counts unique storages once (views, shards and flat buffers share storage), in bytes:
weights (model parameters), gradients (Megatron DDP's main_grad buffers, or .grad), optimizer states
(Adam moments and fp32 master copies: every tensor the optimizer holds that is not a parameter or a grad),
and the activations autograd saves for backward during one microbatch's forward on this rank
(parameters excluded; storages freed before the forward ends count as their final size).
"""

from __future__ import annotations

import contextlib
import resource
from typing import Iterable, Iterator

import torch

GIB = 1024**3


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def unique_storage_bytes(tensors: Iterable[torch.Tensor], exclude: set[int] = frozenset()) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None or not torch.is_tensor(tensor):
            continue
        key = _storage_key(tensor)
        if key and key not in exclude:
            seen[key] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def parameters(chunks) -> list[torch.Tensor]:
    return [p for chunk in chunks for p in chunk.parameters()]


def gradient_tensors(chunks) -> list[torch.Tensor]:
    grads = []
    for param in parameters(chunks):
        grad = getattr(param, "main_grad", None)
        grads.append(grad if grad is not None else param.grad)
    return grads


def _torch_optimizers(optimizer) -> Iterator[torch.optim.Optimizer]:
    """Megatron wraps torch optimizers (ChainedOptimizer -> Distributed/FP32 optimizer -> torch Adam)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        yield optimizer
        return
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        for inner in chained:
            yield from _torch_optimizers(inner)
        return
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and inner is not optimizer:
        yield from _torch_optimizers(inner)


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    tensors = []
    for opt in _torch_optimizers(optimizer):
        for group in opt.param_groups:
            tensors.extend(group["params"])  # fp32 master copies (or shards of the parameters themselves)
        for state in opt.state.values():
            tensors.extend(v for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
    return tensors


def static_components(chunks, optimizer) -> dict[str, int]:
    """Bytes of weights, gradients and optimizer states on this rank."""
    param_keys = {_storage_key(p) for p in parameters(chunks)}
    grads = gradient_tensors(chunks)
    grad_keys = {_storage_key(g) for g in grads if g is not None}
    return {
        "weights": unique_storage_bytes(parameters(chunks)),
        "gradients": unique_storage_bytes(grads, exclude=param_keys),
        "optimizer_states": unique_storage_bytes(optimizer_tensors(optimizer), exclude=param_keys | grad_keys),
    }


class SavedActivations:
    """Collect the storages autograd saves for backward while active; `.bytes` sums them (unique)."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.storages: dict[int, torch.UntypedStorage] = {}

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key and key not in self.exclude:
            self.storages.setdefault(key, storage)
        return tensor

    @contextlib.contextmanager
    def recording(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor):
            yield

    @property
    def bytes(self) -> int:
        # Megatron frees some saved outputs early (CheckpointWithoutOutput resizes them to 0): count what is left.
        return sum(storage.nbytes() for storage in self.storages.values())


def param_storage_keys(chunks) -> set[int]:
    return {_storage_key(p) for p in parameters(chunks)}


def peak_memory_gib(device: torch.device) -> dict[str, float]:
    """Peak so far: GPU max allocated/reserved; CPU resident set (ru_maxrss, KiB on Linux)."""
    if device.type == "cuda":
        return {"allocated": torch.cuda.max_memory_allocated(device) / GIB,
                "reserved": torch.cuda.max_memory_reserved(device) / GIB}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    return {"allocated": rss, "reserved": rss}


def inflight_microbatches(pp_rank: int, pp: int, vpp: int, microbatches: int) -> float:
    """Microbatches whose activations a pipeline rank holds at its peak, in whole-microbatch units
    (1F1B: PP - rank, capped; interleaved: Megatron's warm-up count of model-chunk microbatches / VPP)."""
    if pp == 1:
        return 1.0
    if vpp == 1:
        return float(min(pp - pp_rank, microbatches))
    warmup = min((pp - pp_rank - 1) * 2 + (vpp - 1) * pp, microbatches * vpp)
    return (warmup + 1) / vpp
