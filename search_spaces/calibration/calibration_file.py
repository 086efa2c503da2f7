"""The cost model's constants as one typed model, and the calibration file that holds them.

`Calibration` declares every constant once: its type, its default (the hand-set or published starting point) and
what it means. The packaged search_spaces/calibration/calibration.json (fitted by bench/fit_calibration.py and
bench/cpu_calibration.py) lays its values over the defaults: `calibration()`. A file written by
`moe-autotune calibrate` is a `CalibrationDocument` (the constants and what they were fitted on);
`load_calibration(path)` lays its constants, or those of a plain mapping of constants, over the packaged ones.
A bad file is one SpecError line (search_spaces.pydantic_line); the file is read within search_spaces.bounded's
bounds (nesting, digits, each key once), and each constant is held to its physical range (`Range`): a value
outside it would make the cost model divide by zero, overflow or answer NaN.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError

from search_spaces.bounded import loads_json, read_json
from search_spaces.catalog.hardware import FAMILIES, GPU_NAMES, HOSTS, GPUSpec
from search_spaces.catalog.software import warn_if_other_stack
from search_spaces.errors import SpecError
from search_spaces.inputs import read_text_file
from search_spaces.pydantic_line import one_line

CALIBRATION_PATH = Path(__file__).parent / "calibration.json"
FORMAT = "moe-autotune calibration"


@dataclass(frozen=True)
class Range:
    """A constant's physical range [low, high]: finite, positive, and within the orders of magnitude a chip, a
    kernel or a host can have. A value outside it is no measurement of anything: refused with the range and why."""
    low: float
    """The smallest value a real system gives it (> 0: the cost model divides by many constants)."""
    high: float
    """The largest."""
    why: str
    """What the constant is, so the range explains itself in the error line."""

    def __call__(self, value: float) -> float:
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise ValueError(f"must be a positive number within [{self.low:g}, {self.high:g}] ({self.why}), "
                             f"got {value!r}")
        return value

    @property
    def type(self) -> Any:
        """The pydantic type of a constant in this range: a float (an int is one here, a bool is not)."""
        return Annotated[float, Strict(), AfterValidator(self)]


# The ranges, one per kind of constant. Every fit's bounds (search_spaces/calibration/fit.py, Parameter) lie within
# them; what lies outside is a typo, a unit slip (ms for s) or a hostile file, and would make the model divide by
# zero, overflow or answer NaN.
# Each is `Range.type` written out, so that a type checker sees the float; pydantic holds it to its range.
EFFICIENCY = Annotated[float, Strict(), AfterValidator(Range(
    1e-3, 1.0, "an efficiency: achieved / peak rate, at most 1; under 0.1% no kernel runs"))]
RELATIVE_RATE = Annotated[float, Strict(), AfterValidator(Range(
    1e-2, 4.0, "a rate relative to another on the same chip: within a few times"))]
SHARE = Annotated[float, Strict(), AfterValidator(Range(
    1e-6, 1.0, "the share of a communication's time left exposed: at most all of it"))]
PASSES = Annotated[float, Strict(), AfterValidator(Range(1e-2, 1e3, "passes over memory per step: a few to tens"))]
BYTES = Annotated[float, Strict(), AfterValidator(Range(1e-2, 64.0, "bytes per element"))]
KERNEL_S = Annotated[float, Strict(), AfterValidator(Range(
    1e-9, 1e-2, "seconds per kernel launch or step: nanoseconds to milliseconds"))]
HOST_S = Annotated[float, Strict(), AfterValidator(Range(
    1e-9, 10.0, "seconds of a sync or a collective: nanoseconds to seconds"))]
CPU_LAYER_S = Annotated[float, Strict(), AfterValidator(Range(
    1e-9, 100.0, "seconds of eager CPU time per layer and microbatch"))]
GIB = Annotated[float, Strict(), AfterValidator(Range(
    1e-3, 4096.0, "GiB of a process's resident set beside its tensors"))]
CORES = Annotated[float, Strict(), AfterValidator(Range(1.0, 2.0 ** 20, "cores of one host"))]
# per-family tables are keyed by an architecture family or, where one chip differs, by a GPU's name
Family: typing.TypeAlias = Literal[FAMILIES + GPU_NAMES]  # type: ignore[valid-type]
Host: typing.TypeAlias = Literal[HOSTS]  # type: ignore[valid-type]


class Calibration(BaseModel):
    """The constants of the cost model (search_spaces/cost/throughput.py, memory.py, the cost terms of each family).

    Fitted ones are re-fitted by bench/fit_calibration.py (published rows) and bench/cpu_calibration.py (the CPU
    trainer); `moe-autotune calibrate` fits a family's again on measured trials (CALIBRATION.md)."""
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    gemm_efficiency: dict[Family, dict[str, EFFICIENCY]] = {
        "hopper": {"bf16": 0.62, "fp8": 0.45}, "blackwell": {"bf16": 0.60, "fp8": 0.45},
        "cpu": {"fp32": 0.5, "bf16": 0.5}}
    """Dense GEMMs' achieved / peak rate, per family (or GPU; h200 uses h100's) and precision class (fitted)."""
    grouped_gemm_efficiency: dict[Family, EFFICIENCY] = {"hopper": 0.8, "blackwell": 0.8, "cpu": 0.8}
    """The expert grouped GEMMs' rate relative to dense GEMMs, per family (fitted)."""
    attention_fwd_efficiency: dict[Family, EFFICIENCY] = {"hopper": 0.75, "blackwell": 0.84, "cpu": 0.3}
    """Flash attention's forward achieved / BF16 peak for 128-wide heads as the kernel length grows without bound
    (a causal kernel over L query tokens runs at shard_length_factor(L) of it). Today's kernels, not fitted on
    GPUs: Blackwell, FlashAttention-4 on B200, 1882 TF/s non-causal at 16K of 2250 (Dao-AILab/flash-attention
    PRs #2605, #2280); Hopper, FlashAttention-3 on H100 SXM5 "up to 740 TF/s, 75% utilization" (Shah et al.
    2024). Fitted on cpu."""
    attention_bwd_efficiency: dict[Family, EFFICIENCY] = {"hopper": 0.53, "blackwell": 0.6, "cpu": 0.3}
    """Flash attention's backward (its own FLOPs: 2.5x the forward's) achieved / BF16 peak: Blackwell 1118-1209
    TF/s causal at 8K (FlashAttention-4); Hopper at FlashAttention-4's backward/forward ratio, 0.71 (assumed)."""
    attention_release_factor: dict[str, RELATIVE_RATE] = {}
    """Per software release older than today's kernels: the share of today's attention rate its runs reached."""
    linear_attention_efficiency: EFFICIENCY = 0.2
    """Gated delta-net's chunked kernels (convolution, state update): achieved / BF16 peak (fitted)."""
    delta_net_state_step_s: KERNEL_S = 1.5e-6
    """Gated delta-net: one chunk step of the sequential state pass (flash-linear-attention's
    chunk_gated_delta_rule_fwd_h and its backward), per block of the rank's heads x value width; the pass walks
    the whole sequence whatever CP (search_spaces/cost/delta_net.py). Fitted on the fit half of the published Qwen3-Next
    rows (8K CP1, 64K CP16; 32K CP4 held out): what a hybrid model's CP costs beyond its bytes."""
    elementwise_passes: PASSES = 8.0
    """HBM reads + writes of the saved activations per step, forward and backward (fitted)."""
    sustained_rate: dict[Family, RELATIVE_RATE] = {}
    """Per GPU: its achieved rate relative to its family's (Blackwell Ultra > 1: measured, CALIBRATION.md)."""
    routed_passes: PASSES = 2.0
    """HBM passes over each routed token copy (permute, activation, unpermute), forward and backward (fitted)."""
    fp8_cast_bytes: BYTES = 4.0
    """No longer read (kept so that calibration files written before issue 23 load): the bytes per cast element
    are each recipe's own now (search_spaces/cost/quantisation.py); fitted, this made casts nearly free."""
    ep_exposed: SHARE = 0.5
    """Share of the EP all-to-all that the EP overlap (Layout.ep_overlap: one microbatch's dispatch and combine
    beside another's compute) does not hide, on the microbatches it pairs (fitted)."""
    ep_serial_exposed: SHARE = 1.0
    """Share of the EP all-to-all exposed without the EP overlap: the dispatch and combine sit on the layer's
    critical path, but for what the dispatcher's own stream runs beside the shared experts and the permutes
    (fitted)."""
    tp_exposed: SHARE = 0.5
    """Share of the sequence-parallel collectives that overlap does not hide."""
    dp_exposed: SHARE = 0.2
    """Share of the gradient reduce-scatter and parameter all-gather that overlap does not hide."""
    launch_overhead_s: KERNEL_S = 2.0e-4
    """No longer read (kept so that older calibration files load): the host time per MoE layer, now counted
    kernel by kernel (host_kernel_launch_s, moe_sync_s; search_spaces/cost/launch_overhead.py)."""
    dense_launch_overhead_s: KERNEL_S = 5.0e-5
    """No longer read (kept so that older calibration files load): the same for a dense layer."""
    host_kernel_launch_s: dict[Host, KERNEL_S] = {"x86": 8e-6, "grace": 8e-6}
    """GPUs: the host's time per kernel launch (PyTorch's and Transformer Engine's Python, the dispatch, the launch
    itself), per host CPU -- Grace runs the Python at its own rate (search_spaces/cost/launch_overhead.py; fitted)."""
    moe_sync_s: HOST_S = 5e-5
    """GPUs: a dropless MoE layer's device-to-host sync for the tokens per expert and the host's wake-up after it,
    per MoE layer and microbatch; the host cannot launch ahead across it (fitted)."""
    mxfp8_gemm_factor: RELATIVE_RATE = 0.95
    """MXFP8 GEMMs' rate relative to per-tensor FP8's: the 1x32 block scales dequantised in the Tensor Core
    (search_spaces/cost/quantisation.py; fitted)."""
    cpu_overhead_per_layer_s: CPU_LAYER_S = 0.01
    """cpu: eager PyTorch/autograd time per layer per microbatch, forward and backward (no graphs there); the
    hand-set start that bench/cpu_calibration.py replaces with its fit on the trainer's own runs."""
    cpu_collective_latency_s: HOST_S = 5e-4
    """cpu: one gloo exchange's fixed cost (sync, TCP round trips, Python) whatever its few bytes (fitted)."""
    cpu_process_baseline_gib: GIB = 0.75
    """cpu: the trainer's resident set beside its tensors (Python, torch, Megatron-Core; trainers/README.md:
    ~0.8 GiB; fitted)."""
    cpu_elementwise_passes: PASSES = 14.15
    """cpu: the passes over the saved activations of the CPU trainer's layers (elementwise_passes' value when the
    CPU constants were fitted, held apart so that refitting the GPUs' shared constants leaves the CPU path as
    bench/cpu_calibration.py measured it)."""
    cpu_ep_exposed: SHARE = 0.1655
    """cpu: the share of gloo's all-to-all overlap does not hide (ep_exposed's value when the CPU constants were
    fitted, held apart for the same reason)."""
    cpu_cores: CORES = Field(default_factory=lambda: float(os.cpu_count() or 1))
    """cpu: the cores a run's ranks share (this host's: os.cpu_count()); ranks beyond them queue for a core."""
    comm_efficiency: EFFICIENCY = 0.7
    """Achieved / datasheet bandwidth of NVLink and scale-out links."""
    dispatcher_efficiency: dict[str, EFFICIENCY] = {"alltoall": 0.6, "allgather": 0.6, "deepep": 0.85,
                                                  "hybridep": 0.9}
    """Per MoE dispatcher: achieved / datasheet bandwidth of its all-to-all (it stands in for comm_efficiency)."""

    software: dict[str, str] = {}
    """The software the constants were measured with (torch, megatron-core, transformer-engine, cuda, nccl, or
    a container's name: search_spaces/catalog/software.py); loading a calibration measured with another stack says
    so."""
    software_maturity: dict[Family, dict[str, RELATIVE_RATE]] = {}
    """Per GPU, per NeMo / Megatron-Bridge container release older than the constants' own: the share of the
    newest release's tokens/s that release reached on the same configuration (measured, not fitted, on the
    performance summary's configurations published in several releases: search_spaces/catalog/maturity.py)."""
    software_release: str = ""
    """The software the figures assume: "" for the constants' own (the newest published release of each
    configuration); a container release ("25.11"): its compute rates scaled by `software_maturity`
    (search_spaces.catalog.maturity.at_software sets it)."""

    def sustained_factor(self, gpu: GPUSpec) -> float:
        """Blackwell Ultra (B300, GB300) runs faster than its datasheet twin at the same dense peak: a higher power
        limit keeps the tensor cores at higher clocks, and its doubled SFU rate speeds up softmax. Measured on
        the reference rows that ran the same layout and release on both chips (see CALIBRATION.md). Times the
        maturity of `software_release` on this GPU (1 for the constants' own software)."""
        rate = self.sustained_rate.get(gpu.name, 1.0)
        if not self.software_release:
            return rate
        from search_spaces.catalog.maturity import maturity  # only an older release needs the table's lookup
        return rate * maturity(self.software_maturity.get(gpu.name, {}), self.software_release)[0]

    def updated(self, constants: dict[str, Any]) -> "Calibration":
        """These constants laid over this calibration (nested tables entry by entry), validated."""
        return Calibration.model_validate(merge(self.model_dump(), constants))


