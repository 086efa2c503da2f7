"""Measurements of the real CPU trainer (gloo, eager), cached in bench/cpu_measurements.json.

    .venv/bin/python bench/cpu_measurements.py [--seq-len 256 128] [--only-missing]

Each layout of `LAYOUTS` runs once per sequence length as the quickstart runs its trials: tiny-moe, 4 ranks
(`torchrun --nproc-per-node 4 -m trainers.megatron_moe`), GBS 8, fp32, 3 measured steps after 1 warm-up,
under `nice -n 5` (the machine is shared). The result JSON of each run (status, measured tokens/s/GPU, peak
resident memory, step times) is kept, so bench/cpu_calibration.py and bench/transfer_check.py need not measure
again. Each layout runs REPEATS times, minutes apart; its measurement is the fastest repeat's median step (the
machine is shared: other jobs only ever slow a run down). `FIT` and `HELD` split the layouts in two declared halves: the
calibration sees only `FIT`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_spaces.layouts.layout import Layout  # noqa: E402

CACHE = ROOT / "bench" / "cpu_measurements.json"
MODEL = "tiny-moe"
RANKS = 4
GBS = 8
STEPS, WARMUP = 6, 2  # more than the quickstart's 3: the machine is shared, single steps vary by +-30%
RUN_TIMEOUT_S = 900
# each layout is measured this many times, minutes apart; the fastest median step counts (find)
REPEATS = 2


def _layout(tp=1, cp=1, ep=1, pp=1, vpp=1, mbs=1, recompute="none") -> Layout:
    return Layout(tp=tp, cp=cp, ep=ep, pp=pp, vpp=vpp, mbs=mbs, gbs=GBS, recompute=recompute, precision="fp32",
                  dispatcher="alltoall")


# 16 legal layouts of the quickstart's space (every parallel dimension, recompute and micro-batch size appear in
# both halves); FIT = the odd ones, HELD = the even ones (declared before any was measured)
LAYOUTS = [
    _layout(),                                    # 1 DP4
    _layout(ep=2, mbs=2),                         # 2
    _layout(ep=4, recompute="layernorm"),         # 3
    _layout(tp=2),                                # 4
    _layout(tp=4, mbs=2),                         # 5
    _layout(cp=2),                                # 6
    _layout(cp=2, ep=2, recompute="full"),        # 7
    _layout(pp=2),                                # 8
    _layout(pp=4),                                # 9
    _layout(pp=2, vpp=2, recompute="layernorm"),  # 10
    _layout(tp=2, cp=2),                          # 11
    _layout(tp=2, ep=2, mbs=2, recompute="layernorm,moe,mlp"),  # 12
    _layout(cp=2, pp=2, recompute="layernorm"),   # 13 (core_attn here crashed gloo once: trainer issue, not timed)
    _layout(tp=2, pp=2, recompute="full"),        # 14
    _layout(ep=2, pp=2, vpp=3),                   # 15
    _layout(tp=4, ep=4),                          # 16
]
FIT = LAYOUTS[0::2]
HELD = LAYOUTS[1::2]
# packed documents (THD) of a short-document histogram: never fitted, only scored (bench/cpu_calibration.py);
# DP, CP (documents padded to 2*CP), a pack of two sequences (MBS 2) and PP
PACKED_LENGTHS = "bench/packed_lengths_256.json"  # relative to the repository root
PACKED = [_layout(), _layout(cp=2), _layout(tp=2, mbs=2), _layout(ep=2, pp=2)]


def load_cache() -> dict:
    if CACHE.is_file():
        return json.loads(CACHE.read_text())
    return {"source": f"python -m trainers.megatron_moe --model {MODEL} ({RANKS} ranks under torchrun, gloo, fp32, "
                      f"--steps {STEPS} --warmup {WARMUP}, nice -n 5 on a shared machine)", "runs": []}


def runs_of(cache: dict, layout: Layout, seq_len: int, lengths: str | None = None) -> list[dict]:
    return [run for run in cache["runs"] if run["seq_len"] == seq_len and run.get("lengths") == lengths
            and Layout.from_dict(run["layout"]) == layout]


def find(cache: dict, layout: Layout, seq_len: int, lengths: str | None = None) -> dict | None:
    """The layout's measurement: over its repeats, the fastest median step (other jobs on the machine only ever
    slow a run down); status ok if any repeat was ok. None if never measured. Packed documents (`lengths`):
    tokens/s of real tokens (the run's useful share of each step's tokens)."""
    runs = runs_of(cache, layout, seq_len, lengths)
    if not runs:
        return None
    ok = [r for r in runs if r["status"] == "ok" and r.get("step_times_s")]
    if not ok:
        return runs[0]
    best = min(ok, key=lambda r: statistics.median(r["step_times_s"]))
    step = statistics.median(best["step_times_s"])
    share = best.get("useful_token_share") or 1.0
    return {**best, "tokens_per_sec_per_gpu": GBS * seq_len * share / step / RANKS, "repeats": len(runs),
            "peak_memory_gib": statistics.mean(r["peak_memory_gib"] for r in ok if r.get("peak_memory_gib"))}


def measure(layout: Layout, seq_len: int, lengths: str | None = None) -> dict:
    """One real trainer run (of packed documents with `lengths`); the TrialResult's measured figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = ["nice", "-n", "5", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS),
               "-m", "trainers.megatron_moe", "--model", MODEL, "--seq-len", str(seq_len), "--steps", str(STEPS),
               "--warmup", str(WARMUP), "--result", str(out), *layout.to_flags(),
               *(["--lengths", lengths] if lengths else [])]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if not out.is_file():
            raise RuntimeError(f"trainer wrote no result ({proc.returncode}): {proc.stderr[-2000:]}")
        result = json.loads(out.read_text())
    return {"model": MODEL, "gpu": "cpu", "num_gpus": RANKS, "seq_len": seq_len, "layout": layout.to_dict(),
            "status": result.get("status"), "error": result.get("error"),
            "tokens_per_sec_per_gpu": result.get("tokens_per_sec_per_gpu"),
            "peak_memory_gib": result.get("peak_memory_gib"), "step_times_s": result.get("step_times_s"),
            "memory_gib": result.get("memory_gib"), "lengths": lengths,
            "useful_token_share": (result.get("extra", {}).get("packing") or {}).get("useful_token_share"),
            "measured_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")}


