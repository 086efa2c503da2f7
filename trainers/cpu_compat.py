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
import sys

import torch

PINNED_MEGATRON_CORE = "0.19.2"

# (module, attribute) pairs patched below: if an upgrade renames one, apply() says which.
PATCHED_SYMBOLS = (
    ("megatron.core.tensor_parallel.random", "_set_cuda_rng_state"),
    ("megatron.core.tensor_parallel.random", "_get_cuda_rng_state"),
    ("megatron.core.tensor_parallel.random", "CheckpointWithoutOutput"),
    ("megatron.core.transformer.moe.moe_utils", "maybe_move_tensor_to_cpu"),
    ("megatron.core.transformer.moe.token_dispatcher", "maybe_move_tensor_to_cpu"),
    ("megatron.core.transformer.torch_norm", "WrappedTorchNorm"),
    # gated delta-net (Qwen3-Next): the flash-linear-attention kernels Megatron-Core imports, its jit-compiled
    # helpers, and the TE-only spec helpers of its experimental attention variant
    ("megatron.core.ssm.gated_delta_net.common", "HAVE_FLA"),
    ("megatron.core.ssm.gated_delta_net.common", "causal_conv1d"),
    ("megatron.core.ssm.gated_delta_net.common", "l2norm"),
    ("megatron.core.ssm.gated_delta_net.common", "chunk_gated_delta_rule"),
    ("megatron.core.ssm.gated_delta_net.common", "_GDNBase"),
    ("megatron.core.ssm.gated_delta_net.gdn", "causal_conv1d"),
    ("megatron.core.ssm.gated_delta_net.gdn", "chunk_gated_delta_rule"),
    ("megatron.core.models.gpt.experimental_attention_variant_module_specs", "_get_backend_spec_provider"),
    ("megatron.core.models.gpt.experimental_attention_variant_module_specs", "_get_self_attention_module_spec"),
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
    compile_eagerly()
    check_version()
    check_symbols()
    _stub_cuda_runtime()
    _redirect_cuda_tensors_to_cpu()
    _patch_megatron_internals()
    _patch_gloo_uneven_collectives()
    _patch_gated_delta_net()
    _applied = True


def compile_eagerly() -> None:
    """`torch.compile` hands back the function it is given (idempotent). Call before Megatron-Core is imported.

    Megatron's jit_fuser is torch.compile: on CPU every new shape would compile C++ with inductor (minutes on a
    few cores, again whenever the tokens per expert change); eager runs the same functions. Decorating them
    also imports dynamo and inductor at Megatron's import: about 1.2 of a CPU rank's 5 s of start-up. A function
    compiled before this call runs eagerly through dynamo's switch instead."""
    if getattr(torch.compile, "_moe_autotune_eager", False):
        return

    def eager(model=None, **_options):
        return model if model is not None else (lambda fn: fn)

    eager._moe_autotune_eager = True  # type: ignore[attr-defined]
    torch.compile = eager
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].config.disable = True


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

    # The stand-ins only quack like torch's types (mypy: not the declared ones).
    cuda = torch.cuda
    cuda.Stream = _NoStream  # type: ignore[misc, assignment]
    cuda.Event = _NoEvent  # type: ignore[misc, assignment]
    cuda.current_stream = lambda *a, **k: _NoStream()  # type: ignore[assignment]
    cuda.default_stream = lambda *a, **k: _NoStream()  # type: ignore[assignment]
    cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    cuda.synchronize = lambda *a, **k: None
    cuda.current_device = lambda: 0
    cuda.set_device = lambda *a, **k: None
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))  # type: ignore[assignment]
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

    # Replacing Tensor methods is the point here (mypy: method-assign).
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.Tensor.record_stream = lambda self, *a, **k: None  # type: ignore[method-assign]

    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and _is_cuda_device(args[0]):
            args = ("cpu",) + tuple(args[1:])
        return original_to(self, *args, **_cpu_kwargs(kwargs))

    torch.Tensor.to = to  # type: ignore[method-assign]

    original_type = torch.Tensor.type

    def tensor_type(self, *args, **kwargs):
        # clip_grads asserts grad.type() == 'torch.cuda.FloatTensor'.
        result = original_type(self, *args, **kwargs)
        if not args and not kwargs and isinstance(result, str) and ".cuda." not in result:
            result = result.replace("torch.", "torch.cuda.", 1)
        return result

    torch.Tensor.type = tensor_type  # type: ignore[method-assign]


