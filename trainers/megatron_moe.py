"""The profiling trainer: `torchrun ... -m trainers.megatron_moe --model M --seq-len S <layout flags> --result R`.

Builds Megatron-Core's GPTModel (MoE layers, token dispatcher, pipeline schedule, DDP, optimizer) with the
layout applied, runs warm-up steps then measured steps on synthetic tokens of fixed shape, and rank 0 writes
one TrialResult JSON. Exit code 0 whenever the result was written, whatever its status.

Failure protocol (no rank may hang): the first rank that fails claims `<result>.claim` (O_EXCL), writes
the result (oom / error) and exits; its exit closes its gloo connections, so peers blocked on it fail too,
find the claim taken and exit quietly. On NCCL the peers fall out at the process-group timeout at worst.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

T_START = time.time()

from search_spaces.catalog.hardware import load_gpu  # noqa: E402
from search_spaces.errors import SpecError  # noqa: E402
from search_spaces.layouts.layout import DIMENSIONS, Layout  # noqa: E402
from search_spaces.result import TrialResult  # noqa: E402

# --- command line -----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainers.megatron_moe", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="catalog name or path to a Hugging Face config.json")
    p.add_argument("--num-layers", type=int, default=None, help="override: fewer layers for a proxy run")
    p.add_argument("--hidden-size", type=int, default=None, help="override: narrower model for a proxy run")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="measured steps")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps before the measured ones")
    p.add_argument("--result", default=None, help="where to write the TrialResult JSON (else printed)")
    p.add_argument("--gpu", default="auto", help="GPU name for MFU (catalog name); auto: detect, cpu without CUDA")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--comm-timeout", type=float, default=300.0, help="seconds before a stuck collective fails")
    p.add_argument("--layout", default=None, help="JSON/YAML file of Layout.to_dict(); flags below override it")
    p.add_argument("--lengths", default=None, help="a document-length histogram (`moe-autotune lengths`): pack "
                                                   "documents drawn from it into each sequence (THD)")
    layout = p.add_argument_group("layout (same flags as `moe-autotune estimate`)")
    for dim in DIMENSIONS:
        layout.add_argument(dim.flag, dest=dim.name, default=None,
                            help=f"{dim.doc} ({dim.values_text()}; default {dim.encode(dim.default)})")
    return p


def layout_from_args(args: argparse.Namespace, on_cpu: bool) -> Layout:
    """The layout file (if any), then the flags given over it; gbs defaults to mbs."""
    base = Layout.from_dict(_read_layout_file(args.layout)) if args.layout else Layout()
    flags = {dim.name: getattr(args, dim.name) for dim in DIMENSIONS if getattr(args, dim.name) is not None}
    if on_cpu and not args.layout and "precision" not in flags:
        flags["precision"] = "fp32"  # the Layout default (bf16) is ~6x slower on CPU
    if "gbs" not in flags and not args.layout:
        flags["gbs"] = flags.get("mbs", "1")  # one microbatch per step unless told otherwise
    return Layout.from_params(flags, base=base)


def _read_layout_file(path: str) -> dict:
    import yaml  # JSON is YAML

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"cannot read layout file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"layout file {path} must hold a mapping of layout fields")
    return data


def load_model_spec(args: argparse.Namespace):
    from search_spaces.catalog.models import load_model

    model = load_model(args.model)
    if args.num_layers or args.hidden_size:
        model = model.with_overrides(num_layers=args.num_layers, hidden_size=args.hidden_size)
    return model


def _load_lengths(path: str | None, seq_len: int):
    if path is None:
        return None
    from search_spaces.cost.packing import load_histogram

    hist = load_histogram(path)
    hist.check_fits(seq_len)
    return hist


# --- small helpers ----------------------------------------------------------------------------------

def _gpu_name(requested: str, on_cpu: bool) -> str:
    if requested != "auto":
        return requested
    if on_cpu:
        return "cpu"
    import torch

    device = torch.cuda.get_device_name().lower()
    for name in ("gb300", "gb200", "b300", "b200", "h200", "h100", "h800", "a100", "l40s"):
        if name in device:
            return name
    return device.split()[-1]


def _versions() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("megatron-core", "transformer-engine", "transformer_engine"):
        try:
            found[package.replace("_", "-")] = version(package)
        except PackageNotFoundError:
            pass
    return found


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _claim(result_path: str | None) -> bool:
    """The first failing rank claims the right to write the failure result."""
    if not result_path:
        return True
    try:
        os.close(os.open(f"{result_path}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _emit(result: TrialResult, path: str | None) -> None:
    if path:
        result.write(path)
    else:
        import json

        print(json.dumps(result.to_dict(), indent=2, default=str), flush=True)


# --- main ----------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not os.environ.get("MOE_AUTOTUNE_TRAINER_WARNINGS"):
        # Megatron-Core warns about every missing optional kernel on each rank; keep logs readable.
        warnings.filterwarnings("ignore")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.result:  # `--result out/r.json` in a folder not there yet: every rank may need it (claim, result)
        Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    if rank == 0 and args.result:
        # A previous run's result or failure claim must not be mistaken for this run's.
        for stale in (Path(args.result), Path(f"{args.result}.claim")):
            stale.unlink(missing_ok=True)

    import torch

    on_cpu = not torch.cuda.is_available()
    if on_cpu:
        from trainers.cpu_compat import compile_eagerly

        compile_eagerly()  # before anything imports Megatron-Core
    try:
        layout = layout_from_args(args, on_cpu)
        model = load_model_spec(args)
        gpu = load_gpu(_gpu_name(args.gpu, on_cpu))
        args.packing_histogram = _load_lengths(args.lengths, args.seq_len)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = TrialResult(layout=layout.to_dict(), model=model.name, gpu=gpu.name, num_gpus=world,
                         seq_len=args.seq_len, versions=_versions())

    from trainers import config as trainer_config

    reason = trainer_config.refusal(model, gpu, layout, world, args.seq_len)
    if not reason and args.packing_histogram is not None:
        from trainers.packed_batches import packed_capability_gap

        reason = packed_capability_gap(model, on_cpu)
    if reason:
        result.status, result.error = "invalid", reason
        result.wall_time_s = time.time() - T_START
        if rank == 0:
            _emit(result, args.result)
        return 0
    try:
        from trainers.run import run_trial

        run_trial(args, layout, model, gpu, result, rank, world, on_cpu)
        result.wall_time_s = time.time() - T_START
        if rank == 0 and _claim(args.result):
            _emit(result, args.result)
        _finish()
        return 0
    except BaseException as exc:  # every failure must become a result, never a hang
        if isinstance(exc, KeyboardInterrupt):
            raise
        if _claim(args.result):
            _emit(_failure(result, exc, rank), args.result)
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: destructors of process groups can block on dead peers.
        os._exit(0)


def _failure(result: TrialResult, exc: BaseException, rank: int) -> TrialResult:
    """The result of a failed run: oom or error, the reason and traceback tail, and the memory the failing
    rank had reached (an OOM's "how far it got")."""
    import torch

    from trainers.measure import peak_memory_gib

    result.status = "oom" if _is_oom(exc) else "error"
    tail = traceback.format_exc()[-3000:]
    result.error = f"rank {rank}: {type(exc).__name__}: {exc}\n{tail}"
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        peak = peak_memory_gib(device)["allocated"]
        result.peak_memory_gib = peak
        result.peak_memory_gib_per_rank = result.peak_memory_gib_per_rank or [peak]
        result.extra["peak_memory_rank"] = rank
    except Exception as reading:  # noqa: BLE001 -- the failure itself is what must be reported
        result.extra["peak_memory_unread"] = f"{type(reading).__name__}: {reading}"
    result.wall_time_s = time.time() - T_START
    return result


def _finish() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
