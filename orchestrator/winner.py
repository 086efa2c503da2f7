"""Which trial of a finished sweep may go to production, read from the Optuna storage contract.

A trial is promotable when it was measured (status ok), fits the GPU's memory, was not merely predicted by
the analytic backend (unless the caller allows estimates) and uses no benchmark-only setting (a dimension's
`benchmark_only` values, e.g. routing=forced_balance; unless the caller allows them). Every refusal is a
SpecError whose one line says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna

from search_spaces.errors import SpecError
from search_spaces.layout import Layout


def load(storage: str, study_name: str | None = None) -> optuna.Study:
    """The study (the newest one in the storage when unnamed), or a SpecError naming what is missing."""
    from orchestrator.study import load_study

    return load_study(storage, study_name)


@dataclass(frozen=True)
class TrialView:
    """One trial as the sweep recorded it (user_attrs), with the questions promote and report ask."""
    number: int
    status: str
    layout: Layout | None
    result: dict[str, Any]
    prediction: dict[str, Any]
    backend: str
    reason: str | None
    mlflow_run_id: str | None
    memory_limit_gib: float | None
    constraints: tuple[float, ...] = ()
    fidelity: str = "full"  # proxy: measured on a proxy and composed to full size
    proposed_by: str | None = None  # rule-of-thumb, previous length, resume, confirm, or the search's name

    @property
    def gpu_seconds(self) -> tuple[float | None, float | None]:
        """(GPU-seconds the trial used, what it would have used at full size)."""
        extra = self.result.get("extra") or {}
        return extra.get("gpu_seconds"), extra.get("full_size_gpu_seconds")

    @property
    def tokens_per_sec_per_gpu(self) -> float | None:
        return self.result.get("tokens_per_sec_per_gpu")

    @property
    def peak_memory_gib(self) -> float | None:
        return self.result.get("peak_memory_gib")

    @property
    def estimated(self) -> bool:
        """The numbers are the cost model's, not a measurement."""
        return self.backend == "analytic" or (self.result.get("extra") or {}).get("source") == "costmodel"

    @property
    def fits(self) -> bool:
        """Measured peak within the GPU's memory; without a measurement, the cost model's verdict."""
        if any(c > 0 for c in self.constraints):  # the sweep's own verdict (memory over the limit)
            return False
        peak = self.peak_memory_gib
        if peak is not None and self.memory_limit_gib:
            return float(peak) <= float(self.memory_limit_gib)
        if "fits" in self.prediction:
            return bool(self.prediction["fits"])
        return False

    @property
    def proxy(self) -> bool:
        return self.fidelity == "proxy"

    def refusal(self, allow_estimated: bool = False, allow_proxy: bool = False,
                allow_benchmark: bool = False) -> str | None:
        """Why this trial may not be promoted, or None."""
        if self.layout is None:
            return f"trial {self.number} has no layout recorded"
        if self.status != "ok":
            first = (self.reason or "").strip().splitlines()
            why = f" ({first[0][:200]})" if first else ""  # one line: a trainer error can be a traceback
            return f"trial {self.number} did not succeed: status {self.status}{why}"
        if not self.fits:
            limit = f"{self.memory_limit_gib:g} GiB" if self.memory_limit_gib else "the GPU memory"
            peak = f"{self.peak_memory_gib:.1f} GiB" if self.peak_memory_gib is not None else "its peak memory"
            return f"trial {self.number} does not fit: {peak} exceeds {limit}"
        if self.estimated and not allow_estimated:
            return (f"trial {self.number} came from the analytic backend (a prediction, not a measurement); "
                    "pass --allow-estimated to promote it anyway")
        if self.proxy and not allow_proxy:
            return (f"trial {self.number} was measured on a proxy and composed to full size; confirm it at full "
                    f"size (moe-autotune confirm) or pass --allow-proxy")
        benchmark = self.layout.benchmark_only()
        if benchmark and not allow_benchmark:
            return (f"trial {self.number} uses {', '.join(benchmark)}, a benchmark-only setting (random routing: the "
                    f"model would not learn its router); pass --allow-benchmark to promote it anyway")
        if self.tokens_per_sec_per_gpu is None:
            return f"trial {self.number} has no measured throughput"
        return None


