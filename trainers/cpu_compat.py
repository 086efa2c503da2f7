"""Everything Megatron-Core needs to run on CPU with gloo, in one place, applied only on CPU.

Megatron-Core is written for CUDA: it creates tensors on `device="cuda"`, uses CUDA streams, events and RNG,
and relies on NCCL accepting uneven all-gathers. These patches reach into private internals, so they are
pinned to one megatron-core version: `apply()` refuses to run on another version (CPUCompatError) and
checks that every symbol it replaces still exists, so an upgrade fails loudly instead of silently.
"""

from __future__ import annotations

import contextlib
import functools
import importlib

PINNED_MEGATRON_CORE = "0.19.2"

# (module, attribute) pairs patched below: if an upgrade renames one, apply() says which.
PATCHED_SYMBOLS = (
    ("megatron.core.tensor_parallel.random", "_set_cuda_rng_state"),
    ("megatron.core.tensor_parallel.random", "_get_cuda_rng_state"),
    ("megatron.core.tensor_parallel.random", "CheckpointWithoutOutput"),
    ("megatron.core.transformer.moe.moe_utils", "maybe_move_tensor_to_cpu"),
    ("megatron.core.transformer.moe.token_dispatcher", "maybe_move_tensor_to_cpu"),
    ("megatron.core.transformer.torch_norm", "WrappedTorchNorm"),
)

_applied = False


class CPUCompatError(RuntimeError):
    """The CPU patches do not match the installed megatron-core."""


def installed_megatron_core_version() -> str:
    from importlib.metadata import version

    return version("megatron-core")


def check_version(found: str | None = None) -> None:
    """Raise CPUCompatError unless megatron-core is the version these patches were written for."""
    found = found or installed_megatron_core_version()
    # Local build tags ("0.19.2+1507918") are the same release.
    if found.split("+")[0] != PINNED_MEGATRON_CORE:
        raise CPUCompatError(
            f"trainers/cpu_compat.py is pinned to megatron-core {PINNED_MEGATRON_CORE} but {found} is installed: "
            "re-check every patch against the new version, then update PINNED_MEGATRON_CORE")


def check_symbols() -> None:
    missing = []
    for module_name, attr in PATCHED_SYMBOLS:
        module = importlib.import_module(module_name)
        if not hasattr(module, attr):
            missing.append(f"{module_name}.{attr}")
    if missing:
        raise CPUCompatError(f"megatron-core internals changed; missing: {', '.join(missing)}")


def apply() -> None:
    """Install every CPU patch (idempotent). Call before building any Megatron-Core object."""
    global _applied
    if _applied:
        return
    check_version()
    check_symbols()
    _stub_cuda_runtime()
    _redirect_cuda_tensors_to_cpu()
    _patch_megatron_internals()
    _patch_gloo_uneven_collectives()
    _applied = True


# --- CUDA runtime stand-ins ---------------------------------------------------------------------------

class _NoStream:
    def __init__(self, *args, **kwargs): pass
    def wait_stream(self, *args, **kwargs): pass
    def wait_event(self, *args, **kwargs): pass
    def record_event(self, *args, **kwargs): return _NoEvent()
    def synchronize(self): pass
    def query(self): return True
    def __enter__(self): return self
    def __exit__(self, *exc): return False


class _NoEvent:
    def __init__(self, *args, **kwargs): pass
    def record(self, *args, **kwargs): pass
    def wait(self, *args, **kwargs): pass
    def synchronize(self): pass
    def query(self): return True
    def elapsed_time(self, other): return 0.0


def _stub_cuda_runtime() -> None:
    """Streams, events and synchronisation become no-ops; the CUDA RNG is the CPU RNG."""
    import torch

    cuda = torch.cuda
    cuda.Stream = _NoStream
    cuda.Event = _NoEvent
    cuda.current_stream = lambda *a, **k: _NoStream()
    cuda.default_stream = lambda *a, **k: _NoStream()
    cuda.stream = lambda *a, **k: contextlib.nullcontext()
    cuda.synchronize = lambda *a, **k: None
    cuda.current_device = lambda: 0
    cuda.set_device = lambda *a, **k: None
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    cuda.manual_seed_all = lambda seed: None
    cuda.empty_cache = lambda *a, **k: None
    cuda.nvtx.range_push = lambda *a, **k: None
    cuda.nvtx.range_pop = lambda *a, **k: None


def _is_cuda_device(device) -> bool:
    import torch

    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    # A bare int is a CUDA ordinal (torch.cuda.current_device()).
    return isinstance(device, int) and not isinstance(device, bool)


def _cpu_kwargs(kwargs: dict) -> dict:
    device = kwargs.get("device")
    if device is not None and _is_cuda_device(device):
        kwargs["device"] = "cpu"
    if kwargs.get("pin_memory"):
        kwargs["pin_memory"] = False
    return kwargs


