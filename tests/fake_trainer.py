"""A stand-in trainer for orchestration tests: parses the trainer's flags, writes a TrialResult at once.

Honours the trainer's test fault hook MOE_AUTOTUNE_FAULT (oom@K, raise@K, hang@K, crash@K, slow@K:S) coarsely.
raise@K with MOE_AUTOTUNE_FAULT_RANK=R (R > 0) plays the race the backend settles: rank R raises first and
writes its failure record, then rank 0's connection reset claims the result (search_spaces/failures.py);
MOE_AUTOTUNE_FAULT_NOTE is appended to the injected message (a secret there must never be recorded).
FAKE_TRAINER_HOLD=PATH holds every run after the first while PATH exists (a driver kept busy for as long as a test
needs, whatever the machine's load).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from search_spaces import failures
from search_spaces.result import TrialResult


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs", "steps", "warmup", "seq-len"):
        parser.add_argument(f"--{name}", type=int, default=1)
    parser.add_argument("--result", required=True)
    parser.add_argument("--recompute", default="none")
    args, _ = parser.parse_known_args(argv)
    fault = os.environ.get("MOE_AUTOTUNE_FAULT", "")
    delay = float(os.environ.get("FAKE_TRAINER_SECONDS", "0"))
    if delay:
        time.sleep(delay)
    _hold_after_the_first_run(os.environ.get("FAKE_TRAINER_HOLD", ""))
    if fault.startswith("hang"):
        time.sleep(10_000)
    if fault.startswith("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    layout = {k: getattr(args, k) for k in ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs")}
    if fault.startswith("raise"):
        _raise(args.result, layout)
        return 0
    if fault.startswith("oom"):
        TrialResult(status="oom", error="fake OOM", layout=layout, peak_memory_gib=99.0).write(args.result)
        return 0
    tokens = 1000.0 * args.mbs / (args.tp * (1 + 0.1 * args.pp) * (1.2 if args.recompute == "full" else 1.0))
    # the step time that these tokens/s take on the trial's GPUs (the sweep checks that they agree)
    world = int(os.environ.get("MOE_AUTOTUNE_TRIAL_GPUS", "1"))
    step = args.gbs * args.seq_len / tokens / world
    TrialResult(status="ok", tokens_per_sec_per_gpu=tokens, tflops_per_gpu=tokens / 100, mfu=0.1,
                step_time_s=step, step_times_s=[1.2 * step, step, step], loss=[5.0, 4.9, 4.8],
                peak_memory_gib=1.0 + args.mbs / args.tp, layout=layout).write(args.result)
    print("fake trainer done", file=sys.stderr)
    return 0


def _hold_after_the_first_run(gate: str) -> None:
    if not gate:
        return
    with open(gate + ".starts", "a+") as starts:  # one line per run started: which run this is
        starts.write("run\n")
        starts.seek(0)
        number = len(starts.readlines())
    while number > 1 and os.path.exists(gate):
        time.sleep(0.2)


def _raise(result_path: str, layout: dict) -> None:
    """The records and the result a two-rank trainer leaves when rank R raises and rank 0's reset claims."""
    rank = int(os.environ.get("MOE_AUTOTUNE_FAULT_RANK") or 0)
    note = os.environ.get("MOE_AUTOTUNE_FAULT_NOTE", "")
    cause = failures.from_exception("RuntimeError", f"injected on rank {rank} {note}".strip(), rank, time.time(),
                                    "Traceback (most recent call last):\n  ...\nRuntimeError: injected", "train")
    failures.write_record(result_path, cause)
    claimed = cause
    if rank != 0:
        claimed = failures.from_exception("RuntimeError", "[pair.cc:553] Connection closed by peer [127.0.0.1]:1",
                                          0, time.time() + 0.5, "Traceback ...", "train")
        failures.write_record(result_path, claimed)
    failures.apply(TrialResult(status="error", layout=layout), claimed, [claimed]).write(result_path)


if __name__ == "__main__":
    from search_spaces.ownership import die_with_launcher

    die_with_launcher()  # as the real trainer's ranks do: one dies with its torchrun
    sys.exit(main())