class CalibrationDocument(BaseModel):
    """What `moe-autotune calibrate` writes: the constants (all of them, so the file stands alone) and how they
    came."""
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    format: Literal[FORMAT]  # type: ignore[valid-type]
    """Always "moe-autotune calibration": tells a document from a plain mapping of constants."""
    version: int = 1
    """The document's layout (1)."""
    created: str = ""
    """When it was fitted (UTC, ISO 8601)."""
    fitted: list[str] = []
    """The constants the fit moved (`Parameter.name`: constant.family, or the constant alone)."""
    summary: dict[str, Any] = {}
    """What it was fitted on and how well: measurements, fit and held-out halves, families, the held-out MAPE
    before and after, the fit's evaluations and losses, the sources."""
    constants: dict[str, Any]
    """The constants (`Calibration`'s fields); laid over the packaged calibration when read."""


def constant_range(name: str) -> Range:
    """The physical range of the constant `name` (a field of Calibration; a table's entries share one)."""
    field = Calibration.model_fields[name]

    def find(items: Any) -> Range | None:
        for item in items:
            if isinstance(item, AfterValidator) and isinstance(item.func, Range):
                return item.func
            found = find(typing.get_args(item))
            if found is not None:
                return found
        return None

    found = find([*field.metadata, field.annotation])
    if found is None:
        raise KeyError(f"{name} is not a constant with a range")
    return found