def stand_in_for_transformer_engine_fp8() -> None:
    """Without Transformer Engine (on CPU, or a GPU without it): CheckpointWithoutOutput (selective recompute of
    layernorm / moe_act) calls TE's FP8GlobalStateManager whenever fp8 is not None -- including the default
    fp8=False -- which Megatron-Core 0.19.2 leaves undefined then (the GPU check's NameError). Idempotent."""
    import megatron.core.tensor_parallel.random as mcore_random

    if hasattr(mcore_random, "FP8GlobalStateManager"):
        return

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


def _patch_megatron_internals() -> None:
    import megatron.core.tensor_parallel.random as mcore_random
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as token_dispatcher
    import torch
    from megatron.core.transformer import torch_norm

    # Megatron's RNG tracker goes through torch.cuda.default_generators.
    mcore_random._set_cuda_rng_state = lambda new_state, *a, **k: torch.set_rng_state(new_state)
    mcore_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()

    stand_in_for_transformer_engine_fp8()

    # The alltoall dispatcher only turns split sizes into numpy when the tensor is on CUDA.
    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):  # noqa: ARG001 -- Megatron's signature
        if torch.is_tensor(tensor) and as_numpy:
            return tensor.numpy()
        return tensor

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu

    # The torch norm refuses sequence parallelism; mark its parameters like the fused norms do, so that
    # finalize_model_grads all-reduces their gradients over TP.
    norms = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}

    def new_norm(cls, config, hidden_size, eps=1e-5, persist_layer_norm=False, zero_centered_gamma=False,  # noqa: ARG001
                 normalization="LayerNorm"):  # noqa: ARG001 -- Megatron's signature
        if config.layernorm_zero_centered_gamma:  # refused like the original torch norm does
            raise NotImplementedError("zero-centered gamma is not supported by the CPU torch norm")
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


# --- gated delta-net: flash-linear-attention's kernels in plain PyTorch --------------------------------
# Megatron-Core's GatedDeltaNet calls exactly three FLA (Triton) functions. The references below follow
# FLA's signatures and semantics (shapes [batch, seq, heads, dim], g = log decay, scale = key_dim^-0.5);
# tests/trainers/test_trainer_config.py checks them against a step-by-step recurrence.

def reference_l2norm(x, eps: float = 1e-6, output_dtype=None):
    """fla.modules.l2norm.l2norm: x / sqrt(sum(x^2) + eps) over the last dimension, computed in fp32."""
    work = x.to(torch.promote_types(x.dtype, torch.float32))
    y = work * torch.rsqrt(work.pow(2).sum(-1, keepdim=True) + eps)
    return y.to(output_dtype or x.dtype)


def reference_causal_conv1d(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
                            activation=None, cu_seqlens=None, **unused):  # noqa: ARG001 -- fla's signature
    """fla.modules.convolution.causal_conv1d: depthwise causal convolution of x [b, s, d] with weight [d, w]
    (output t sees inputs t-w+1..t), then the activation; returns (y, final_state)."""
    import torch.nn.functional as F

    if residual is not None or initial_state is not None or output_final_state or cu_seqlens is not None:
        raise NotImplementedError("CPU causal_conv1d: no residual, initial/final state or packed sequences")
    seq, width = x.shape[1], weight.shape[-1]
    y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=width - 1, groups=weight.shape[0])
    y = y[..., :seq].transpose(1, 2)
    if activation in ("silu", "swish"):
        y = F.silu(y)
    elif activation is not None:
        raise NotImplementedError(f"CPU causal_conv1d: activation {activation!r}")
    return y, None