_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange", "empty_like", "zeros_like", "ones_like",
              "full_like", "rand", "randn", "randint", "as_tensor", "empty_strided", "linspace", "randperm",
              "eye", "rand_like", "randn_like", "randint_like")
_TENSOR_FACTORIES = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor")


def _redirect_cuda_tensors_to_cpu() -> None:
    """Megatron hard-codes device='cuda', .cuda() and torch.cuda.current_device(): send them to the CPU."""
    import torch

    def on_cpu(factory):
        @functools.wraps(factory)
        def wrapper(*args, **kwargs):
            return factory(*args, **_cpu_kwargs(kwargs))
        return wrapper

    for name in _FACTORIES:
        setattr(torch, name, on_cpu(getattr(torch, name)))
    for name in _TENSOR_FACTORIES:
        setattr(torch.Tensor, name, on_cpu(getattr(torch.Tensor, name)))

    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    torch.Tensor.record_stream = lambda self, *a, **k: None

    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and _is_cuda_device(args[0]):
            args = ("cpu",) + tuple(args[1:])
        return original_to(self, *args, **_cpu_kwargs(kwargs))

    torch.Tensor.to = to

    original_type = torch.Tensor.type

    def tensor_type(self, *args, **kwargs):
        # clip_grads asserts grad.type() == 'torch.cuda.FloatTensor'.
        result = original_type(self, *args, **kwargs)
        if not args and not kwargs and isinstance(result, str) and ".cuda." not in result:
            result = result.replace("torch.", "torch.cuda.", 1)
        return result

    torch.Tensor.type = tensor_type


def _patch_megatron_internals() -> None:
    import torch
    import megatron.core.tensor_parallel.random as mcore_random
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as token_dispatcher
    from megatron.core.transformer import torch_norm

    # Megatron's RNG tracker goes through torch.cuda.default_generators.
    mcore_random._set_cuda_rng_state = lambda new_state, *a, **k: torch.set_rng_state(new_state)
    mcore_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()

    # CheckpointWithoutOutput (selective recompute of layernorm / moe_act) calls Transformer Engine's
    # FP8GlobalStateManager whenever fp8 is not None -- including the default fp8=False.
    if not hasattr(mcore_random, "FP8GlobalStateManager"):
        class _NoFP8:
            @staticmethod
            def is_fp8_enabled():
                return False

            @staticmethod
            def get_fp8_recipe():
                return None

        mcore_random.FP8GlobalStateManager = _NoFP8
        mcore_random.activation_recompute_forward = lambda *a, **k: contextlib.nullcontext()
        mcore_random.fp8_autocast = lambda *a, **k: contextlib.nullcontext()

    # The alltoall dispatcher only turns split sizes into numpy when the tensor is on CUDA.
    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if torch.is_tensor(tensor) and as_numpy:
            return tensor.numpy()
        return tensor

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu

    # The torch norm refuses sequence parallelism; mark its parameters like the fused norms do, so that
    # finalize_model_grads all-reduces their gradients over TP.
    norms = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}

    def new_norm(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,
                 normalization="LayerNorm"):
        norm = norms[config.normalization](normalized_shape=hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm

    torch_norm.WrappedTorchNorm.__new__ = new_norm


def _patch_gloo_uneven_collectives() -> None:
    """gloo's all_gather / reduce_scatter need equal sizes (NCCL does not); the alltoall dispatcher with
    ETP > 1 gathers uneven token counts. Pad for all_gather, all_reduce then slice for reduce_scatter."""
    import torch
    import torch.distributed as dist

    all_gather = dist.all_gather
    reduce_scatter = dist.reduce_scatter

    def uneven_all_gather(tensor_list, tensor, group=None, async_op=False):
        if len({tuple(t.shape) for t in tensor_list} | {tuple(tensor.shape)}) <= 1:
            return all_gather(tensor_list, tensor, group=group, async_op=async_op)
        rows = max(t.shape[0] for t in tensor_list)
        padded = tensor.new_zeros((rows,) + tuple(tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        gathered = [torch.empty_like(padded) for _ in tensor_list]
        all_gather(gathered, padded, group=group)
        for out, full in zip(tensor_list, gathered):
            out.copy_(full[: out.shape[0]])
        return None

    def uneven_reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if len({tuple(t.shape) for t in input_list}) <= 1:
            return reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
        full = torch.cat([t.contiguous() for t in input_list], dim=0)
        dist.all_reduce(full, op=op, group=group)
        rank = dist.get_rank(group)
        start = sum(t.shape[0] for t in input_list[:rank])
        output.copy_(full[start: start + input_list[rank].shape[0]])
        return None

    dist.all_gather = uneven_all_gather
    dist.reduce_scatter = uneven_reduce_scatter
