"""Calibrations as data: measurements in, a file of constants out, the cost model's constants from that file.

A `Measurement` is one measured (model, GPU, GPUs, length, Layout) -> tokens/s/GPU (or TF/s) and peak memory:
a published row (search_spaces.reference), a measured sweep trial (orchestrator/calibrate.py reads Optuna and
MLflow), or a replay-table row. `fit()` finds the per-GPU-family constants (`FAMILY_PARAMETERS`) that minimise
the mean |log(predicted / measured)| tokens/s over the measurements it is given, within physical bounds, with a
bounded Nelder-Mead in log space (scipy.optimize). A calibration file holds the fitted constants (and what they
were fitted on); `load_calibration(path)` lays them over the packaged calibration, and `estimate`, `space` and
the sweep's prior take the result as `cal`. The cost model never reads a store: the calibration is handed in.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from search_spaces.errors import MoeAutotuneError, SpecError
from search_spaces.hardware import load_gpu
from search_spaces.inputs import read_text_file
from search_spaces.layout import Layout
from search_spaces.models import ModelSpec, load_model
from search_spaces.throughput import DEFAULT_CALIBRATION, calibration, gpu_family

FORMAT = "moe-autotune calibration"
# constants fitted per GPU family: (path in the calibration, lower bound, upper bound); "*" = every precision
# class of the family (BF16 and FP8 share one efficiency, CALIBRATION.md)
FAMILY_PARAMETERS: dict[str, list[tuple[tuple[str, ...], float, float]]] = {
    "hopper": [(("gemm_efficiency", "hopper", "*"), 0.2, 0.95), (("grouped_gemm_efficiency", "hopper"), 0.1, 1.0),
               (("attention_fwd_efficiency", "hopper"), 0.15, 0.9),
               (("attention_bwd_efficiency", "hopper"), 0.1, 0.9)],
    "blackwell": [(("gemm_efficiency", "blackwell", "*"), 0.2, 0.95),
                  (("grouped_gemm_efficiency", "blackwell"), 0.1, 1.0),
                  (("attention_fwd_efficiency", "blackwell"), 0.15, 0.9),
                  (("attention_bwd_efficiency", "blackwell"), 0.1, 0.9)],
    "cpu": [(("gemm_efficiency", "cpu", "*"), 0.01, 1.0), (("attention_fwd_efficiency", "cpu"), 0.002, 1.0),
            (("cpu_overhead_per_layer_s",), 1e-4, 0.5), (("cpu_collective_latency_s",), 1e-5, 0.1)],
}
# constants shared by the GPU families (fitted by bench/fit_calibration.py on the published rows only)
SHARED_PARAMETERS: list[tuple[tuple[str, ...], float, float]] = [
    (("ep_exposed",), 0.05, 1.0), (("elementwise_passes",), 1.0, 30.0), (("routed_passes",), 0.1, 30.0),
    (("host_kernel_launch_s", "x86"), 1e-6, 1e-4), (("host_kernel_launch_s", "grace"), 1e-6, 1e-4), (("moe_sync_s",), 1e-6, 1e-3), (("mxfp8_gemm_factor",), 0.8, 1.05),
    (("linear_attention_efficiency",), 0.05, 0.6)]
# Nelder-Mead: stop when the simplex's losses differ by less than this, or after this many evaluations
FIT_TOLERANCE = 1e-4
FIT_MAX_EVALUATIONS = 1500
FIT_RESTARTS = 3


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

    def spec(self) -> ModelSpec:
        from search_spaces.reference import model_spec
        spec = model_spec(self.model) if self.model == "deepseek-v3-no-mtp" else load_model(self.model)
        return spec.with_overrides(num_layers=self.num_layers, hidden_size=self.hidden_size)

    @property
    def family(self) -> str:
        return gpu_family(load_gpu(self.gpu))

    def tokens(self) -> float:
        """Measured tokens/s/GPU."""
        if self.tokens_per_sec_per_gpu:
            return float(self.tokens_per_sec_per_gpu)
        from search_spaces.flops import flops_per_token
        return float(self.tflops_per_gpu) * 1e12 / flops_per_token(self.spec(), self.seq_len)

    def tflops(self) -> float:
        """Measured TF/s/GPU in Bridge's count."""
        if self.tflops_per_gpu:
            return float(self.tflops_per_gpu)
        from search_spaces.flops import flops_per_token
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
def predict_tokens(m: Measurement, cal: dict) -> float | None:
    """Predicted tokens/s/GPU of a measurement's layout under `cal`; None when the layout breaks a rule."""
    from search_spaces.rules import check
    from search_spaces.throughput import step_time
    spec, gpu = m.spec(), load_gpu(m.gpu)
    if check(spec, gpu, m.num_gpus, m.seq_len, m.layout):
        return None
    step = step_time(spec, gpu, m.num_gpus, m.seq_len, m.layout, for_release(cal, m.release))["step"]
    return m.layout.gbs * m.seq_len / step / m.num_gpus


