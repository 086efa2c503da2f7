"""`moe-autotune confirm STUDY --top K`: run the best proxy-measured layouts at full size, as trials of the same
study, so that production is chosen on full-size measurements (promote refuses a proxy-only winner).

The confirmations are enqueued trials of a resumed sweep with `fidelity: full` and a budget of exactly K more
trials; the study's lease, situation check and MLflow records work as for any resume.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from search_spaces.errors import SpecError

from orchestrator.records import StudyRecord, TrialRecord, enqueue, queries
from orchestrator.spec.schema import SweepSpec, parse_spec
from orchestrator.storage import studies
from orchestrator.sweep.loop import Sweep, SweepOutcome
from orchestrator.sweep.session import open_session


@dataclass
class Confirmation:
    proxy: optuna.trial.FrozenTrial
    full: optuna.trial.FrozenTrial | None

    @property
    def error(self) -> float | None:
        """Composed (proxy) over measured (full size) tokens/s, minus 1."""
        if self.full is None or not queries.fits(self.full) or not self.full.values[0]:
            return None
        return self.proxy.values[0] / self.full.values[0] - 1


def proxy_winners(study: optuna.Study, top: int) -> list[optuna.trial.FrozenTrial]:
    """The best `top` proxy trials that fit and have no full-size run of their layout yet."""
    confirmed = {r.layout_key for r in queries.measured_records(study) if not r.proxy}
    ranked = sorted((t for t in queries.finished_trials(study) if queries.fits(t)
                     and TrialRecord.of(t).proxy and TrialRecord.of(t).layout_key not in confirmed),
                    key=lambda t: -t.values[0])
    return ranked[:top]


def confirm(storage: str, study_name: str | None, top: int, overrides: dict) -> tuple[list[Confirmation], SweepOutcome]:
    study = studies.load_study(storage, study_name)
    picks = proxy_winners(study, top)
    if not picks:
        raise SpecError(f"study {study.study_name!r} has no proxy trial that fits and is not confirmed yet")
    spec = _full_size_spec(study, storage, len(picks), overrides)
    session = open_session(spec, resume=True)
    try:
        for t in picks:
            enqueue(session.study, t.params, proposed_by="confirm", confirms=t.number)
        outcome = Sweep(session, show_progress=overrides.get("show_progress", True)).run()
    finally:
        session.close()
    by_proxy = {TrialRecord.of(t).confirms: t for t in outcome.study.get_trials(deepcopy=False)
                if TrialRecord.of(t).confirms is not None and t.state.is_finished()}
    return [Confirmation(p, by_proxy.get(p.number)) for p in picks], outcome


def _full_size_spec(study: optuna.Study, storage: str, count: int, overrides: dict) -> SweepSpec:
    data = dict(StudyRecord.of(study).spec)
    if not data:
        raise SpecError(f"study {study.study_name!r} records no spec to confirm with")
    measured = len(queries.measured_trials(study))
    data.update({"storage": storage, "fidelity": "full",
                 "budget": {**(data.get("budget") or {}), "n_trials": measured + count}})
    for key in ("trial_gpus", "tracking_uri", "ray_address"):
        if overrides.get(key) is not None:
            data[key] = overrides[key]
    full = int(data.get("nodes", 1)) * int(data.get("gpus_per_node", 8))
    if data.get("trial_gpus") is not None and data["trial_gpus"] < full:
        raise SpecError(f"confirming at full size needs {full} GPUs per trial, but trial_gpus is "
                        f"{data['trial_gpus']}; pass --trial-gpus {full} on an allocation that large")
    return parse_spec(data)
