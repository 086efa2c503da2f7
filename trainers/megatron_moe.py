"""The profiling trainer: `torchrun ... -m trainers.megatron_moe --model M --seq-len S <layout flags> --result R`.

Builds Megatron-Core's GPTModel (MoE layers, token dispatcher, pipeline schedule, DDP, optimizer) with the
layout applied, runs warm-up steps then measured steps on synthetic tokens of fixed shape, and rank 0 writes
one TrialResult JSON. Exit code 0 whenever the result was written, whatever its status.

Failure protocol (no rank may hang): every rank that fails writes its own failure record beside the result
(`<result>.rank<R>.failure.json`: when, its class, one line, the traceback's tail; search_spaces/failures.py); the
first one claims `<result>.claim` (O_EXCL), writes the result (oom / error) naming the root cause among the records
then written (the earliest failure that is not a symptom such as a peer's connection reset) and exits; its exit
closes its gloo connections, so peers blocked on it fail too, write their records, find the claim taken and exit
quietly. On NCCL the peers fall out at the process-group timeout at worst. The backend, once the process tree has
ended, picks the root cause again from every record and the node logs (a rank SIGKILLed or aborted in C++ writes no
record).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

T_START = time.time()

from search_spaces import failures  # noqa: E402
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
    _stopping_flags(p.add_argument_group("each step as it runs (search_spaces/stopping.py)"))
    layout = p.add_argument_group("layout (same flags as `moe-autotune estimate`)")
    for dim in DIMENSIONS:
        layout.add_argument(dim.flag, dest=dim.name, default=None,
                            help=f"{dim.doc} ({dim.values_text()}; default {dim.encode(dim.default)})")
    return p


def _stopping_flags(group) -> None:
    group.add_argument("--progress", default=None, metavar="FILE",
                       help="rank 0 writes one JSON line per step here as it goes (step, phase warmup|measured, "
                            "step_time_s, tokens_per_sec_per_gpu, peak_memory_gib so far, loss), flushed per line")
    group.add_argument("--stop-within", type=_fraction, default=None, metavar="FRACTION",
                       help="measured enough: stop measuring once the measured step time's 95%% confidence interval "
                            "is within +-FRACTION of its mean (e.g. 0.02), after --min-measured steps")
    group.add_argument("--min-measured", type=_at_least_two, default=3, metavar="N",
                       help="measured steps before --stop-within may stop (default 3, at least 2)")
    group.add_argument("--memory-limit-gib", type=_positive, default=None, metavar="GIB",
                       help="will not fit: stop (status oom, before the OOM) once a rank's memory, with the "
                            "optimizer states the first step created held through the next step, exceeds GIB")


def _fraction(text: str) -> float:
    value = _positive(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1), got {text}")
    return value


def _positive(text: str) -> float:
    return _checked(text, float, lambda v: 0 < v < float("inf"), "a positive number")


def _at_least_two(text: str) -> int:
    return _checked(text, int, lambda v: v >= 2, "at least 2")


def _checked(text: str, kind, ok, what: str):
    """`text` read as `kind` and held to `ok`: argparse's one line (exit 2) naming `what` it must be, else."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


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

def main(argv: list[str] | None = None, *, shared: bool = False) -> int:
    """One trial. `shared` (trainers.cells: several trials in one set of processes): the process group stays up
    for the next trial, and a failure is raised after its result is written instead of ending the process."""
    start = time.time() if shared else T_START
    args = build_parser().parse_args(argv)
    if not os.environ.get("MOE_AUTOTUNE_TRAINER_WARNINGS"):
        # Megatron-Core warns about every missing optional kernel on each rank; keep logs readable.
        warnings.filterwarnings("ignore")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.result:  # `--result out/r.json` in a folder not there yet: every rank may need it (claim, result)
        Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    if rank == 0 and args.result:
        _clear_stale(args.result)

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
    reason = _refusal(args, layout, model, gpu, world, on_cpu)
    if reason:
        result.status, result.error = "invalid", reason
        result.wall_time_s = time.time() - start
        if rank == 0:
            _emit(result, args.result)
        return 0
    return _run(args, layout, model, gpu, result, rank, world, on_cpu, start, shared)