def cp_variants(layout: Layout) -> list[Layout]:
    """The layout under every CP communication type (a2a+p2p with each two-level split); itself without CP."""
    from search_spaces.layout import CP_COMM_TYPES
    from search_spaces.space import hierarchical_options
    if layout.cp <= 1:
        return [layout]
    out = [layout.replace(cp_comm_type=kind, hierarchical_cp=()) for kind in CP_COMM_TYPES if kind != "a2a+p2p"]
    return out + [layout.replace(cp_comm_type="a2a+p2p", hierarchical_cp=sizes)
                  for sizes in hierarchical_options([layout.cp])]


def predict_tokens_best_cp(m: Measurement, cal: dict) -> tuple[float | None, Layout]:
    """The highest predicted tokens/s/GPU over the CP communication types the rules allow for the measurement's
    layout (for published rows that do not say which type ran), and that layout."""
    best: tuple[float | None, Layout] = (None, m.layout)
    for layout in cp_variants(m.layout):
        pred = predict_tokens(dataclasses.replace(m, layout=layout), cal)
        if pred and (best[0] is None or pred > best[0]):
            best = (pred, layout)
    return best


def predict_peak_gib(m: Measurement, cal: dict) -> float | None:
    from search_spaces.costmodel import estimate
    est = estimate(m.spec(), m.gpu, m.num_gpus, m.seq_len, m.layout, with_time=False, cal=cal)
    return est.peak_memory_gib


def for_release(cal: dict, release: str) -> dict:
    """`cal` as it was for software `release`: the attention rates scaled by its attention_release_factor."""
    factor = cal.get("attention_release_factor", {}).get(release)
    if not factor:
        return cal
    out = dict(cal)
    for key in ("attention_fwd_efficiency", "attention_bwd_efficiency"):
        out[key] = {fam: v * factor for fam, v in cal[key].items()}
    return out


def errors(measurements: Iterable[Measurement], cal: dict) -> list[float]:
    """Signed relative errors of predicted tokens/s (skipping layouts the rules refuse)."""
    out = []
    for m in measurements:
        pred = predict_tokens(m, cal)
        if pred:
            out.append(pred / m.tokens() - 1)
    return out


def mape(errs: list[float]) -> float | None:
    return 100 * sum(abs(e) for e in errs) / len(errs) if errs else None


def log_loss(measurements: list[Measurement], cal: dict) -> float:
    """Mean |log(predicted / measured)| tokens/s (a refused layout costs as much as a 10x miss)."""
    total = 0.0
    for m in measurements:
        pred = predict_tokens(m, cal)
        total += abs(math.log(pred / m.tokens())) if pred else math.log(10)
    return total / max(len(measurements), 1)


# ---- the parameters and the fit -------------------------------------------------------------------------------
def get_value(cal: dict, path: tuple[str, ...]) -> float:
    node: Any = cal
    for key in path:
        node = node[key] if key != "*" else next(iter(node.values()))
    return float(node)


def set_value(cal: dict, path: tuple[str, ...], value: float) -> None:
    node = cal
    for key in path[:-1]:
        node = node.setdefault(key, {})
    for key in (list(node) or ["bf16"]) if path[-1] == "*" else [path[-1]]:
        node[key] = value


def parameters_for(families: Iterable[str], shared: bool = False) -> list[tuple[tuple[str, ...], float, float]]:
    params = [p for fam in sorted(set(families)) for p in FAMILY_PARAMETERS.get(fam, [])]
    return params + (SHARED_PARAMETERS if shared else [])


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


def fit(measurements: list[Measurement], params: list[tuple[tuple[str, ...], float, float]],
        start: dict | None = None, max_evals: int = FIT_MAX_EVALUATIONS, anchor: list[Measurement] | None = None,
        extra_loss: Callable[[dict], float] | None = None) -> tuple[dict, dict[str, Any]]:
    """The calibration (a full constants dict) that minimises `log_loss` over `measurements` (plus, weighing as
    much as they do together, over `anchor`: published rows that keep a small set of measurements from pulling
    the constants anywhere; plus `extra_loss(cal)` when given, e.g. the error of published A/B ratios) by moving
    `params` within their bounds from `start` (default: the packaged calibration); and a summary of the fit."""
    base = copy.deepcopy(start or calibration())
    if not measurements or not params:
        return base, {"evaluations": 0, "loss_before": None, "loss_after": None, "fitted": []}
    anchor = list(anchor or [])

    def objective(cal: dict) -> float:
        return log_loss(measurements, cal) + (log_loss(anchor, cal) if anchor else 0.0) \
            + (extra_loss(cal) if extra_loss else 0.0)

    lo = [math.log(p[1]) for p in params]
    hi = [math.log(p[2]) for p in params]

    def unpack(x: list[float]) -> dict:
        cal = copy.deepcopy(base)
        for (path, _, _), v, a, b in zip(params, x, lo, hi):
            set_value(cal, path, math.exp(min(b, max(a, v))))
        return cal

    x = [min(b, max(a, math.log(get_value(base, p[0])))) for p, a, b in zip(params, lo, hi)]
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
                 "fitted": [".".join(p[0]).replace(".*", "") for p in params]}


