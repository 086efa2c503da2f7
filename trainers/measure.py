"""Measured memory: the four components the cost model predicts, and the peak.

Each component counts unique storages once (views, shards and flat buffers share storage), in bytes:
weights (model parameters), gradients (Megatron DDP's main_grad buffers, or .grad), optimizer states
(Adam moments and fp32 master copies: every tensor the optimizer holds that is not a parameter or a grad),
and the activations autograd saves for backward during one microbatch's forward on this rank
(parameters excluded; storages freed before the forward ends count as their final size), also by the module
that saved them (trainers/activation_terms.py maps those onto the memory model's terms).
"""

from __future__ import annotations

import contextlib
import resource
import weakref
from functools import partial
from typing import AbstractSet, Iterable, Iterator

import torch

GIB = 1024**3


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def unique_storage_bytes(tensors: Iterable[torch.Tensor | None], exclude: AbstractSet[int] = frozenset()) -> int:
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


def gradient_tensors(chunks) -> list[torch.Tensor | None]:
    """Each parameter's gradient (None where it has none yet)."""
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
    """Collect the storages autograd saves for backward while active; `.bytes` sums them (unique).

    `recording(chunk)` also attributes each storage to the module that saved it first (the innermost module
    whose forward was running, found with forward pre/post hooks that exist only while recording) and to
    its role there: `path:in` when the storage is one of that module's inputs, `path:child` when it is the
    output of its direct submodule `child` (the expert fc1 output saved by the activation), plain `path`
    when the module made it itself. `.by_module()` gives bytes per such owner; decoder layers are named by
    their global index (`layer3.mlp.linear_fc1:in`), the model's own forward (loss) is `model`.
    """

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.storages: dict[int, torch.UntypedStorage] = {}  # kept alive, so their ids stay unique
        self.owners: dict[int, str] = {}
        self._stack: list[_Frame] = []

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        key = _storage_id(tensor)
        if address and address not in self.exclude and key not in self.storages:
            self.storages[key] = storage
            self.owners[key] = self._stack[-1].owner(key, storage) if self._stack else "model"
        return tensor

    @contextlib.contextmanager
    def recording(self, chunk=None):
        handles = self._attach(chunk) if chunk is not None else []
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor):
                yield
        finally:
            for handle in handles:
                handle.remove()
            self._stack.clear()

    def _attach(self, chunk) -> list:
        handles = []
        for module, name in module_paths(chunk).items():
            handles.append(module.register_forward_pre_hook(partial(self._enter, name), with_kwargs=True))
            handles.append(module.register_forward_hook(self._leave, always_call=True))
        return handles

    # Hooks return None: a value would replace the module's inputs or output.
    def _enter(self, name: str, module, args, kwargs) -> None:
        self._stack.append(_Frame(name, _storages((args, kwargs))))

    def _leave(self, module, args, output) -> None:
        frame = self._stack.pop()
        if self._stack:
            self._stack[-1].add_child_output(frame.path.rsplit(".", 1)[-1], _storages(output))

    @property
    def bytes(self) -> int:
        # Megatron frees some saved outputs early (CheckpointWithoutOutput resizes them to 0): count what is left.
        return sum(storage.nbytes() for storage in self.storages.values())

    def by_module(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, storage in self.storages.items():
            out[self.owners[key]] = out.get(self.owners[key], 0) + storage.nbytes()
        return out

    def clear(self) -> None:
        self.storages.clear()
        self.owners.clear()


class _Frame:
    """One running module forward: its path, the storages of its inputs, the outputs of its submodules.

    Storages are held by weak reference and matched by identity: a storage's id (its C++ object's address)
    is reused once it is freed, and a submodule output freed early must not name a tensor allocated later
    at the same address (it would be taken for that submodule's output)."""

    def __init__(self, path: str, inputs: dict[int, torch.UntypedStorage]):
        self.path = path
        self.inputs = {key: weakref.ref(storage) for key, storage in inputs.items()}
        self.children: dict[int, tuple[str, weakref.ref]] = {}

    def add_child_output(self, child: str, storages: dict[int, torch.UntypedStorage]) -> None:
        for key, storage in storages.items():
            if key not in self.children or self.children[key][1]() is None:
                self.children[key] = (child, weakref.ref(storage))

    def owner(self, key: int, storage: torch.UntypedStorage) -> str:
        if key in self.inputs and self.inputs[key]() is storage:
            return f"{self.path}:in"
        if key in self.children and self.children[key][1]() is storage:
            return f"{self.path}:{self.children[key][0]}"
        return self.path


def _storage_id(tensor: torch.Tensor) -> int:
    """The identity of a tensor's storage while it lives. Not its address: Megatron frees saved outputs
    early (resize to 0), and a storage allocated later at the same address would be taken for it."""
    return tensor.untyped_storage()._cdata


def _storages(value, depth: int = 3) -> dict[int, torch.UntypedStorage]:
    """Storages of the tensors in a module's inputs or output (tuples, lists and dicts, a few levels), by id."""
    if torch.is_tensor(value):
        return {_storage_id(value): value.untyped_storage()}
    if depth == 0:
        return {}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    out: dict[int, torch.UntypedStorage] = {}
    for item in items:
        out.update(_storages(item, depth - 1))
    return out


def module_paths(chunk) -> dict[torch.nn.Module, str]:
    """Every module of a model chunk (a GPTModel, possibly inside DDP) by a path that names decoder layers
    by their global index: `decoder.layers.1.mlp` on the second pipeline stage becomes `layer5.mlp`."""
    while hasattr(chunk, "module") and isinstance(chunk.module, torch.nn.Module):
        chunk = chunk.module
    layers = getattr(getattr(chunk, "decoder", None), "layers", None) or []
    prefixes = {f"decoder.layers.{i}": f"layer{layer.layer_number - 1}" for i, layer in enumerate(layers)}
    paths = {}
    for name, module in chunk.named_modules():
        head = ".".join(name.split(".")[:3])
        path = prefixes[head] + name[len(head):] if head in prefixes else name
        paths[module] = path or "model"
    return paths


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