def _refusal(args, layout: Layout, model, gpu, world: int, on_cpu: bool) -> str | None:
    """Why this trainer cannot run the trial (the rules, its capability gaps, packed documents), or None."""
    from trainers import config as trainer_config

    reason = trainer_config.refusal(model, gpu, layout, world, args.seq_len)
    if not reason and args.packing_histogram is not None:
        from trainers.packed_batches import packed_capability_gap

        reason = packed_capability_gap(model, on_cpu)
    return reason


def _run(args, layout: Layout, model, gpu, result: TrialResult, rank: int, world: int, on_cpu: bool, start: float,
         shared: bool) -> int:
    """Train and measure; every failure becomes a result (never a hang), written by the rank that claims it."""
    try:
        from trainers.run import run_trial

        run_trial(args, layout, model, gpu, result, rank, world, on_cpu)
        result.wall_time_s = time.time() - start
        if shared:
            result.extra["shared_process"] = True  # ranks that ran trials before: peak RSS and start-up are theirs too
        if rank == 0 and _claim(args.result):
            _emit(result, args.result)
        if not shared:
            _finish()
        return 0
    except BaseException as exc:  # every failure must become a result, never a hang
        if isinstance(exc, KeyboardInterrupt):
            raise
        mine = _rank_failure(exc, rank, args.result)
        if _claim(args.result):
            _emit(_failure(result, exc, rank, mine, args.result), args.result)
        if shared:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: destructors of process groups can block on dead peers.
        os._exit(0)


def _clear_stale(result_path: str) -> None:
    """A previous run's result, failure claim or failure records must not be mistaken for this run's."""
    for stale in (Path(result_path), Path(f"{result_path}.claim")):
        stale.unlink(missing_ok=True)
    failures.clear_records(result_path)


def _rank_failure(exc: BaseException, rank: int, result_path: str | None) -> failures.RankFailure:
    """This rank's failure (its time, class, line and traceback's tail), recorded beside the result."""
    mine = failures.from_exception(_type_name(exc), str(exc), rank, time.time(), traceback.format_exc(),
                                   _phase(exc))
    if _is_oom(exc) and mine.failure_class != "oom":
        mine = dataclasses.replace(mine, failure_class="oom")
    if result_path:
        try:
            failures.write_record(result_path, mine)
        except OSError as writing:  # the claim's result still names this rank's failure
            print(f"rank {rank}: cannot write its failure record: {writing}", file=sys.stderr)
    return mine


def _type_name(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__name__ if kind.__module__ in ("builtins", "torch") else f"{kind.__module__}.{kind.__name__}"


def _phase(exc: BaseException) -> str | None:
    """build: raised while the parallel state, config or model were built (trainers/run.py's _build); train:
    in the steps; None elsewhere."""
    names = {frame.name for frame in traceback.extract_tb(exc.__traceback__)
             if frame.filename.endswith(os.path.join("trainers", "run.py"))}
    return "train" if "_train" in names else "build" if "_build" in names else None


def _failure(result: TrialResult, exc: BaseException, rank: int, mine: failures.RankFailure,
             result_path: str | None) -> TrialResult:
    """The result of a failed run: oom or error, the root cause among the ranks' records written so far (this
    rank's, unless another failed earlier: a peer's reset is a symptom), the reason and traceback tail, and the
    memory the failing rank had reached (an OOM's "how far it got")."""
    import torch

    from trainers.measure import peak_memory_gib

    result.status = "oom" if _is_oom(exc) else "error"
    result.error = None  # written by apply: the root cause's rank and line, the other failures, its traceback
    everyone = [mine, *(f for f in failures.read_records(result_path) if f.rank != rank)] if result_path else [mine]
    failures.apply(result, failures.root_cause(everyone) or mine, everyone)
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
    from search_spaces.ownership import die_with_launcher

    die_with_launcher()  # a rank dies with its torchrun (which starts it in a session of its own)
    sys.exit(main())