def gpu_memory_gib(study: optuna.Study) -> float | None:
    if study.user_attrs.get("memory_limit_gib"):
        return float(study.user_attrs["memory_limit_gib"])
    name = study.user_attrs.get("gpu")
    if not name:
        return None
    try:
        from search_spaces.hardware import load_gpu
        return float(load_gpu(name).memory_gib)
    except (ImportError, SpecError, ValueError, KeyError):
        return None


def views(study: optuna.Study) -> list[TrialView]:
    """Every trial that ran or was judged, in trial order."""
    limit = gpu_memory_gib(study)
    study_backend = study.user_attrs.get("backend", "")
    out = []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        status = attrs.get("status")
        if status is None:  # still running, or pruned before the sweep wrote anything
            continue
        try:
            layout = Layout.from_dict(attrs["layout"]) if attrs.get("layout") else None
        except SpecError:
            layout = None
        out.append(TrialView(
            number=trial.number, status=status, layout=layout, result=attrs.get("result") or {},
            prediction=attrs.get("prediction") or {}, backend=attrs.get("backend") or study_backend,
            reason=attrs.get("reason"), mlflow_run_id=attrs.get("mlflow_run_id"), memory_limit_gib=limit,
            constraints=tuple(float(c) for c in (getattr(trial, "constraints", None) or {}).values()),
            fidelity=attrs.get("fidelity") or "full", proposed_by=attrs.get("proposed_by")))
    return out


def pick(study: optuna.Study, trial_number: int | None = None, allow_estimated: bool = False,
         allow_proxy: bool = False, allow_benchmark: bool = False) -> TrialView:
    """The named trial if promotable, else the best promotable one by tokens/s/GPU."""
    all_views = views(study)
    if trial_number is not None:
        named = [v for v in all_views if v.number == trial_number]
        if not named:
            raise SpecError(f"study {study.study_name!r} has no finished trial {trial_number}")
        why = named[0].refusal(allow_estimated, allow_proxy, allow_benchmark)
        if why:
            raise SpecError(f"refusing to promote: {why}")
        return named[0]
    good = [v for v in all_views if v.refusal(allow_estimated, allow_proxy, allow_benchmark) is None]
    if not good:
        hint = ""
        if any(v.refusal(allow_estimated, allow_proxy, True) is None for v in all_views):
            hint = (" for production (only layouts with a benchmark-only setting such as routing=forced_balance "
                    "did: pass --allow-benchmark)")
        elif any(v.refusal(allow_estimated, True) is None for v in all_views):
            hint = (" at full size (only proxy measurements did: run `moe-autotune confirm` to measure the best at "
                    "full size, or pass --allow-proxy)")
        elif any(v.refusal(True, True) is None for v in all_views):
            hint = " (only analytic estimates succeeded: pass --allow-estimated)"
        raise SpecError(f"study {study.study_name!r} has no trial that succeeded and fits{hint}")
    return max(good, key=lambda v: v.tokens_per_sec_per_gpu)


def context(study: optuna.Study) -> dict[str, Any]:
    """Model, sequence length, GPU and scale of the sweep (study user_attrs, spec as fallback)."""
    attrs = study.user_attrs
    spec = attrs.get("spec") or {}
    model = attrs.get("model") or spec.get("model")
    seq_len = attrs.get("seq_len") or spec.get("seq_len")
    if not model or not seq_len:
        raise SpecError(f"study {study.study_name!r} does not record its model and seq_len")
    num_gpus = attrs.get("num_gpus") or (spec.get("nodes", 1) * spec.get("gpus_per_node", 1))
    return {"model": model, "seq_len": int(seq_len), "gpu": attrs.get("gpu") or spec.get("gpu"),
            "num_gpus": int(num_gpus), "gpus_per_node": int(spec.get("gpus_per_node") or min(8, int(num_gpus))),
            "backend": attrs.get("backend") or spec.get("backend"),
            "tracking_uri": attrs.get("tracking_uri") or spec.get("tracking_uri"),
            "mlflow_experiment_id": attrs.get("mlflow_experiment_id"),
            "mlflow_parent_run_id": attrs.get("mlflow_parent_run_id"),
            "model_overrides": spec.get("model_overrides") or {}, "cost": spec.get("cost") or {}}
