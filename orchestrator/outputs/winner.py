"""Which trial of a finished sweep may go to production, read from the Optuna storage contract.

A trial is promotable when it was measured (status ok), fits the GPU's memory, was not merely predicted by
the analytic backend (unless the caller allows estimates) and uses no benchmark-only setting (a dimension's
`benchmark_only` values, e.g. routing=forced_balance; unless the caller allows them). Every refusal is a
SpecError whose one line says why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import optuna

from search_spaces.errors import SpecError

from orchestrator.records import StudyRecord, TrialRecord


def load(storage: str, study_name: str | None = None) -> optuna.Study:
    """The study (the newest one in the storage when unnamed), or a SpecError naming what is missing."""
    from orchestrator.storage.studies import load_study

    return load_study(storage, study_name)


@dataclass(frozen=True)
class TrialView(TrialRecord):
    """One trial as the sweep recorded it (its TrialRecord), with the questions promote and report ask."""
    memory_limit_gib: float | None = None
    """The GPU memory the study's layouts must fit in (the study's)."""

    @property
    def fits(self) -> bool:
        """Measured peak within the GPU's memory; without a measurement, the cost model's verdict."""
        if not self.within_constraints:  # the sweep's own verdict (memory over the limit)
            return False
        peak = self.peak_memory_gib
        if peak is not None and self.memory_limit_gib:
            return float(peak) <= float(self.memory_limit_gib)
        return bool(self.predicted_fits)

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


def throughput(view: TrialView) -> float:
    """Its tokens/s/GPU, where the caller has made sure it has one (a promotable trial, the report's winner)."""
    assert view.tokens_per_sec_per_gpu is not None, f"trial {view.number} has no tokens/s"
    return view.tokens_per_sec_per_gpu


def gpu_memory_gib(study: optuna.Study) -> float | None:
    context = StudyRecord.of(study)
    if context.memory_limit_gib:
        return float(context.memory_limit_gib)
    if not context.gpu:
        return None
    try:
        from search_spaces.catalog.hardware import load_gpu
        return float(load_gpu(context.gpu).memory_gib)
    except (ImportError, SpecError, ValueError, KeyError):
        return None


def views(study: optuna.Study) -> list[TrialView]:
    """Every trial that ran or was judged, in trial order (still running, or pruned before the sweep wrote
    anything: none)."""
    limit = gpu_memory_gib(study)
    study_backend = StudyRecord.of(study).backend
    out = []
    for trial in study.get_trials(deepcopy=False):
        # TrialRecord.of makes a `cls` (annotated as returning TrialRecord)
        view = TrialView.of(trial, memory_limit_gib=limit)
        if view.status is None:
            continue
        out.append(view if view.backend else dataclasses.replace(view, backend=study_backend or ""))
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
    return max(good, key=throughput)


def context(study: optuna.Study) -> StudyRecord:
    """Model, sequence length, GPU and scale of the sweep (the study's record, the spec as fallback)."""
    record = StudyRecord.of(study)
    if not record.model or not record.seq_len:
        raise SpecError(f"study {study.study_name!r} does not record its model and seq_len")
    return record
