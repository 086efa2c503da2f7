"""Proxy accuracy: run layouts of the tiny catalog models with the real trainer both at full size and as their
proxy (search_spaces/proxy.py), compose the full-scale step and peak memory from the proxy exactly as the sweep
does (search_spaces.proxy.composed_result), and compare with the full-size measurement.

    python bench/proxy_accuracy.py [--remeasure] [--only NAME ...] [--gpu NAME --max-ranks N]

Every layout has PP >= 2 or DP/EDP >= 2, so its proxy is strictly smaller. Peak memory here is the trainer's
component peak of its most loaded rank (weights + gradients + optimizer states + activations in flight): the
part of a GPU's peak the proxy measures; on a CPU host the process's resident memory is mostly the Python
runtime, the same for any layout. Step times on this 2-core machine are noisy and the full runs oversubscribe
the cores (the composition bounds a CPU step by the host's cores); measurements are cached in
bench/proxy_accuracy.json (`--remeasure` runs the trainer again). Only search_spaces and the trainer are
needed, so the same command runs on a GPU machine (scripts/gpu_check.sh calls it there with `--gpu`, on the
layouts whose full run fits its GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search_spaces.catalog.hardware import load_gpu  # noqa: E402
from search_spaces.catalog.models import load_model  # noqa: E402
from search_spaces.layouts.layout import Layout  # noqa: E402
from search_spaces.proxy import ProxyPlan, composed_result, derive_proxy  # noqa: E402
from search_spaces.result import TrialResult  # noqa: E402
from search_spaces.validation import validate  # noqa: E402

CACHE = ROOT / "bench" / "proxy_accuracy.json"
SEQ_LEN, STEPS, WARMUP = 256, 3, 1
# name: (model, layers, ranks of the full run, layout)
LAYOUTS: dict[str, tuple[str, int, int, dict[str, int | str]]] = {
    "moe_dp4_ep2": ("tiny-moe", 4, 4, dict(ep=2, mbs=1, gbs=8)),
    "moe_pp2_dp2": ("tiny-moe", 4, 4, dict(pp=2, mbs=1, gbs=8)),
    "moe_pp4": ("tiny-moe", 8, 4, dict(pp=4, mbs=1, gbs=8)),
    "moe_pp2_vpp2_dp2": ("tiny-moe", 8, 4, dict(pp=2, vpp=2, mbs=1, gbs=8)),
    "moe_tp2_ep2_dp2": ("tiny-moe", 4, 4, dict(tp=2, ep=2, mbs=1, gbs=8)),
    "moe_cp2_ep2_dp2": ("tiny-moe", 4, 4, dict(cp=2, ep=2, mbs=1, gbs=8)),
    "mla_ep2_recompute": ("tiny-mla-moe", 4, 4, dict(ep=2, mbs=1, gbs=8, recompute="mla_up_proj,layernorm")),
    "mla_pp2_ep1_dp2": ("tiny-mla-moe", 4, 4, dict(pp=2, mbs=2, gbs=8)),
    "qwen3next_ep2": ("tiny-qwen3-next", 4, 4, dict(ep=2, mbs=1, gbs=8)),
    "gptoss_pp2_dp2": ("tiny-gpt-oss", 4, 4, dict(pp=2, mbs=1, gbs=8)),
}
MEMORY = ("weights", "gradients", "optimizer_states", "activations")


def _trainer(ranks: int, model: str, layers: int, layout: Layout, gpu: str, workdir: Path) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = workdir / "result.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
            "127.0.0.1", "--master-port", str(port), "-m", "trainers.megatron_moe", "--model", model,
            "--num-layers", str(layers), "--seq-len", str(SEQ_LEN), "--steps", str(STEPS), "--warmup",
            str(WARMUP), "--gpu", gpu, "--result", str(result), *layout.to_flags()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1800)
    if not result.is_file():
        raise RuntimeError(f"trainer wrote no result (exit {proc.returncode}): {proc.stdout[-2000:]}")
    return json.loads(result.read_text())


def plan_of(name: str, gpu: str) -> ProxyPlan:
    model_name, layers, ranks, fields = LAYOUTS[name]
    layout = Layout.from_dict({**fields, "precision": "fp32" if gpu == "cpu" else "bf16"})
    plan = derive_proxy(load_model(model_name).with_overrides(num_layers=layers), layout, load_gpu(gpu), ranks)
    assert plan.strictly_smaller, f"{name}: the proxy is not smaller"
    return plan


def measure(name: str, gpu: str) -> dict:
    model_name, layers, ranks, _ = LAYOUTS[name]
    plan = plan_of(name, gpu)
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp:
        full = _trainer(ranks, model_name, layers, plan.full_layout, gpu, Path(tmp) / "full")
        proxy = _trainer(plan.world, model_name, plan.model.num_layers, plan.layout, gpu, Path(tmp) / "proxy")
    return {"full": full, "proxy": proxy}


def compare(name: str, runs: dict, gpu: str) -> dict:
    full, proxy = TrialResult.from_dict(runs["full"]), TrialResult.from_dict(runs["proxy"])
    plan = plan_of(name, gpu)
    proxy = validate(proxy, plan.layout, load_gpu(gpu))
    if proxy.status != "ok" or full.status != "ok":
        return {"name": name, "error": proxy.error or full.error}
    composed = composed_result(plan, proxy, load_gpu(gpu), SEQ_LEN)
    if composed.step_time_s is None or full.step_time_s is None:  # both ran ("ok"): both have a step time
        raise ValueError(f"{name}: a run that succeeded has no step time")
    parts = composed.extra["composed"]["memory_gib"]["measured"]
    peak = sum(parts[k] for k in MEMORY)
    measured_peak = full.extra["peak_components_gib"]
    return {"name": name, "full_ranks": plan.full_world, "proxy_ranks": plan.world,
            "step_measured_s": full.step_time_s, "step_composed_s": composed.step_time_s,
            "step_error": composed.step_time_s / full.step_time_s - 1,
            "peak_measured_gib": measured_peak, "peak_composed_gib": peak, "peak_error": peak / measured_peak - 1,
            "components": {k: {"composed": parts[k], "measured": _measured_component(full, k)} for k in MEMORY},
            "time_parts": composed.extra["composed"]["time_s"]}


def _measured_component(full: TrialResult, key: str) -> float:
    mem = full.memory_gib
    if key == "activations":
        return mem["activations_per_microbatch"] * full.extra["inflight_microbatches"]
    return mem[key]


def run(remeasure: bool = False, only: list[str] | None = None, gpu: str = "cpu", max_ranks: int | None = None) -> dict:
    cache = json.loads(CACHE.read_text()) if CACHE.is_file() and gpu == "cpu" else {}
    rows = []
    names = [n for n in only or LAYOUTS if max_ranks is None or LAYOUTS[n][2] <= max_ranks]
    for name in names:
        if remeasure or name not in cache:
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            cache[name] = measure(name, gpu)
            if gpu == "cpu":
                CACHE.write_text(json.dumps(cache, indent=1))
        rows.append(compare(name, cache[name], gpu))
    good = [r for r in rows if "error" not in r]
    return {"rows": rows, "count": len(good),
            "step_mape": 100 * sum(abs(r["step_error"]) for r in good) / max(len(good), 1),
            "peak_mape": 100 * sum(abs(r["peak_error"]) for r in good) / max(len(good), 1)}


def summary(r: dict) -> str:
    return (f"proxy accuracy: step time MAPE {r['step_mape']:.1f}%, peak memory MAPE {r['peak_mape']:.1f}% "
            f"over {r['count']} layouts")


def section(r: dict) -> list[str]:
    lines = ["Each layout run at full size and as its proxy with the real trainer on CPU (fp32, seq 256); the "
             "proxy's measurement composed to full size as the sweep composes it. Peak = weights + gradients + "
             "optimizer states + activations in flight on the most loaded rank.", "",
             "| layout | ranks full → proxy | step measured s | step composed s | error | peak measured GiB | "
             "peak composed GiB | error |", "|---|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        if "error" in x:
            lines.append(f"| {x['name']} | failed: {x['error'][:80]} | | | | | | |")
            continue
        lines.append(f"| {x['name']} | {x['full_ranks']} → {x['proxy_ranks']} | {x['step_measured_s']:.3f} | "
                     f"{x['step_composed_s']:.3f} | {x['step_error']:+.1%} | {x['peak_measured_gib']:.4f} | "
                     f"{x['peak_composed_gib']:.4f} | {x['peak_error']:+.1%} |")
    return lines + ["", f"**{summary(r)}**"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remeasure", action="store_true", help="run the trainer again (else the cached runs)")
    parser.add_argument("--only", nargs="+", choices=list(LAYOUTS), default=None)
    parser.add_argument("--gpu", default="cpu", help="the device's catalog name (a GPU machine: h100, h200, ...)")
    parser.add_argument("--max-ranks", type=int, default=None, help="only layouts whose full run fits N devices")
    args = parser.parse_args()
    result = run(args.remeasure, args.only, args.gpu, args.max_ranks)
    if not result["rows"]:
        print(f"proxy accuracy: skipped, no layout's full run fits {args.max_ranks} device(s)")
        return
    for x in result["rows"]:
        if "error" in x:
            print(f"{x['name']}: failed: {x['error']}")
            continue
        comps = ", ".join(f"{k} {v['composed']:.4f}/{v['measured']:.4f}" for k, v in x["components"].items())
        print(f"{x['name']}: step {x['step_composed_s']:.3f}/{x['step_measured_s']:.3f} s ({x['step_error']:+.1%}), "
              f"peak {x['peak_composed_gib']:.4f}/{x['peak_measured_gib']:.4f} GiB ({x['peak_error']:+.1%}); "
              f"composed/measured GiB: {comps}")
    print(summary(result))


if __name__ == "__main__":
    main()
