"""bench/delta_net_kernel.py, the GPU timing of Qwen3-Next's chunked delta rule, works before a GPU is lent: its
CPU harness (the trainer's reference kernel) measures, predicts and splits the times into the two calibration
constants; without CUDA it says so in one line and exits 0, so scripts/gpu_check.sh goes on."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "delta_net_kernel.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_the_cpu_harness_measures_predicts_and_splits_the_constants(tmp_path):
    proc = _run("--reference", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "delta_net_kernel.json").read_text())
    rows = result["rows"]
    assert {(r["seq_len"], r["heads"]) for r in rows} == {(256, 2), (256, 4), (512, 2), (512, 4)}
    for row in rows:
        assert 0 < row["measured"]["fwd_s"] < row["measured"]["fwd_bwd_s"]
        predicted = row["predicted"]
        assert predicted["fwd_bwd_s"] == predicted["parallel_s"] + predicted["state_pass_s"]
    # the model's parallel part grows with the heads, its state pass does not (the latency-bound premise)
    by = {(r["seq_len"], r["heads"]): r["predicted"] for r in rows}
    assert by[(512, 4)]["parallel_s"] > by[(512, 2)]["parallel_s"]
    assert by[(512, 4)]["state_pass_s"] == by[(512, 2)]["state_pass_s"]
    constants = result["constants"]
    assert constants["delta_net_state_step_s"] != 0
    assert set(constants["calibration"]) == {"linear_attention_efficiency", "delta_net_state_step_s"}
    assert proc.stdout.strip().splitlines()[-1].startswith("delta-net kernel on cpu (reference kernel): state step")


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    proc = _run("--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "delta-net kernel: skipped: no CUDA device (use --reference for the CPU harness)"]
    assert json.loads((tmp_path / "delta_net_kernel.json").read_text())["skipped"].startswith("no CUDA device")
