"""A stand-in trainer for orchestration tests: parses the trainer's flags, writes a TrialResult at once.

Honours the trainer's test fault hook MOE_AUTOTUNE_FAULT (oom@K, hang@K, crash@K, slow@K:S) coarsely.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

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
    if fault.startswith("hang"):
        time.sleep(10_000)
    if fault.startswith("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    layout = {k: getattr(args, k) for k in ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs")}
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


if __name__ == "__main__":
    sys.exit(main())
