"""Fit the cost model's constants on the declared fit half of the published rows; writes search_spaces/calibration.json.

    .venv/bin/python bench/fit_calibration.py [--dry-run]

Rows: search_spaces.reference.published_rows() (Megatron-Bridge summary and skill card, moe_4k_more, the NeMo
long-sequence CP rows), split by `declared_halves`: every other row of each source (every other length of each
long-sequence series). Only the fit half is seen here; bench/estimator_accuracy.py scores the other half.
Objective: mean |log(predicted / published)| tokens/s (= TF/s), bounded Nelder-Mead in log space
(search_spaces.calibration.fit), started from the Calibration defaults. Fitted (`PARAMETERS`): the shared constants
(EP exposure, element-wise and routed passes, fp8 cast bytes, launch overhead per MoE and per dense layer), the
GEMM and grouped-GEMM efficiency per GPU family, the gated delta-net kernels' efficiency, and one attention
release factor per NeMo container of the long-sequence rows (they ran older attention kernels than today's:
24.03 for Llama2-7B on H100, 25.04 for Llama3-8B on B200). The attention efficiencies themselves are today's
published kernel rates (FlashAttention-3 on H100, FlashAttention-4 on B200; throughput.py), not fitted. MEASURED, not fitted: Blackwell
Ultra's rate over Blackwell (`sustained_rate`, from rows equal in all but the chip). NOT fitted: bandwidths, the
CP, PP and attention-shape terms (physics: they carry the extrapolation to long contexts).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from search_spaces.calibration import SHARED_PARAMETERS, Parameter, errors, fit, mape  # noqa: E402
from search_spaces.calibration_file import CALIBRATION_PATH, Calibration, calibration  # noqa: E402
from search_spaces.reference import declared_halves, published_rows  # noqa: E402

# the long-sequence rows ran older software than today's attention kernels (the calibration's efficiencies)
OLD_RELEASES = ("nemo-24.03.01", "nemo-25.04.rc2")
PARAMETERS = SHARED_PARAMETERS + [
    Parameter("gemm_efficiency", "hopper", 0.2, 0.95, every_precision=True),
    Parameter("grouped_gemm_efficiency", "hopper", 0.1, 1.0),
    Parameter("gemm_efficiency", "blackwell", 0.2, 0.95, every_precision=True),
    Parameter("grouped_gemm_efficiency", "blackwell", 0.1, 1.0),
] + [Parameter("attention_release_factor", release, 0.2, 1.5) for release in OLD_RELEASES]
ULTRA = {"b300": "b200", "gb300": "gb200"}  # Blackwell Ultra chip -> the Blackwell chip with the same peaks
STORED = ("gemm_efficiency", "grouped_gemm_efficiency", "attention_fwd_efficiency", "attention_bwd_efficiency",
          "attention_release_factor", "ep_exposed", "elementwise_passes", "routed_passes", "fp8_cast_bytes",
          "launch_overhead_s", "dense_launch_overhead_s", "linear_attention_efficiency", "sustained_rate", "cpu_overhead_per_layer_s",
          "cpu_collective_latency_s", "cpu_process_baseline_gib")


def ultra_ratio(rows) -> tuple[float, int]:
    """Geometric mean of published TF/s, Ultra over non-Ultra, for rows equal in all but the chip: same model,
    GPU count, length, parallel mapping, batch, precision and source (release)."""
    def mapping(r):  # what the published table states (recompute/graphs/dispatcher are partly inferred)
        L = r.layout
        return (L.tp, L.cp, L.ep, L.pp, L.vpp, L.mbs, L.gbs, L.precision)

    by_key = {(r.model, r.gpu, r.num_gpus, r.seq_len, mapping(r), r.source): r for r in rows}
    logs = [math.log(r.tflops() / twin.tflops())
            for (model, gpu, n, seq, lay, src), r in by_key.items() if gpu in ULTRA
            for twin in [by_key.get((model, ULTRA[gpu], n, seq, lay, src))] if twin]
    return (math.exp(sum(logs) / len(logs)), len(logs)) if logs else (1.0, 0)


def start() -> Calibration:
    """The Calibration defaults with the cpu constants kept from the packaged file (bench/cpu_calibration.py fits
    them)."""
    base = Calibration().model_dump()
    packaged = calibration().model_dump()
    for key, value in packaged.items():
        if key.startswith("cpu_"):
            base[key] = value
        elif isinstance(value, dict) and "cpu" in value:
            base[key]["cpu"] = value["cpu"]
    ratio, _ = ultra_ratio(published_rows())  # a measurement, taken on every row (it is not fitted to the model)
    base["sustained_rate"] = {gpu: round(ratio, 3) for gpu in ULTRA}
    base["attention_release_factor"] = {release: 0.75 for release in OLD_RELEASES}
    return Calibration.model_validate(base)


def rounded(v):
    return {k: rounded(x) for k, x in v.items()} if isinstance(v, dict) else float(f"{v:.4g}")


def report(cal: Calibration, rows, name: str) -> dict:
    short = [r for r in rows if r.seq_len <= 8192]
    long = [r for r in rows if r.seq_len >= 16384]
    out = {"<=8K": mape(errors(short, cal)), ">=16K": mape(errors(long, cal)), "n": (len(short), len(long))}
    print(name, json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="fit and report, do not write calibration.json")
    parser.add_argument("--max-evals", type=int, default=2500)
    args = parser.parse_args()
    fit_rows, held = declared_halves(published_rows())
    cal, summary = fit(fit_rows, PARAMETERS, start(), max_evals=args.max_evals)
    print(f"loss {summary['loss_before']:.4f} -> {summary['loss_after']:.4f} after {summary['evaluations']} "
          "evaluations", flush=True)
    report(cal, fit_rows, "fitted half")
    report(cal, held, "held-out half")
    constants = cal.model_dump()
    keep = rounded({k: constants[k] for k in STORED})
    print(json.dumps(keep))
    if not args.dry_run:
        CALIBRATION_PATH.write_text(json.dumps(keep, indent=2) + "\n")
        print("wrote", CALIBRATION_PATH)


if __name__ == "__main__":
    main()