def ensure(seq_lens: list[int], layouts: list[Layout] = LAYOUTS, repeats: int = REPEATS,
           lengths: str | None = None) -> dict:
    """Measure what the cache lacks (one run at a time; each repeat pass after the previous one over every layout,
    so a layout's repeats are minutes apart), save after each run, return the cache."""
    cache = load_cache()
    for repeat in range(repeats):
        for seq in seq_lens:
            for layout in layouts:
                if len(runs_of(cache, layout, seq, lengths)) > repeat:
                    continue
                _measure_into(cache, layout, seq, lengths)
    return cache


def _measure_into(cache: dict, layout: Layout, seq: int, lengths: str | None = None) -> None:
    run = measure(layout, seq, lengths)
    print(f"seq {seq} {layout.key()}{' packed' if lengths else ''}: {run['status']} "
          f"{run['tokens_per_sec_per_gpu']} tokens/s/GPU, peak {run['peak_memory_gib']} GiB", flush=True)
    cache["runs"].append(run)
    CACHE.write_text(json.dumps(cache, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--packed", action="store_true", help="measure the packed layouts (PACKED) at 256 instead")
    args = parser.parse_args()
    if args.packed:
        ensure([256], PACKED, lengths=PACKED_LENGTHS)
    else:
        ensure(args.seq_len)


if __name__ == "__main__":
    main()
