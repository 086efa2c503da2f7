"""The GPU check's figures: bench/gemm_shapes.py's harness runs on CPU (the GPU check calls it on a lent GPU), its
predicted shares are the cost model's own shape factor, and bench/gpu_results.py renders the stored check into
RESULTS.md without a GPU."""

import json
import math

from search_spaces.calibration.calibration_file import calibration
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost.throughput import gemm_rate, job_for
from search_spaces.layouts.layout import Layout

from bench import gemm_shapes, gpu_results


def test_the_cpu_harness_writes_one_row_per_model_projection_and_size(tmp_path):
    assert gemm_shapes.main(["--cpu", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gemm_shapes.json").read_text())
    rows = report["rows"]
    assert len(rows) == len(gemm_shapes.MODELS) * 2 * 3
    for row in rows:
        assert row["seconds"] > 0 and row["tflops"] > 0
        assert 0 < row["predicted_share"] < 1.5
    # the roofline's share rises with the tokens per expert, model by model
    fc1 = [r["predicted_share"] for r in rows if r["model"] == "qwen3-30b-a3b" and r["proj"] == "fc1"]
    assert fc1 == sorted(fc1) and fc1[0] < fc1[-1]


def test_the_predicted_factor_is_the_cost_models():
    """bench/gemm_shapes.py restates gpu_terms.GpuTerms.gemm_shape_factor's formula: the two agree on every shape."""
    gpu = load_gpu("h200")
    job = job_for(load_model("qwen3-30b-a3b"), gpu, 8, 4096, Layout(precision="bf16"))
    rate = gemm_rate(gpu, "bf16", calibration())
    for m, k, n in ((128, 2048, 1536), (512, 7168, 4096), (8192, 2880, 2880)):
        ours = gemm_shapes.predicted_factor(m, k, n, rate, gpu.hbm_tbps * 1e12)
        assert 0 < ours < 1
        assert math.isclose(ours, job.terms.gemm_shape_factor(job, m, k, n, rate), rel_tol=1e-12)


def test_the_stored_check_renders_without_a_gpu():
    result = gpu_results.run()
    assert result["checks"], "bench/gpu_check_*.json holds the last check"
    lines = gpu_results.section(result)
    text = "\n".join(lines)
    check = result["checks"][0]
    for row in check["trainer"]["rows"]:
        assert f"| {row['layout']} | {row['status']} |" in text
    assert check["gemm"] and len([line for line in lines if line.startswith("| qwen3-30b-a3b | fc")]) == 14
