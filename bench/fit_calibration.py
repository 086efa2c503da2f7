"""Fit the cost model's constants on the declared fit half of the published rows; writes
search_spaces/calibration/calibration.json.

    .venv/bin/python bench/fit_calibration.py [--dry-run]

Rows: search_spaces.calibration.reference.published_rows() (Megatron-Bridge summary and skill card, moe_4k_more, the
NeMo long-sequence CP rows), split by `declared_halves`: every other row of each source (every other length of each
long-sequence series). Only the fit half is seen here; bench/estimator_accuracy.py scores the other half.
Objective: mean |log(predicted / published)| tokens/s (= TF/s), bounded Nelder-Mead in log space
(search_spaces.calibration.fit.fit), started from the packaged constants (`--from-defaults`: the Calibration defaults),
plus the same over the fit half of the long-context MoE rows (moe_long_context.csv, each at its best CP type,
weighted LONG_WEIGHT) and, weighted PAIR_WEIGHT, the mean |log(predicted / published)| B/A ratio of the fit half of
the knob pairs (knob_effects.csv): the absolute rows alone do not say how much a knob moves; then, alone, the
delta-net state pass's chunk step on the fit half of the Qwen3-Next rows (STATE_STEP). Fitted (`PARAMETERS`;
`--shared-only`: SHARED_PARAMETERS alone): the shared constants (EP exposure, element-wise and routed passes, the
host's time per kernel launch, the MoE layer's sync, MXFP8's GEMM rate), the
GEMM efficiency per GPU family (Hopper's FP8 apart from its BF16, each at most DENSE_GEMM_CEILING) and grouped-GEMM
efficiency per family, the gated delta-net kernels' efficiency, and one attention
release factor per NeMo container of the long-sequence rows (they ran older attention kernels than today's:
24.03 for Llama2-7B on H100, 25.04 for Llama3-8B on B200). The attention efficiencies themselves are today's
published kernel rates (FlashAttention-3 on H100, FlashAttention-4 on B200; throughput.py), not fitted. MEASURED, not
fitted: Blackwell Ultra's rate over Blackwell (`sustained_rate`, from rows equal in all but the chip). NOT fitted:
bandwidths, the CP, PP and attention-shape terms (physics: they carry the extrapolation to long contexts).

Variants (`--variant`, issue 57 item 2): `all-fitted` moves every constant above; `table-pinned` reads Hopper's
three GEMM terms from their own kernels' tables (search_spaces/calibration/kernel_pins.py) and fits the rest
(PINNED_PARAMETERS). PRODUCT is the one calibration.json is fitted with; bench/estimator_accuracy.py prints both.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from search_spaces.calibration.calibration_file import CALIBRATION_PATH, Calibration, calibration
from search_spaces.calibration.fit import SHARED_PARAMETERS, Parameter, errors, fit, mape, predict_tokens_best_cp
from search_spaces.calibration.kernel_pins import PINNED_NAMES, pinned
from search_spaces.calibration.knob_pairs import load_knob_pairs, predicted_ratio
from search_spaces.calibration.reference import (
    declared_halves,
    long_context_moe_rows,
    published_rows,
    summary_rows_every_release,
)
from search_spaces.catalog.maturity import measure_maturity

# the long-sequence rows ran older software than today's attention kernels (the calibration's efficiencies)
OLD_RELEASES = ("nemo-24.03.01", "nemo-25.04.rc2")
# Each old release's attention rate as a share of the model's (today's kernels), from its kernels' own published
# benchmarks, not from the rows that ran them: where the fit starts, and what a fold that leaves every row of a
# release out uses (bench/leave_one_out.py). Time-weighted over forward + 2.5 x backward against the model's rates.
KERNEL_RELEASE_FACTOR = {
    # H100, NeMo 24.03.01 (TE 1.3): FlashAttention-2 -- NeMo-Framework-Launcher 24.03.01 (5c7e280a)
    # launcher_scripts/conf/config.yaml sets NVTE_FUSED_ATTN: 0 ("Disable cudnn FA until we've tested it more"), so
    # TE 1.3 falls back from cuDNN to flash-attn 2. FA2 on H100, head dim 128, 16K (Shah et al. 2024, arXiv
    # 2407.08608 Fig. 5c/6b): 370 TF/s forward, 322 backward, against the model's 742 / 524: 0.584.
    "nemo-24.03.01": 0.584,
    # B200, NeMo 25.04 (TE 2.2-dev, cuDNN 9.7 fused attention, NVTE_FUSED_ATTN=1): no published cuDNN 9.7 rate; cuDNN
    # 9.10.2 on B200 (NVIDIA/cudnn-frontend @f937055 benchmark/sdpa_benchmark_bf16_training, causal, head dim 128):
    # 1211/945 TF/s at 8K ... 1349/1038 at 128K forward/backward, 0.76-0.85 of the model's rates, mean 0.81 -- an
    # upper bound for the older cuDNN (the fit on the rows themselves gives 0.65).
    "nemo-25.04.rc2": 0.81,
}
# no dense GEMM keeps more of its tensor-core peak than this (cuBLAS's largest BF16 shapes reach about 80% on H100
# and B200; assumed ceiling): a fit pressing against it says another term of those rows is off, not the GEMM
DENSE_GEMM_CEILING = 0.80
PARAMETERS = SHARED_PARAMETERS + [
    # Hopper's FP8 GEMMs keep a smaller share of their doubled peak than BF16's of theirs (twice the operand
    # traffic per tensor-core FLOP, the scaling epilogue): their own efficiency. Blackwell's FP8 rows are MXFP8,
    # whose rate beside BF16's is `mxfp8_gemm_factor`: one efficiency there.
    Parameter("gemm_efficiency", "hopper", 0.2, DENSE_GEMM_CEILING, precision="bf16"),
    Parameter("gemm_efficiency", "hopper", 0.2, DENSE_GEMM_CEILING, precision="fp8"),
    Parameter("grouped_gemm_efficiency", "hopper", 0.1, 1.0),
    Parameter("gemm_efficiency", "blackwell", 0.2, DENSE_GEMM_CEILING, every_precision=True),
    Parameter("grouped_gemm_efficiency", "blackwell", 0.1, 1.0),
] + [Parameter("attention_release_factor", release, 0.2, 1.5) for release in OLD_RELEASES]
# Hopper's GEMM terms read from the kernel tables (search_spaces/calibration/kernel_pins.py) instead: the rest
PINNED_PARAMETERS = [p for p in PARAMETERS if p.name not in PINNED_NAMES]


@dataclass(frozen=True)
class Variant:
    """Which constants the end-to-end fit moves: all of PARAMETERS, or those the kernel tables leave open (the
    tables' terms then set in the start, before the fit and in every fold of bench/leave_one_out.py)."""
    key: str
    title: str
    parameters: tuple[Parameter, ...]
    pins_from_tables: bool

    def fitted_constants(self) -> list[Parameter]:
        """Every constant fitted to end-to-end rows: the parameter vector, then STATE_STEP alone."""
        return [*self.parameters, STATE_STEP]


ALL_FITTED = Variant("all-fitted", "every GEMM term fitted to the rows", tuple(PARAMETERS), False)
TABLE_PINNED = Variant("table-pinned", "Hopper GEMM terms from the kernel tables", tuple(PINNED_PARAMETERS), True)
VARIANTS = {v.key: v for v in (ALL_FITTED, TABLE_PINNED)}
# the variant the packaged calibration.json is fitted with (the other: bench/estimator_accuracy.py's comparison)
PRODUCT = ALL_FITTED
ULTRA = {"b300": "b200", "gb300": "gb200"}  # Blackwell Ultra chip -> the Blackwell chip with the same peaks
STORED = ("gemm_efficiency", "grouped_gemm_efficiency", "attention_fwd_efficiency", "attention_bwd_efficiency",
          "attention_release_factor", "ep_exposed", "ep_serial_exposed", "elementwise_passes", "routed_passes",
          "host_kernel_launch_s",
          "moe_sync_s", "mxfp8_gemm_factor", "linear_attention_efficiency", "delta_net_state_step_s", "sustained_rate",
          "cpu_overhead_per_layer_s", "cpu_collective_latency_s", "cpu_process_baseline_gib", "software",
          "software_maturity")
# the software the published rows ran: Megatron-Bridge's performance-summary containers (their versions are not
# published beside the rows), NeMo's for the long-sequence rows
PUBLISHED_STACK = {"container": "NeMo 25.09-26.08 (Megatron-Bridge performance summary), NeMo 24.03.01 / 25.04 "
                                "(long-sequence rows), Megatron-MoE-ModelZoo and skill-card runs"}
# the knob pairs' ratio error weighs this much beside the rows' (a ratio error is smaller than a level error)
PAIR_WEIGHT = 0.6
# the long-context rows weigh this much beside the rows; series whose layout is mostly assumed (the card prints only
# CP, GPUs, precision and dispatcher for Qwen3-Next) are scored but not fitted
LONG_WEIGHT = 0.15
ASSUMED_LAYOUT_SERIES = ("qwen3-next-gb200",)
# ...except for the one constant those rows alone measure: the delta-net state pass's chunk step, moved by their CP
# (1, 4, 16) and length, not by the assumed rest of the layout -- fitted on their fit half after the rest
STATE_STEP = Parameter("delta_net_state_step_s", None, 5e-7, 3e-5)


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


def start(refit: bool = True, variant: Variant = PRODUCT) -> Calibration:
    """The packaged calibration (a refit starts where the last fit ended; `refit=False`: the Calibration defaults),
    with the cpu constants kept from the packaged file (bench/cpu_calibration.py fits them) and, for a
    table-pinned variant, the kernel tables' terms."""
    packaged = calibration().model_dump()
    base = dict(packaged) if refit else Calibration().model_dump()
    for key, value in packaged.items():
        if key.startswith("cpu_"):
            base[key] = value
        elif isinstance(value, dict) and "cpu" in value:
            base[key]["cpu"] = value["cpu"]
    ratio, _ = ultra_ratio(published_rows())  # a measurement, taken on every row (it is not fitted to the model)
    base["sustained_rate"] = {gpu: round(ratio, 3) for gpu in ULTRA}
    # measured too: each older release's tokens/s over the newest's, same configuration
    # (search_spaces/catalog/maturity.py)
    base["software_maturity"] = {gpu: {release: v["factor"] for release, v in table.items()}
                                 for gpu, table in measure_maturity(summary_rows_every_release()).items()}
    if not refit or not all(r in base["attention_release_factor"] for r in OLD_RELEASES):
        base["attention_release_factor"] = dict(KERNEL_RELEASE_FACTOR)
    base["software"] = PUBLISHED_STACK
    return with_pins(Calibration.model_validate(base), variant)


def with_pins(cal: Calibration, variant: Variant) -> Calibration:
    """`cal` with the kernel tables' terms when the variant pins them."""
    return pinned(cal)[0] if variant.pins_from_tables else cal


def extra_loss(pairs, long_rows):
    """The fit-half knob pairs' mean |log ratio error| x PAIR_WEIGHT plus the long-context rows' mean |log error|
    at their best CP type x LONG_WEIGHT (a refused layout costs as much as a 10x miss)."""
    def loss(cal: Calibration) -> float:
        total = 0.0
        if pairs:
            errs = [abs(math.log(r / p.ratio)) if r else math.log(10) for p in pairs
                    for r in [predicted_ratio(p, cal)]]
            total += PAIR_WEIGHT * sum(errs) / len(errs)
        if long_rows:
            errs = [abs(math.log(t / m.tokens())) if t else math.log(10) for m in long_rows
                    for t in [predict_tokens_best_cp(m, cal)[0]]]
            total += LONG_WEIGHT * sum(errs) / len(errs)
        return total
    return loss


def rounded(v):
    return {k: rounded(x) for k, x in v.items()} if isinstance(v, dict) else float(f"{v:.4g}")


def fit_state_step(cal: Calibration) -> tuple[Calibration, dict]:
    """`cal` with STATE_STEP fitted on the fit half of the Qwen3-Next rows (the rest kept), and the fit's summary."""
    rows = [m for m in declared_halves(long_context_moe_rows())[0] if m.release in ASSUMED_LAYOUT_SERIES]
    return fit(rows, [STATE_STEP], cal)


def report(cal: Calibration, rows, name: str) -> dict:
    short = [r for r in rows if r.seq_len <= 8192]
    long = [r for r in rows if r.seq_len >= 16384]
    out = {"<=8K": mape(errors(short, cal)), ">=16K": mape(errors(long, cal)), "n": (len(short), len(long))}
    print(name, json.dumps(out), flush=True)
    return out


def fit_variant(variant: Variant, from_defaults: bool = False, max_evals: int = 2500, rows_only: bool = False,
                shared_only: bool = False, verbose: bool = True) -> Calibration:
    """The variant's constants fitted on the declared fit half (the objective of the module docstring), then the
    delta-net state step: what `main` writes, and what bench/estimator_accuracy.py compares."""
    fit_rows = declared_halves(published_rows())[0]
    pairs = [p for p in load_knob_pairs() if p.half == "fit"]
    long_fit = [m for m in declared_halves(long_context_moe_rows())[0] if m.release not in ASSUMED_LAYOUT_SERIES]
    params = SHARED_PARAMETERS if shared_only else list(variant.parameters)
    cal, summary = fit(fit_rows, params, start(refit=not from_defaults, variant=variant), max_evals=max_evals,
                       extra_loss=None if rows_only else extra_loss(pairs, long_fit))
    cal, step = fit_state_step(cal)
    if verbose:
        print(f"{variant.key}: loss {summary['loss_before']:.4f} -> {summary['loss_after']:.4f} after "
              f"{summary['evaluations']} evaluations; delta_net_state_step_s {cal.delta_net_state_step_s:.3g} "
              f"(Qwen3-Next fit half: loss {step['loss_before']:.4f} -> {step['loss_after']:.4f})", flush=True)
    return cal


def stored(cal: Calibration) -> dict:
    """What calibration.json keeps of `cal` (STORED, rounded to 4 significant figures)."""
    constants = cal.model_dump()
    return {k: constants[k] if k == "software" else rounded(constants[k]) for k in STORED}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="fit and report, do not write calibration.json")
    parser.add_argument("--max-evals", type=int, default=2500)
    parser.add_argument("--rows-only", action="store_true", help="fit on the published rows alone (no pairs, no "
                        "long-context rows): to see what the extra objectives cost the rows")
    parser.add_argument("--shared-only", action="store_true", help="fit the shared constants alone (the host, sync, "
                        "MXFP8, EP and pass constants), the per-family rates kept from the start")
    parser.add_argument("--from-defaults", action="store_true", help="start from the Calibration defaults, not the "
                        "packaged constants")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default=PRODUCT.key,
                        help=f"which constants the rows fit (default: the product's, {PRODUCT.key})")
    parser.add_argument("--out", type=Path, default=CALIBRATION_PATH,
                        help="where to write (default: the packaged file)")
    args = parser.parse_args()
    cal = fit_variant(VARIANTS[args.variant], args.from_defaults, args.max_evals, args.rows_only, args.shared_only)
    fit_rows, held = declared_halves(published_rows())
    report(cal, fit_rows, "fitted half")
    report(cal, held, "held-out half")
    keep = stored(cal)
    print(json.dumps(keep))
    if not args.dry_run:
        args.out.write_text(json.dumps(keep, indent=2) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
