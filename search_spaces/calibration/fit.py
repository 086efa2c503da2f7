"""Calibrations as data: measurements in, the cost model's constants out.

A `Measurement` is one measured (model, GPU, GPUs, length, Layout) -> tokens/s/GPU (or TF/s) and peak memory:
a published row (search_spaces.calibration.reference reads them), a measured sweep trial
(orchestrator/outputs/calibrate.py
reads Optuna and MLflow), or a replay-table row. `fit()` finds the values of the `Parameter`s it is given (a family's
constants, `FAMILY_PARAMETERS`, or the shared ones) that minimise the mean |log(predicted / measured)| tokens/s
over the measurements, within physical bounds, with a bounded Nelder-Mead in log space (scipy.optimize). The
constants are a typed `Calibration` and their file a `CalibrationDocument` (search_spaces.calibration.calibration_file);
`estimate`, `space` and the sweep's prior take a calibration as `cal`. The cost model never reads a store: the
calibration is handed in.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from search_spaces.calibration.calibration_file import (
    Calibration,
    CalibrationDocument,
    calibration,
    calibration_document,
    calibration_text,
    load_calibration,
    merge,
    write_calibration,
)
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import ModelSpec, load_model
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.flops import flops_per_token
from search_spaces.cost.throughput import step_time
from search_spaces.errors import MoeAutotuneError
from search_spaces.layouts.layout import Layout
from search_spaces.layouts.rules import check

# the calibration's file API lives in calibration_file; the fit's callers find it here too
__all__ = ["Calibration", "CalibrationDocument", "Measurement", "Parameter", "FAMILY_PARAMETERS",
           "SHARED_PARAMETERS", "calibration", "calibration_document", "calibration_text", "cp_variants", "errors",
           "fit", "for_release",
           "load_calibration", "log_loss", "mape", "measurement_problems", "model_spec", "nelder_mead",
           "parameters_for", "predict_peak_gib", "predict_tokens", "predict_tokens_best_cp", "usable", "with_values",
           "write_calibration"]


@dataclass(frozen=True)
class Parameter:
    """One constant a fit moves, within physical bounds."""
    constant: str
    """A field of `Calibration`."""
    family: str | None
    """The entry of the constant's table that moves: a family's (or a GPU's, a release's for
    attention_release_factor, a host CPU's for host_kernel_launch_s); None for a constant that is one number."""
    lower: float
    """The smallest value the fit may give it."""
    upper: float
    """The largest value the fit may give it."""
    every_precision: bool = False
    """The entry is a table of precision classes (gemm_efficiency), all moved together: the first class (BF16)
    takes the value and the others keep their ratio to it (a sweep that measured one precision rescales the
    family without losing what the packaged fit knows of the other)."""
    precision: str | None = None
    """The one precision class of such a table that moves (gemm_efficiency.hopper.fp8); None: see every_precision."""

    @property
    def name(self) -> str:
        """How a calibration file's `fitted` list names it: constant.family[.precision], or the constant alone."""
        return ".".join(part for part in (self.constant, self.family, self.precision) if part)

    def value(self, cal: Calibration) -> float:
        node: Any = getattr(cal, self.constant)
        if self.family is not None:
            node = node[self.family]
        if self.precision is not None:
            node = node[self.precision]
        return float(next(iter(node.values())) if isinstance(node, dict) else node)

    def constants(self, cal: Calibration, value: float) -> dict[str, Any]:
        """The constants that give it `value` in `cal` (to lay over it; tables merge entry by entry)."""
        if self.family is None:
            return {self.constant: value}
        if self.precision is not None:
            return {self.constant: {self.family: {self.precision: value}}}
        if self.every_precision:  # the first class takes `value`, the others keep their ratio to it
            classes = dict(getattr(cal, self.constant).get(self.family) or {}) or {"bf16": value}
            first = next(iter(classes.values()))
            return {self.constant: {self.family: {k: value * v / first for k, v in classes.items()}}}
        return {self.constant: {self.family: value}}


def _family(name: str, gemm: tuple[float, float], grouped: bool, attention_fwd: tuple[float, float],
            attention_bwd: tuple[float, float] | None) -> list[Parameter]:
    out = [Parameter("gemm_efficiency", name, *gemm, every_precision=True)]
    if grouped:
        out.append(Parameter("grouped_gemm_efficiency", name, 0.1, 1.0))
    out.append(Parameter("attention_fwd_efficiency", name, *attention_fwd))
    if attention_bwd:
        out.append(Parameter("attention_bwd_efficiency", name, *attention_bwd))
    return out


# constants fitted per GPU family
FAMILY_PARAMETERS: dict[str, list[Parameter]] = {
    "hopper": _family("hopper", (0.2, 0.95), True, (0.15, 0.9), (0.1, 0.9)),
    "blackwell": _family("blackwell", (0.2, 0.95), True, (0.15, 0.9), (0.1, 0.9)),
    "cpu": _family("cpu", (0.01, 1.0), False, (0.002, 1.0), None)
    + [Parameter("cpu_overhead_per_layer_s", None, 1e-4, 0.5), Parameter("cpu_collective_latency_s", None, 1e-5, 0.1)],
}
# constants shared by the GPU families (fitted by bench/fit_calibration.py on the published rows only)
SHARED_PARAMETERS: list[Parameter] = [
    Parameter("ep_exposed", None, 0.02, 1.0), Parameter("ep_serial_exposed", None, 0.3, 1.0),
    Parameter("elementwise_passes", None, 1.0, 30.0),
    Parameter("routed_passes", None, 0.1, 30.0), Parameter("host_kernel_launch_s", "x86", 1e-6, 1e-4),
    Parameter("host_kernel_launch_s", "grace", 1e-6, 1e-4), Parameter("moe_sync_s", None, 1e-6, 1e-3),
    Parameter("mxfp8_gemm_factor", None, 0.8, 1.05), Parameter("linear_attention_efficiency", None, 0.05, 0.6)]
# Nelder-Mead: stop when the simplex's losses differ by less than this, or after this many evaluations
FIT_TOLERANCE = 1e-4
FIT_MAX_EVALUATIONS = 1500
FIT_RESTARTS = 3


def model_spec(name: str) -> ModelSpec:
    """A catalog model; `deepseek-v3-no-mtp` is DeepSeek-V3 without its MTP layer (published as such)."""
    if name == "deepseek-v3-no-mtp":
        return dataclasses.replace(load_model("deepseek-v3"), name=name, mtp_layers=0)
    return load_model(name)


@dataclass(frozen=True)
class Measurement:
    """One measured layout. tokens/s/GPU is the quantity fitted (TF/s rows are converted with Bridge's FLOPs)."""
    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    layout: Layout
    tflops_per_gpu: float | None = None
    tokens_per_sec_per_gpu: float | None = None
    peak_memory_gib: float | None = None
    source: str = ""
    num_layers: int | None = None  # proxy models (a sweep's model_overrides)
    hidden_size: int | None = None
    release: str = ""  # the software it ran (a key of the calibration's attention_release_factor, if older)
    software: tuple[tuple[str, str], ...] = ()  # (package, version) of the run, as the trainer reports them
    origin: str = ""  # who published it (reference.ORIGINS): the source a leave-one-source-out fold leaves out

    def spec(self) -> ModelSpec:
        spec = model_spec(self.model)
        return spec.with_overrides(num_layers=self.num_layers, hidden_size=self.hidden_size)

    @property
    def family(self) -> str:
        return load_gpu(self.gpu).family

    def tokens(self) -> float:
        """Measured tokens/s/GPU."""
        if self.tokens_per_sec_per_gpu:
            return float(self.tokens_per_sec_per_gpu)
        if self.tflops_per_gpu is None:  # a measurement reports one of the two
            raise ValueError(f"a {self.model} measurement ({self.source}) has neither tokens/s nor TF/s per GPU")
        return float(self.tflops_per_gpu) * 1e12 / flops_per_token(self.spec(), self.seq_len)

    def tflops(self) -> float:
        """Measured TF/s/GPU in Bridge's count."""
        if self.tflops_per_gpu:
            return float(self.tflops_per_gpu)
        return self.tokens() * flops_per_token(self.spec(), self.seq_len) / 1e12

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["layout"] = self.layout.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Measurement":
        software = tuple(tuple(pair) for pair in data.get("software", ()))
        return cls(**{**data, "layout": Layout.from_dict(data["layout"]), "software": software})


# ---- measurements that cannot be true -------------------------------------------------------------------------
def measurement_problems(m: Measurement) -> list[str]:
    """Why a measurement cannot be true (the bounds of search_spaces.validation: finite, positive, within the
    GPU's peak and capacity); empty when it can. Nothing that fails here feeds a calibration."""
    from search_spaces.result import TrialResult
    from search_spaces.validation import problems

    claimed = {k: getattr(m, k) for k in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "peak_memory_gib")
               if getattr(m, k) is not None}
    if not (claimed.get("tokens_per_sec_per_gpu") or claimed.get("tflops_per_gpu")):
        return ["neither tokens/s nor TF/s was measured"]
    try:
        gpu, model = load_gpu(m.gpu), m.spec()
    except (MoeAutotuneError, OSError, ValueError) as exc:
        return [str(exc).splitlines()[0] if str(exc) else type(exc).__name__]
    return problems(TrialResult(status="ok", **claimed), m.layout, gpu, model=model, seq_len=m.seq_len,
                    num_gpus=m.num_gpus)


