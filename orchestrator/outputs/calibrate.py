"""A calibration that learns: measured trials from Optuna studies, MLflow experiments and replay tables in, a
calibration file out (search_spaces.calibration.fit does the fitting; this module reads the stores).

Every trial that ran and measured (status ok, a tokens/s) is a data point, whatever sweep produced it, except
analytic ones (their "measurement" is the cost model itself). The measurements are split in two declared
halves (every other one in the order read; `holdout`), the per-GPU-family constants of the families they cover
are fitted on the first half plus every published row of those families (search_spaces.calibration.reference; each side
weighs as much as the other), and the error on the second half is reported before and after. On `cpu` the
process's resident baseline is measured too (the median of measured peak minus the tensors the model counts).

A measurement that cannot be true (search_spaces.validation: NaN, negative, above the GPU's peak or capacity,
tokens/s that disagree with the step time...) is skipped wherever it enters (a study's trial, an MLflow run, a
table row); `gather` says how many it skipped and why, and refuses when none is left.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from search_spaces.calibration.fit import (
    FIT_MAX_EVALUATIONS,
    Calibration,
    CalibrationDocument,
    Measurement,
    calibration_document,
    errors,
    fit,
    load_calibration,
    mape,
    parameters_for,
    predict_peak_gib,
    usable,
)
from search_spaces.calibration.reference import published_rows
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.software import measured_stack
from search_spaces.errors import MoeAutotuneError, SpecError
from search_spaces.layouts.layout import Layout
from search_spaces.validation import problems

from orchestrator.records import StudyRecord, TrialRecord
from orchestrator.spec.schema import DEFAULT_STORAGE

log = logging.getLogger("moe_autotune")

def measurement_from_result(result: dict[str, Any], source: str, backend: str = "") -> Measurement | None:
    """A TrialResult dict (as the sweep stores it) -> a Measurement, or None when it is not a measured ok run
    (or its numbers cannot be true: `judge_result` says why)."""
    return judge_result(result, source, backend)[0]


def judge_result(result: Any, source: str, backend: str = "") -> tuple[Measurement | None, str | None]:
    """(the Measurement, None); (None, why it is skipped) when a run recorded as ok cannot be true; (None, None)
    when it is no data point at all (not measured ok, or the cost model's own answer). `result`: a TrialResult
    or its stored dict."""
    return judge(TrialRecord.from_attrs(-1, {"result": result}), source, backend)


def judge(record: TrialRecord, source: str, backend: str = "") -> tuple[Measurement | None, str | None]:
    """judge_result of a trial's record (its result, the backend that ran it)."""
    r = record.result
    if r is None or backend == "analytic" or record.source == "costmodel" or r.status != "ok":
        return None, None
    # the fields a measured trial must have to be a data point
    needed = {"model": r.model, "gpu": r.gpu, "num_gpus": r.num_gpus, "seq_len": r.seq_len, "layout": r.layout,
              "tokens_per_sec_per_gpu": r.tokens_per_sec_per_gpu}
    missing = [k for k, v in needed.items() if not v]
    if missing:
        return None, f"{source}: recorded as ok without {missing[0]}"
    assert r.num_gpus is not None and r.seq_len is not None  # in `needed`: checked just above
    overrides = record.model_overrides
    try:
        m = Measurement(model=str(r.model), gpu=str(r.gpu), num_gpus=int(r.num_gpus), seq_len=int(r.seq_len),
                        layout=Layout.from_dict(r.layout), tokens_per_sec_per_gpu=r.tokens_per_sec_per_gpu,
                        peak_memory_gib=r.peak_memory_gib, source=source,
                        num_layers=overrides.get("num_layers"), hidden_size=overrides.get("hidden_size"),
                        software=tuple(sorted((str(k), str(v)) for k, v in (r.versions or {}).items())))
        claimed = dataclasses.replace(r, extra={})
        composed = record.proxy  # the full layout's figures on the proxy's record
        reasons = problems(claimed, m.layout, load_gpu(m.gpu), model=m.spec(), seq_len=m.seq_len,
                           num_gpus=None if composed else m.num_gpus, memory_measured=not composed)
    except (MoeAutotuneError, TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
        return None, f"{source}: not a trial result ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    if reasons:
        return None, f"{source}: {'; '.join(reasons)}"
    return m, None


def from_study(storage: str, study_name: str, skipped: list[str] | None = None) -> list[Measurement]:
    """The measured trials of an Optuna study (orchestrator.storage.queries.measured_trials)."""
    from orchestrator.records import queries
    from orchestrator.storage import studies

    study = studies.load_study(storage, study_name)
    context = StudyRecord.of(study)
    out: list[Measurement] = []
    for record in queries.measured_records(study):
        if context.model_overrides and not record.model_overrides and record.result is not None:
            result = dataclasses.replace(record.result, extra={**record.extra,
                                                               "model_overrides": context.model_overrides})
            record = dataclasses.replace(record, result=result)
        _keep(judge(record, f"study {study_name} trial {record.number}", context.backend or ""), out, skipped)
    return out


def _keep(judged: tuple[Measurement | None, str | None], out: list[Measurement], skipped: list[str] | None) -> None:
    m, why = judged
    if m is not None:
        out.append(m)
    elif why and skipped is not None:
        skipped.append(why)


def from_experiment(tracking_uri: str, experiment: str, skipped: list[str] | None = None) -> list[Measurement]:
    """The measured child runs of an MLflow experiment (their trial.json artifact: result and layout)."""
    from orchestrator.storage import open_mlflow

    client = open_mlflow(tracking_uri)  # bounded: an unreachable server is one line, not a hang
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SpecError(f"no MLflow experiment {experiment!r} at {tracking_uri}")
    runs = client.search_runs([exp.experiment_id], "tags.status = 'ok'", max_results=10000)
    out: list[Measurement] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            backend = run.data.tags.get("backend", "")
            if backend == "analytic" or "trial.json" not in {a.path for a in client.list_artifacts(run.info.run_id)}:
                continue
            local = client.download_artifacts(run.info.run_id, "trial.json", tmp)
            record = TrialRecord.from_attrs(-1, _read_json(Path(local)))  # trial.json: a record's evidence
            _keep(judge(record, f"experiment {experiment} run {run.info.run_id[:8]}", backend), out, skipped)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    """A run's trial.json read back from MLflow, within search_spaces.bounded's bounds; {} when it is none."""
    from search_spaces.bounded import read_json

    try:
        data = read_json(path, "trial.json", limit=16 << 20)
    except SpecError:  # missing, too large, not UTF-8, not JSON, nested too deep, a huge integer: no record
        return {}
    return data if isinstance(data, dict) else {}


def from_table(path: str, skipped: list[str] | None = None) -> list[Measurement]:
    """The rows measured ok of a replay table (`moe-autotune status --csv` writes one); a row whose numbers
    cannot be true was made invalid as it was read (replay.load_table) and is skipped with its reason."""
    from orchestrator.dispatch.replay import load_table

    table = load_table(path)
    if skipped is not None:
        skipped += [f"table {Path(path).name} line {row.line}: {row.reason}" for row in table.rows.values()
                    if row.reason]
    return [Measurement(table.model, table.gpu, table.num_gpus, table.seq_len, row.layout,
                        tokens_per_sec_per_gpu=row.tokens_per_sec_per_gpu, peak_memory_gib=row.peak_memory_gib,
                        source=f"table {Path(path).name} line {row.line}")
            for row in table.rows.values() if row.status == "ok" and row.tokens_per_sec_per_gpu]


def gather(studies: Iterable[str] = (), storage: str = DEFAULT_STORAGE, experiments: Iterable[str] = (),
           tracking_uri: str = "sqlite:///mlflow.db", tables: Iterable[str] = ()) -> list[Measurement]:
    """Every measurement of the named sources that can be true, each (situation, layout) once (the first one
    read). Those that cannot be true are skipped, with a warning that counts them and names the first reason;
    when none is left, one line says so (SpecError)."""
    found: list[Measurement] = []
    skipped: list[str] = []
    for name in studies:
        found += from_study(storage, name, skipped)
    for name in experiments:
        found += from_experiment(tracking_uri, name, skipped)
    for path in tables:
        found += from_table(path, skipped)
    found, refused = usable(found)  # the last guard: whatever the source, the same bounds
    skipped += refused
    if skipped and not found:
        raise SpecError(f"no measurement left to calibrate on: all {len(skipped)} measured ok cannot be true "
                        f"(first: {skipped[0]})")
    if skipped:
        log.warning("calibrate: skipped %d measurement(s) that cannot be true (first: %s)", len(skipped), skipped[0])
    seen, out = set(), []
    for m in found:
        key = (m.model, m.gpu, m.num_gpus, m.seq_len, m.layout, m.num_layers, m.hidden_size)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


@dataclass
class CalibrationRun:
    cal: Calibration
    document: CalibrationDocument
    fitted_on: int
    held_out: int
    published: int
    families: list[str]
    before: dict[str, float | None] = field(default_factory=dict)  # held-out MAPE (%) per quantity
    after: dict[str, float | None] = field(default_factory=dict)


def split(measurements: list[Measurement], holdout: float) -> tuple[list[Measurement], list[Measurement]]:
    """(fit, held out): every k-th measurement held out (k = round(1 / holdout)), none for holdout 0."""
    if holdout <= 0 or len(measurements) < 2:
        return list(measurements), []
    k = max(2, round(1 / holdout))
    held = [m for i, m in enumerate(measurements) if i % k == k - 1]
    return [m for m in measurements if m not in held], held


def peak_mape(measurements: list[Measurement], cal: Calibration) -> float | None:
    # a layout the rules refuse has no predicted peak: skipped, as `errors` skips its tokens/s
    pairs = [(predict_peak_gib(m, cal), m.peak_memory_gib) for m in measurements if m.peak_memory_gib]
    return mape([pred / peak - 1 for pred, peak in pairs if pred is not None and peak])


def fit_process_baseline(measurements: list[Measurement], cal: Calibration) -> float | None:
    """cpu: the median of (measured peak - the tensors the model counts), in GiB."""
    cpu = [m for m in measurements if m.gpu == "cpu" and m.peak_memory_gib]
    if not cpu:
        return None
    base = cal.model_copy(update={"cpu_process_baseline_gib": 1e-9})
    # a layout the rules refuse has no predicted peak: skipped
    gaps = [peak - pred for m in cpu
            if (peak := m.peak_memory_gib) is not None and (pred := predict_peak_gib(m, base)) is not None]
    return max(1e-3, statistics.median(gaps)) if gaps else None


def calibrate(measurements: list[Measurement], start: Calibration | None = None, holdout: float = 0.5,
              with_published: bool = True, max_evals: int | None = None) -> CalibrationRun:
    """Fit the families' constants to the fit half (+ published rows), report the held-out half."""
    if not measurements:
        raise SpecError("no measured trial to calibrate on (only trials that ran with status ok count)")
    measurements, skipped = usable(measurements)  # a caller that did not gather: the same bounds
    if not measurements:
        raise SpecError(f"no measurement left to calibrate on: all {len(skipped)} cannot be true (first: {skipped[0]})")
    start = start or load_calibration(None)
    fit_part, held = split(measurements, holdout)
    families = sorted({m.family for m in measurements})
    anchor = [r for r in published_rows() if r.family in families] if with_published else []
    cal, summary = fit(fit_part, parameters_for(families), start, anchor=anchor,
                       max_evals=max_evals or FIT_MAX_EVALUATIONS)
    baseline = fit_process_baseline(fit_part, cal)
    if baseline is not None:
        cal = cal.updated({"cpu_process_baseline_gib": baseline})
    before, after = ({"tokens_per_sec_per_gpu": mape(errors(held, c)), "peak_memory_gib": peak_mape(held, c)}
                     for c in (start, cal))
    document = calibration_document(cal, summary["fitted"] + (["cpu_process_baseline_gib"] if baseline else []),
                                    {"measurements": len(measurements), "fitted_on": len(fit_part),
                                     "held_out": len(held), "published_rows": len(anchor),
                                     "families": families, "held_out_mape_before": before,
                                     "held_out_mape_after": after, "fit": summary,
                                     "sources": sorted({m.source.rsplit(" ", 2)[0] for m in measurements})},
                                    software=measured_stack(measurements))
    return CalibrationRun(cal, document, len(fit_part), len(held), len(anchor), families, before, after)