def merge(base: dict, over: dict) -> dict:
    """`over` laid over `base`, nested mappings entry by entry."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        out[key] = merge(below if isinstance(below, dict) else {}, value) if isinstance(value, dict) else value
    return out


@lru_cache(maxsize=1)
def calibration() -> Calibration:
    """The packaged calibration: calibration.json's constants over the defaults (a constant it stores replaces
    the default whole)."""
    stored = read_json(CALIBRATION_PATH, "packaged calibration") if CALIBRATION_PATH.is_file() else {}
    return Calibration.model_validate({**Calibration().model_dump(), **stored})


def load_calibration(path: str | Path | None) -> Calibration:
    """The packaged calibration with a calibration file's constants laid over it (None: the packaged one)."""
    if path is None:
        return calibration()
    where = f"calibration file {path}"
    data = loads_json(read_text_file(Path(path), "calibration file"), where)  # bounded: depth, digits, keys once
    if isinstance(data, dict) and data.get("format") == FORMAT:
        try:
            data = CalibrationDocument.model_validate(data).constants
        except ValidationError as exc:
            raise SpecError(f"{where}: {one_line(exc, CalibrationDocument, whole='document')}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{where} must be a mapping of constants, got {type(data).__name__}")
    try:
        cal = calibration().updated(data)
    except ValidationError as exc:
        raise SpecError(f"{where}: {one_line(exc, Calibration, noun='constant')}") from None
    warn_if_other_stack(where, data.get("software"))
    return cal


def calibration_document(cal: Calibration, fitted: list[str], summary: dict[str, Any],
                         software: dict[str, str] | None = None) -> CalibrationDocument:
    """What a calibration file holds: the constants (all of them, so the file stands alone), how they came, and
    (`software`, when given) the stack its measurements ran, recorded as the constants' `software`."""
    if software is not None:
        cal = cal.model_copy(update={"software": dict(software)})
    return CalibrationDocument(format=FORMAT, created=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                               fitted=fitted, summary=summary, constants=cal.model_dump())


def calibration_text(document: CalibrationDocument) -> str:
    """A calibration file's text: strict JSON (a figure of the summary that is not finite is written as null)."""
    return json.dumps(_finite(document.model_dump()), indent=2, default=float, allow_nan=False) + "\n"


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def write_calibration(path: str | Path, document: CalibrationDocument) -> None:
    Path(path).write_text(calibration_text(document))