def usable(measurements: Iterable[Measurement]) -> tuple[list[Measurement], list[str]]:
    """(the measurements that can be true, "source: reason" of each that cannot)."""
    kept, skipped = [], []
    for m in measurements:
        reasons = measurement_problems(m)
        if reasons:
            skipped.append(f"{m.source or m.model}: {'; '.join(reasons)}")
        else:
            kept.append(m)
    return kept, skipped


# ---- predictions and errors -----------------------------------------------------------------------------------
def predict_tokens(m: Measurement, cal: Calibration) -> float | None:
    """Predicted tokens/s/GPU of a measurement's layout under `cal`; None when the layout breaks a rule."""
    spec, gpu = m.spec(), load_gpu(m.gpu)
    if check(spec, gpu, m.num_gpus, m.seq_len, m.layout):
        return None
    step = step_time(spec, gpu, m.num_gpus, m.seq_len, m.layout, for_release(cal, m.release)).step
    return m.layout.gbs * m.seq_len / step / m.num_gpus


def cp_variants(layout: Layout) -> list[Layout]:
    """The layout under every CP communication type (a2a+p2p with each two-level split); itself without CP."""
    from search_spaces.layouts.layout import CP_COMM_TYPES
    from search_spaces.layouts.space import hierarchical_options

    if layout.cp <= 1:
        return [layout]
    out = [layout.replace(cp_comm_type=kind, hierarchical_cp=()) for kind in CP_COMM_TYPES if kind != "a2a+p2p"]
    return out + [layout.replace(cp_comm_type="a2a+p2p", hierarchical_cp=sizes)
                  for sizes in hierarchical_options([layout.cp])]


