"""Validation by source: refit the cost model's constants without one publisher's rows (or one GPU's, one GPU
family's, one MoE model class's), then predict the rows left out.

The declared halves (search_spaces.calibration.reference.declared_halves) are held out from the fit but not from us:
every refit is judged on them. A fold here leaves a whole source out -- its 4K rows, its long-context rows -- refits on
every row of the others (both halves) with bench/fit_calibration.py's objective (its parameters, its knob pairs, its
long-context weight, then the delta-net state step), and predicts the source it never saw. What no kept row can move
is not taken from the packaged fit: a GPU family with no kept row gets the Calibration defaults for its fitted GEMM
rates, a software release with no kept row gets the attention release factor its kernels' published benchmarks give
(bench/fit_calibration.py's KERNEL_RELEASE_FACTOR, not its rows), and Blackwell Ultra's measured rate is re-measured
on the kept rows (1.0 when no pair of rows is left to measure it).

Start (`cold=False`, the default): the packaged constants (the fit's warm start), which were fitted on the declared
fit half of every source -- the left-out source's fit half included -- so a fold's constants begin where that half
pulled them; `cold=True` starts from the Calibration defaults instead (about ten times the evaluations).

Model classes (issue 57's leave-one-model-class-out): a MoE model's routed experts are *fine-grained* when each is
at most half the hidden size wide (moe_ffn_hidden_size <= FINE_GRAINED_WIDTH x hidden_size: Qwen3, Qwen3-Next,
DeepSeek-V3, Kimi-K2), *coarse* otherwise (gpt-oss-120b, 2880 wide at hidden 2880; Mixtral-class models); dense models
are neither, and stay in both class folds' fits. On the catalog's published rows the rule splits them as "at least
128 experts with top-k >= 8" would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.calibration.fit import Measurement, Parameter, fit, predict_tokens, predict_tokens_best_cp
from search_spaces.calibration.knob_pairs import load_knob_pairs
from search_spaces.calibration.reference import LONG_CONTEXT_MOE_SOURCE, ORIGINS

from bench.fit_calibration import (
    ASSUMED_LAYOUT_SERIES,
    KERNEL_RELEASE_FACTOR,
    PARAMETERS,  # noqa: F401 (the full vector, read from here by tests/bench)
    PRODUCT,
    STATE_STEP,
    Variant,
    extra_loss,
    start,
    ultra_ratio,
    with_pins,
)

# per-family constants the fit moves: reset to the defaults for a family no kept row measures
FAMILY_FITTED = ("gemm_efficiency", "grouped_gemm_efficiency")
GPUS = ("h100", "b200", "gb200", "b300", "gb300")
# a routed expert at most this share of the hidden size wide is fine-grained (see the module docstring)
FINE_GRAINED_WIDTH = 0.5
MODEL_CLASS_RULE = (f"fine-grained: routed experts at most {FINE_GRAINED_WIDTH:g} x the hidden size wide "
                    "(moe_ffn_hidden_size / hidden_size); coarse: wider experts; dense models in neither, kept in "
                    "both fits")


@dataclass(frozen=True)
class Fold:
    """One refit: the rows it leaves out are predicted by constants fitted on the rest."""
    kind: str
    """What is left out: "source", "gpu", "family" or "class" (a model class, `model_class`)."""
    name: str
    """The source (reference.ORIGINS), GPU, GPU family or model class left out."""
    leaves_out: Callable[[Measurement], bool]
    """Whether a row belongs to what is left out."""


def folds() -> list[Fold]:
    """Each source, each GPU, each GPU family, each MoE model class left out in turn (Hopper has one GPU: its family
    fold is H100's)."""
    return ([Fold("source", o, _from_origin(o)) for o in ORIGINS]
            + [Fold("gpu", g, _on_gpu(g)) for g in GPUS]
            + [Fold("family", "blackwell", lambda m: m.family == "blackwell")]
            + [Fold("class", c, _of_class(c)) for c in ("fine-grained", "coarse")])


def model_class(m: Measurement) -> str:
    """The row's model class, "dense", "fine-grained" or "coarse" (MODEL_CLASS_RULE)."""
    spec = m.spec()
    if not spec.num_experts:
        return "dense"
    return "fine-grained" if spec.moe_ffn_hidden_size <= FINE_GRAINED_WIDTH * spec.hidden_size else "coarse"


def _of_class(name: str) -> Callable[[Measurement], bool]:
    return lambda m: model_class(m) == name


def _from_origin(origin: str) -> Callable[[Measurement], bool]:
    return lambda m: m.origin == origin


def _on_gpu(gpu: str) -> Callable[[Measurement], bool]:
    return lambda m: m.gpu == gpu


def _moved_by(p: Parameter, kept: list[Measurement]) -> bool:
    """Whether any kept row moves `p` (a family's GEMM rate needs that family's rows; a release factor its rows)."""
    if p.constant in FAMILY_FITTED:
        return p.family in {m.family for m in kept}
    if p.constant == "attention_release_factor":
        return p.family in {m.release for m in kept}
    return True


def fold_start(kept: list[Measurement], cold: bool, variant: Variant = PRODUCT) -> Calibration:
    """The fit's start without what the kept rows cannot know (see the module docstring); a table-pinned
    variant's kernel-table terms stay (no row set them)."""
    base = start(refit=not cold, variant=variant)
    defaults = Calibration()
    families = {m.family for m in kept}
    update: dict = {}
    for key in FAMILY_FITTED:
        table = dict(getattr(base, key))
        for fam in ("hopper", "blackwell"):
            if fam not in families:
                table[fam] = getattr(defaults, key)[fam]
        update[key] = table
    releases = {m.release for m in kept}
    update["attention_release_factor"] = {r: v if r in releases else KERNEL_RELEASE_FACTOR[r]
                                          for r, v in base.attention_release_factor.items()}
    ratio, pairs = ultra_ratio([m for m in kept if m.source != LONG_CONTEXT_MOE_SOURCE])
    update["sustained_rate"] = {gpu: round(ratio, 3) if pairs else 1.0 for gpu in base.sustained_rate}
    if not any(m.release in ASSUMED_LAYOUT_SERIES for m in kept):
        update["delta_net_state_step_s"] = defaults.delta_net_state_step_s
    return with_pins(base.model_copy(update=update), variant)


def refit(kept: list[Measurement], long_kept: list[Measurement], cold: bool = False,
          max_evals: int = 2500, variant: Variant = PRODUCT) -> tuple[Calibration, dict]:
    """bench/fit_calibration.py's fit of `variant` on `kept` (published rows) and `long_kept` (long-context MoE
    rows), with only the parameters those rows move; returns the constants and the fit's summary."""
    pairs = [p for p in load_knob_pairs() if p.half == "fit"]
    params = [p for p in variant.parameters if _moved_by(p, kept)]
    long_fitted = [m for m in long_kept if m.release not in ASSUMED_LAYOUT_SERIES]
    cal, summary = fit(kept, params, fold_start(kept + long_kept, cold, variant), max_evals=max_evals,
                       extra_loss=extra_loss(pairs, long_fitted))
    state_rows = [m for m in long_kept if m.release in ASSUMED_LAYOUT_SERIES]
    if state_rows:
        cal, _ = fit(state_rows, [STATE_STEP], cal)
    return cal, summary


def predict(m: Measurement, cal: Calibration) -> float | None:
    """Signed relative error of a row's predicted tokens/s (long-context rows at their best CP type)."""
    pred = predict_tokens_best_cp(m, cal)[0] if m.source == LONG_CONTEXT_MOE_SOURCE else predict_tokens(m, cal)
    return pred / m.tokens() - 1 if pred else None


def run_fold(fold: Fold, rows: list[Measurement], long_rows: list[Measurement], cold: bool = False,
             max_evals: int = 2500, variant: Variant = PRODUCT) -> dict:
    """Refit (`variant`'s constants) without the fold's rows; each left-out row's error, the refit's CPU seconds
    and evaluations."""
    t0 = time.process_time()
    cal, summary = refit([m for m in rows if not fold.leaves_out(m)],
                         [m for m in long_rows if not fold.leaves_out(m)], cold=cold, max_evals=max_evals,
                         variant=variant)
    cpu_s = time.process_time() - t0
    out = [(m, predict(m, cal)) for m in rows + long_rows if fold.leaves_out(m)]
    return {"kind": fold.kind, "name": fold.name, "errors": [(m, e) for m, e in out if e is not None],
            "refused": sum(e is None for _, e in out), "refit_cpu_s": round(cpu_s, 1),
            "evaluations": summary["evaluations"], "fitted": len(summary["fitted"])}
