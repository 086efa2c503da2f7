"""The last single-GPU check's figures (scripts/gpu_check.sh on a lent GPU), as stored in bench/gpu_check_*.json and
bench/gemm_shapes_*.json: bench/run_all.py renders them into RESULTS.md without a GPU. A new check on a lent
machine replaces those files (its $OUT holds gemm_shapes.json, summary.json and the delta-net figures).

    .venv/bin/python bench/gpu_results.py        # prints the section
"""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def run() -> dict:
    checks = sorted(BENCH.glob("gpu_check_*.json"))
    if not checks:
        return {"checks": []}
    reports = []
    for path in checks:
        check = json.loads(path.read_text())
        shapes = BENCH.parent / check["gemm_shapes"] if check.get("gemm_shapes") else None
        check["gemm"] = json.loads(shapes.read_text()) if shapes and shapes.exists() else None
        reports.append(check)
    return {"checks": reports}


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _trainer_lines(trainer: dict) -> list[str]:
    lines = [f"Trainer: {trainer['model']} with {trainer['num_layers']} layers, seq {trainer['seq_len']}, mbs "
             f"{trainer['mbs']} gbs {trainer['gbs']}, built with {trainer['built_with']}.", "",
             "| layout | status | tokens/s measured | predicted | TF/s measured | predicted | peak GiB measured | "
             "predicted | activations/mb GiB measured | predicted |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in trainer["rows"]:
        m, p = r["measured"], r["predicted"]
        cells = [r["layout"], r["status"]]
        for key, digits in (("tokens_per_sec_per_gpu", 0), ("tflops_per_gpu", 1), ("peak_memory_gib", 2),
                            ("activations_per_microbatch_gib", 2)):
            cells += [_fmt(m[key], digits), _fmt(p[key], digits)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""] + [f"- {r['layout']}: {r['error']}" for r in trainer["rows"] if r.get("error")]


def _gemm_lines(gemm: dict) -> list[str]:
    lines = [f"Expert GEMMs (bench/gemm_shapes.py): the {gemm['square']}^3 BF16 GEMM ran at "
             f"{gemm['square_tflops']:.0f} TF/s (the model's BF16 rate {gemm['model_rate_tflops']:.0f}). "
             "Shares of that rate: measured from a CUDA graph (kernel alone), launched one by one (eager), and the "
             f"model's shape factor then (p = {gemm.get('sharpness', 1.0)}) over the square GEMM's. One small matmul "
             "(128-256 tokens, a 768-wide expert) leaves most SMs idle; a grouped GEMM over the rank's experts "
             "does not, so read the shape trend from 512 tokens up.", "",
             "| model | proj | tokens/expert | k | n | TF/s | measured | eager | predicted |",
             "|---|---|---|---|---|---|---|---|---|"]
    return lines + [f"| {r['model']} | {r['proj']} | {r['m']} | {r['k']} | {r['n']} | {r['tflops']:.0f} | "
                    f"{r['measured_share']:.2f} | {r['eager_share']:.2f} | {r['predicted_share']:.2f} |"
                    for r in gemm["rows"]]


def _delta_net_lines(delta: dict) -> list[str]:
    lines = [f"Gated delta-net kernel (bench/delta_net_kernel.py): {delta['note']}.", "",
             "| seq | heads/rank | fwd ms | fwd+bwd ms | predicted ms (parallel + state) | extra peak MiB "
             "| predicted |",
             "|---|---|---|---|---|---|---|"]
    return lines + [f"| {r['seq_len']} | {r['heads']} | {r['forward_ms']} | {r['forward_backward_ms']} | "
                    f"{r['predicted_ms']} ({r['predicted_parallel_ms']} + {r['predicted_state_ms']}) | "
                    f"{r['peak_extra_mib']} | {r['predicted_chunk_states_mib']} |" for r in delta["rows"]]


def section(result: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    if not result["checks"]:
        return ["No GPU check recorded yet (scripts/gpu_check.sh on a lent GPU)."]
    lines: list[str] = []
    for check in result["checks"]:
        lines += [f"**{check['date']}**, {check['machine']}; `{check['command']}`.", ""]
        lines += _trainer_lines(check["trainer"]) + [""]
        if check.get("gemm"):
            lines += _gemm_lines(check["gemm"]) + [""]
        if check.get("delta_net"):
            lines += _delta_net_lines(check["delta_net"]) + [""]
    return lines


if __name__ == "__main__":
    print("\n".join(section(run())))