def predict_tokens_best_cp(m: Measurement, cal: Calibration) -> tuple[float | None, Layout]:
    """The highest predicted tokens/s/GPU over the CP communication types the rules allow for the measurement's
    layout (for published rows that do not say which type ran), and that layout."""
    best: tuple[float | None, Layout] = (None, m.layout)
    for layout in cp_variants(m.layout):
        pred = predict_tokens(dataclasses.replace(m, layout=layout), cal)
        if pred and (best[0] is None or pred > best[0]):
            best = (pred, layout)
    return best


def predict_peak_gib(m: Measurement, cal: Calibration) -> float | None:
    est = estimate(m.spec(), m.gpu, m.num_gpus, m.seq_len, m.layout, with_time=False, cal=cal)
    return est.peak_memory_gib


def for_release(cal: Calibration, release: str) -> Calibration:
    """`cal` as it was for software `release`: the attention rates scaled by its attention_release_factor."""
    factor = cal.attention_release_factor.get(release)
    if not factor:
        return cal
    return cal.model_copy(update={key: {fam: v * factor for fam, v in getattr(cal, key).items()}
                                  for key in ("attention_fwd_efficiency", "attention_bwd_efficiency")})


def errors(measurements: Iterable[Measurement], cal: Calibration) -> list[float]:
    """Signed relative errors of predicted tokens/s (skipping layouts the rules refuse)."""
    out = []
    for m in measurements:
        pred = predict_tokens(m, cal)
        if pred:
            out.append(pred / m.tokens() - 1)
    return out


