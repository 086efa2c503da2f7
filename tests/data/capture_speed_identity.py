"""Capture what `space --json` and `estimate --json` print for a set of situations, so that making the cost model
faster cannot change a figure (tests/search_spaces/test_speed_identity.py compares, digit for digit).

    .venv/bin/python tests/data/capture_speed_identity.py            # rewrites tests/data/speed_identity.json

Run it only on a commit whose figures are the reference (it records that commit); a change that is meant to move
the cost model's figures recaptures them and says so in its commit.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OUT = Path(__file__).with_name("speed_identity.json")

# `space` figures that depend on the machine, not on the model (the rest is pinned)
UNPINNED_SPACE_KEYS = ("seconds",)
# no time budget cuts these runs short: the reference depends on counts only (--max-grids)
NO_BUDGET = ["--budget", "100000"]

SPACE_CASES: list[list[str]] = [
    ["--model", "deepseek-v3", "--gpu", "h100", "--num-gpus", "1024", "--seq-len", "131072"],
    ["--model", "deepseek-v3", "--gpu", "h200", "--num-gpus", "256", "--seq-len", "32768", "--top", "25"],
    ["--model", "qwen3-30b-a3b", "--gpu", "h200", "--num-gpus", "64", "--seq-len", "32768"],
    ["--model", "llama3-70b", "--gpu", "b200", "--num-gpus", "128", "--seq-len", "8192"],
    ["--model", "gpt-oss-120b", "--gpu", "gb200", "--num-gpus", "256", "--seq-len", "65536"],
    ["--model", "kimi-k2", "--gpu", "b300", "--num-gpus", "512", "--seq-len", "16384", "--fix", "pp=8",
     "--max-grids", "300"],
    ["--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--num-gpus", "128", "--seq-len", "65536", "--gbs", "64"],
    ["--model", "qwen3-235b-a22b", "--gpu", "gb300", "--num-gpus", "1024", "--seq-len", "262144", "--top", "5"],
    ["--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "4", "--seq-len", "512"],
    ["--model", "tiny-mla-moe", "--gpu", "cpu", "--num-gpus", "8", "--seq-len", "1024", "--top", "40"],
]

DSV3 = ["--model", "deepseek-v3", "--gpu", "h100", "--num-gpus", "256", "--seq-len", "131072"]
ESTIMATE_CASES: list[list[str]] = [
    DSV3 + ["--tp", "1", "--cp", "32", "--ep", "32", "--etp", "1", "--pp", "8", "--vpp", "4", "--mbs", "1",
            "--gbs", "128", "--precision", "fp8-blockwise", "--dispatcher", "deepep", "--recompute",
            "mla_up_proj,layernorm,moe,mlp", "--cuda-graphs", "none", "--optimizer-offload", "1.0"],
    DSV3 + ["--tp", "2", "--cp", "16", "--ep", "32", "--pp", "8", "--vpp", "2", "--gbs", "128",
            "--cp-comm-type", "a2a+p2p", "--hierarchical-cp", "2,8", "--dispatcher", "hybridep",
            "--recompute", "mla_up_proj,layernorm", "--ep-overlap", "true"],
    DSV3 + ["--cp", "8", "--pp", "4"],  # does not fit
    ["--model", "deepseek-v3", "--gpu", "b200", "--num-gpus", "512", "--seq-len", "16384", "--tp", "2", "--cp", "2",
     "--ep", "32", "--pp", "16", "--vpp", "2", "--gbs", "1024", "--precision", "mxfp8", "--cuda-graphs",
     "attn,moe_router,moe_preprocess", "--routing", "capacity:1.0"],
    ["--model", "llama3-70b", "--gpu", "h100", "--num-gpus", "64", "--seq-len", "8192", "--tp", "8", "--pp", "4",
     "--vpp", "5", "--gbs", "512", "--recompute", "core_attn"],
    ["--model", "llama3.1-405b", "--gpu", "gb200", "--num-gpus", "576", "--seq-len", "131072", "--tp", "8",
     "--cp", "8", "--pp", "9", "--gbs", "8", "--cp-comm-type", "allgather"],
    ["--model", "gpt-oss-120b", "--gpu", "h200", "--num-gpus", "64", "--seq-len", "32768", "--tp", "2", "--cp",
     "4", "--ep", "8", "--pp", "2", "--mbs", "2", "--gbs", "256", "--cp-comm-type", "a2a"],
    ["--model", "qwen3-next-80b-a3b", "--gpu", "h100", "--num-gpus", "128", "--seq-len", "65536", "--tp", "2",
     "--cp", "4", "--ep", "16", "--pp", "4", "--gbs", "64", "--recompute", "full", "--recompute-method", "block",
     "--recompute-num-layers", "2"],
    ["--model", "kimi-k2", "--gpu", "gb300", "--num-gpus", "1024", "--seq-len", "262144", "--cp", "64", "--ep",
     "64", "--pp", "16", "--gbs", "64", "--cp-comm-type", "a2a+p2p", "--hierarchical-cp", "8,8",
     "--optimizer-offload", "0.5", "--distributed-optimizer", "true"],
    ["--model", "qwen3-30b-a3b", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096", "--ep", "8",
     "--gbs", "64", "--num-layers", "12", "--hidden-size", "1024", "--dispatcher", "allgather"],
    ["--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "4", "--seq-len", "512", "--ep", "2", "--pp", "2",
     "--gbs", "8", "--precision", "fp32"],
    ["--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "4", "--seq-len", "512", "--pp", "3"],  # illegal
]


def run_cli(argv: list[str]) -> tuple[int, dict]:
    """(exit code, the JSON object printed) of `moe-autotune ARGV --json`, in this process."""
    from orchestrator.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*argv, "--json"])
    return rc, json.loads(out.getvalue())


def space_row(argv: list[str]) -> dict:
    rc, data = run_cli(["space", *argv, *NO_BUDGET])
    return {"argv": argv, "rc": rc, "output": {k: v for k, v in data.items() if k not in UNPINNED_SPACE_KEYS}}


def estimate_row(argv: list[str]) -> dict:
    rc, data = run_cli(["estimate", *argv])
    return {"argv": argv, "rc": rc, "output": data}


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "search_spaces"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    data = {"commit": commit, "search_spaces_modified": bool(dirty),
            "generator": "tests/data/capture_speed_identity.py",
            "space": [space_row(a) for a in SPACE_CASES], "estimate": [estimate_row(a) for a in ESTIMATE_CASES]}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT} ({len(data['space'])} space, {len(data['estimate'])} estimate cases) at {commit}")


if __name__ == "__main__":
    main()