# ---- the software a calibration was measured with -------------------------------------------------------------
# what a calibration file records and a mismatch reports: name -> the distributions that carry it (the first
# installed one counts; CUDA and NCCL as the wheels PyTorch depends on, so nothing imports torch to read them)
SOFTWARE_PACKAGES = {"torch": ("torch",), "megatron-core": ("megatron-core",),
                     "transformer-engine": ("transformer-engine", "transformer_engine", "transformer-engine-cu12"),
                     "cuda": ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime"),
                     "nccl": ("nvidia-nccl-cu12", "nvidia-nccl-cu13")}


def software_stack(recorded: dict[str, str] | None = None) -> dict[str, str]:
    """The versions of SOFTWARE_PACKAGES installed here (those installed), or `recorded` (a measurement's,
    normalised to the same names) when given."""
    if recorded is not None:
        aliases = {alias: name for name, dists in SOFTWARE_PACKAGES.items() for alias in (name, *dists)}
        return {aliases.get(k, k): str(v) for k, v in recorded.items() if aliases.get(k, k) in SOFTWARE_PACKAGES
                or k == "container"}
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for name, dists in SOFTWARE_PACKAGES.items():
        for dist in dists:
            try:
                found[name] = version(dist)
                break
            except PackageNotFoundError:
                continue
    return found


def measured_stack(measurements: Iterable[Measurement]) -> dict[str, str]:
    """The software most of the measurements ran (per package, the most common version)."""
    counts: dict[str, dict[str, int]] = {}
    for m in measurements:
        for name, version in software_stack(dict(m.software)).items():
            counts.setdefault(name, {}).setdefault(version, 0)
            counts[name][version] += 1
    return {name: max(versions, key=versions.get) for name, versions in sorted(counts.items())}


def stack_mismatch(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """'package recorded -> current' for each package both stacks name with different versions."""
    return [f"{k} {recorded[k]} -> {current[k]}" for k in sorted(recorded) if k in current and recorded[k] != current[k]]


def warn_if_other_stack(path: str | Path, recorded: Any, current: dict[str, str] | None = None) -> str | None:
    """One line on stderr when a calibration file was measured with other software than this environment's
    (kernels and containers move the figures, more so from 128K up); returns the line (None: same or unknown)."""
    import sys
    if not isinstance(recorded, dict) or not recorded:
        return None
    diff = stack_mismatch(software_stack(recorded), software_stack() if current is None else current)
    if not diff:
        return None
    line = (f"warning: calibration file {path} was measured with other software ({'; '.join(diff)}): "
            "its constants may not hold here")
    print(line, file=sys.stderr)
    return line


# ---- files ----------------------------------------------------------------------------------------------------
def _check_constants(data: Any, where: str, top: bool = True) -> None:
    """Constants the cost model knows (top level), positive finite numbers for leaves: one line naming the
    first bad one."""
    if not isinstance(data, dict):
        raise SpecError(f"{where} must be a mapping, got {type(data).__name__}")
    for key, value in data.items():
        if top and key not in DEFAULT_CALIBRATION:
            raise SpecError(f"{where}: unknown constant {key!r}; known: {', '.join(DEFAULT_CALIBRATION)}")
        if isinstance(value, dict):
            _check_constants(value, f"{where}.{key}", top=False)
        elif isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
            raise SpecError(f"{where}.{key} must be a positive number, got {value!r}")


def load_calibration(path: str | Path | None) -> dict:
    """The packaged calibration with a calibration file's constants laid over it (None: the packaged one)."""
    cal = copy.deepcopy(calibration())
    if path is None:
        return cal
    text = read_text_file(Path(path), "calibration file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"calibration file {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    document = isinstance(data, dict) and data.get("format") == FORMAT
    constants = data.get("constants") if document else data
    software = (data.get("software") if document else
                constants.pop("software", None) if isinstance(constants, dict) else None)
    _check_constants(constants, f"calibration file {path}")
    warn_if_other_stack(path, software)
    return merge(cal, constants)


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def calibration_document(cal: dict, fitted: list[str], summary: dict[str, Any],
                         software: dict[str, str] | None = None) -> dict[str, Any]:
    """What a calibration file holds: the constants (all of them, so the file stands alone), how they came, and
    the software the measurements ran (torch, Megatron-Core, Transformer Engine, CUDA, NCCL as recorded)."""
    return {"format": FORMAT, "version": 1,
            "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "fitted": fitted, "summary": summary, "software": dict(software or {}), "constants": cal}


def write_calibration(path: str | Path, document: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(document, indent=2, default=float) + "\n")