def mape(errs: list[float]) -> float | None:
    return 100 * sum(abs(e) for e in errs) / len(errs) if errs else None


def log_loss(measurements: list[Measurement], cal: Calibration) -> float:
    """Mean |log(predicted / measured)| tokens/s (a refused layout costs as much as a 10x miss)."""
    total = 0.0
    for m in measurements:
        pred = predict_tokens(m, cal)
        total += abs(math.log(pred / m.tokens())) if pred else math.log(10)
    return total / max(len(measurements), 1)


# ---- the parameters and the fit -------------------------------------------------------------------------------
def parameters_for(families: Iterable[str], shared: bool = False) -> list[Parameter]:
    params = [p for fam in sorted(set(families)) for p in FAMILY_PARAMETERS.get(fam, [])]
    return params + (SHARED_PARAMETERS if shared else [])


def with_values(cal: Calibration, params: list[Parameter], values: Iterable[float]) -> Calibration:
    """`cal` with each parameter at its value."""
    constants: dict[str, Any] = {}
    for p, v in zip(params, values):
        constants = merge(constants, p.constants(cal, v))
    return cal.updated(constants)


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], step: float = 0.3,
                tol: float = FIT_TOLERANCE, max_evals: int = FIT_MAX_EVALUATIONS,
                bounds: list[tuple[float, float]] | None = None) -> tuple[list[float], float, int]:
    """Minimise f from x0 with scipy's Nelder-Mead (a simplex of `step` along each axis, stopping when its
    losses differ by less than `tol` or after `max_evals`); returns (x, f(x), evaluations)."""
    from scipy.optimize import minimize  # only a fit needs it: estimate, space and the sweep never fit

    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    found = minimize(lambda x: f(list(x)), x0, method="Nelder-Mead", bounds=bounds,
                     options={"initial_simplex": simplex, "fatol": tol, "xatol": math.inf,
                              "maxfev": max(max_evals, n + 1)})
    return [float(v) for v in found.x], float(found.fun), int(found.nfev)


def fit(measurements: list[Measurement], params: list[Parameter], start: Calibration | None = None,
        max_evals: int = FIT_MAX_EVALUATIONS, anchor: list[Measurement] | None = None,
        extra_loss: Callable[[Calibration], float] | None = None) -> tuple[Calibration, dict[str, Any]]:
    """The calibration that minimises `log_loss` over `measurements` (plus, weighing as much as they do together,
    over `anchor`: published rows that keep a small set of measurements from pulling the constants anywhere; plus
    `extra_loss(cal)` when given, e.g. the error of published A/B ratios) by moving `params` within their bounds
    from `start` (default: the packaged calibration); and a summary of the fit."""
    base = start or calibration()
    if not measurements or not params:
        return base, {"evaluations": 0, "loss_before": None, "loss_after": None, "fitted": []}
    anchor = list(anchor or [])

    def objective(cal: Calibration) -> float:
        return log_loss(measurements, cal) + (log_loss(anchor, cal) if anchor else 0.0) \
            + (extra_loss(cal) if extra_loss else 0.0)

    lo = [math.log(p.lower) for p in params]
    hi = [math.log(p.upper) for p in params]

    def unpack(x: list[float]) -> Calibration:
        return with_values(base, params, (math.exp(min(b, max(a, v))) for v, a, b in zip(x, lo, hi)))

    x = [min(b, max(a, math.log(p.value(base)))) for p, a, b in zip(params, lo, hi)]
    before = after = objective(base)
    evals = 0
    for _ in range(FIT_RESTARTS + 1):  # a fresh simplex around the best point until it stops improving
        x, loss, used = nelder_mead(lambda v: objective(unpack(v)), x, max_evals=max_evals - evals)
        evals += used
        improved = loss < after - FIT_TOLERANCE
        after = min(after, loss)
        if not improved or evals >= max_evals:
            break
    cal = unpack(x)
    return cal, {"evaluations": evals, "loss_before": before, "loss_after": after,
                 "fitted": [p.name for p in params]}