def reference_chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size: int = 64,
                                     **unused):  # noqa: ARG001 -- fla's signature
    """fla.ops.gated_delta_rule.chunk_gated_delta_rule: q, k [b, s, h, dk], v [b, s, h, dv], g and beta
    [b, s, h]; returns (o [b, s, h, dv], final state [b, h, dk, dv] or None).

    Per head the state S [dk, dv] follows S_t = exp(g_t) S_{t-1} + k_t u_t^T with
    u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t), and o_t = scale * S_t^T q_t (scale = dk^-0.5). Like FLA's
    kernel, the backward recomputes the chunks from the saved inputs rather than keeping the intermediates."""
    if cu_seqlens is not None:
        raise NotImplementedError("CPU chunk_gated_delta_rule: packed sequences (cu_seqlens) are not supported")
    if use_qk_l2norm_in_kernel:
        q, k = reference_l2norm(q), reference_l2norm(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if initial_state is None and not output_final_state:  # how Megatron-Core's GatedDeltaNet calls it
        return _RecomputedGatedDeltaRule.apply(q, k, v, g, beta, scale, chunk_size), None
    out, state = gated_delta_rule_chunks(q, k, v, g, beta, scale, initial_state, chunk_size)
    return out, (state if output_final_state else None)


def gated_delta_rule_chunks(q, k, v, g, beta, scale, initial_state=None, chunk_size: int = 64):
    """The gated delta rule over whole chunks of `chunk_size` tokens, in fp32 like FLA (fp64 stays fp64).
    Inside a chunk the u's solve one unit lower-triangular system (the WY form): matrix products, no token
    loop. Returns (o [b, s, h, dv], final state)."""
    dtype = v.dtype
    work = torch.promote_types(dtype, torch.float32)
    # [b, s, h, d] -> [b, h, s, d], the sequence padded to whole chunks (g = beta = k = 0: no change)
    q, k, v, g, beta = (t.transpose(1, 2).to(work) for t in (q, k, v, g, beta))
    seq = q.shape[2]
    pad = -seq % chunk_size
    if pad:
        q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (torch.nn.functional.pad(t, (0, pad)) for t in (g, beta))
    batch, heads, _, key_dim = k.shape
    state = (torch.zeros(batch, heads, key_dim, v.shape[-1], dtype=work) if initial_state is None
             else initial_state.to(work))
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool).tril()
    outputs = []
    for start in range(0, seq + pad, chunk_size):
        part = slice(start, start + chunk_size)
        out, state = _gated_delta_chunk(q[:, :, part] * scale, k[:, :, part], v[:, :, part], g[:, :, part],
                                        beta[:, :, part], state, causal)
        outputs.append(out)
    return torch.cat(outputs, dim=2)[:, :, :seq].transpose(1, 2).to(dtype), state


class _RecomputedGatedDeltaRule(torch.autograd.Function):
    """Saves q, k, v, g, beta only; the backward reruns the chunks with autograd and differentiates them."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, chunk_size):
        ctx.save_for_backward(q, k, v, g, beta)
        ctx.scale, ctx.chunk_size = scale, chunk_size
        return gated_delta_rule_chunks(q, k, v, g, beta, scale, None, chunk_size)[0]

    @staticmethod
    def backward(ctx, grad_out):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        q, k, v, g, beta = inputs
        with torch.enable_grad():
            out = gated_delta_rule_chunks(q, k, v, g, beta, ctx.scale, None, ctx.chunk_size)[0]
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
        return (*(next(grads) if t.requires_grad else None for t in inputs), None, None)


def _gated_delta_chunk(q, k, v, g, beta, state, causal):
    """One chunk: outputs and the state after it (see gated_delta_rule_chunks)."""
    cum = g.cumsum(-1)  # log decay from the chunk start to each token
    # exp(cum_i - cum_j) for j <= i, 0 above the diagonal (masked before exp: no overflow)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    start_decay = cum.exp()[..., None]
    strict = decay * (k @ k.transpose(-1, -2)) * beta[..., None]
    system = strict.tril(-1) + torch.eye(causal.shape[0], dtype=strict.dtype)
    rhs = beta[..., None] * (v - start_decay * (k @ state))
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    out = start_decay * (q @ state) + (decay * (q @ k.transpose(-1, -2))) @ u
    end_decay = (cum[..., -1:] - cum).exp()[..., None]
    state = cum[..., -1, None, None].exp() * state + (k * end_decay).transpose(-1, -2) @ u
    return out, state


def _patch_gated_delta_net() -> None:
    """Gated delta-net on CPU: the FLA references above in place of the Triton kernels; Megatron's jit_fuser
    (torch.compile) run eagerly; its TE-only experimental-attention spec built from CPU modules; TP-invariant
    initialisation of the parameters GatedDeltaNet draws per TP shard."""
    import megatron.core.models.gpt.experimental_attention_variant_module_specs as variant_specs
    import megatron.core.ssm.gated_delta_net as gdn_package
    import megatron.core.ssm.gated_delta_net.common as gdn_common
    import megatron.core.ssm.gated_delta_net.gdn as gdn_module

    from trainers import cpu_linear_attention

    kernels = {"causal_conv1d": reference_causal_conv1d, "l2norm": reference_l2norm,
               "chunk_gated_delta_rule": reference_chunk_gated_delta_rule}
    for module in (gdn_common, gdn_module, gdn_package):
        for name, kernel in kernels.items():
            if hasattr(module, name):
                setattr(module, name, kernel)
    gdn_common.HAVE_FLA = True  # its jit_fuser helpers run eagerly: compile_eagerly
    variant_specs._get_backend_spec_provider = lambda config: cpu_linear_attention.CPUSpecProvider()
    variant_specs._get_self_attention_module_spec = cpu_linear_attention.local_self_attention_spec
    cpu_linear_attention.make_gdn_init_tp_invariant(gdn_common._GDNBase)
