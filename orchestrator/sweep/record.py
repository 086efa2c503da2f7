"""Telling Optuna and MLflow what became of each trial.

What is stored is the storage contract of orchestrator/records/trial.py (TrialRecord): layout, layout_key,
prediction, backend, fidelity, trial_size, mlflow_run_id when a trial starts, then status, result, reason,
command; then the tell (orchestrator/records/lifecycle.py): a measurement COMPLETE with its objectives [tokens/s/GPU,
peak GiB], a failed trial FAIL, a rejected proposal PRUNED, each with the constraints memory_over_limit_gib and
not_measured_ok (feasible when both are <= 0): no value is told that was not measured. MLflow gets the same record.

Every result is judged where it enters (search_spaces.validation: numbers that cannot be true become status
invalid, never the best), and every write is fenced by the study's lease (a driver taken over writes nothing).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from search_spaces.layouts.layout import PARALLEL_SIZES, Layout
from search_spaces.result import TrialResult
from search_spaces.validation import numbers_only, validate

from orchestrator.records import SEED_SOURCES, TrialRecord, lifecycle
from orchestrator.redact import redact_mapping, redact_text
from orchestrator.search.prior import Prediction
from orchestrator.storage import run_directory, studies
from orchestrator.sweep.fidelity import WHAT_IF_SOURCES, TrialSize, full_scale
from orchestrator.sweep.lease import LeaseLost
from orchestrator.sweep.session import INTERRUPTED, Session
from orchestrator.tracking.runs import RunRecord

log = logging.getLogger("moe_autotune")


@dataclass
class Proposal:
    trial: optuna.Trial
    layout: Layout
    prediction: Prediction
    size: TrialSize  # at full size or as a proxy
    measured: TrialResult | None = None  # a result an earlier run measured but could not store


@dataclass(frozen=True)
class Screen:
    """The cost model's verdict before anything runs: the reason a proposal will not run, or None."""
    memory_limit_gib: float
    margin: float = 1.0  # the calibrated search tries near misses of the memory model on purpose

    def __call__(self, prediction: Prediction, proposed_by: str | None = None) -> str | None:
        """`proposed_by`: who queued the trial (None: the search sampled it). The search's own proposal may be a near
        miss its measured peaks say fits, and a re-run (a resume's, a confirmation) was let through before; a seed (a
        rule of thumb, a layout carried from another length) is held to the cost model's memory as it is: nothing
        has measured it (rules of thumb predicted 9-24% over ran into OOMs when the margin let them)."""
        if not prediction.legal:
            return prediction.reason or "illegal layout"
        peak = prediction.peak_memory_gib
        margin = 1.0 if proposed_by in SEED_SOURCES else self.margin
        if peak is not None and peak > margin * self.memory_limit_gib:
            return prediction.reason or f"predicted peak memory {peak:.1f} GiB"
        return None


class Recorder:
    def __init__(self, session: Session, tally: lifecycle.Tally):
        self.session = session
        self.tracker = session.tracker
        self.limit = session.memory_limit_gib
        self._unsent: dict[int, RunRecord] = {}  # told, not yet stored (writes.py): MLflow hears of them once stored
        self.tally = tally  # what became of the proposals, as the study counts them (the live line)

    @staticmethod
    def write(trial: optuna.Trial, **attrs: Any) -> None:
        """The sweep's one way to store what it knows of a trial (the storage contract: TrialRecord)."""
        TrialRecord.write(trial, **attrs)

    def start(self, p: Proposal) -> None:
        self.session.lease.fence()
        trial = p.trial
        self.write(trial, layout=p.layout, layout_key=p.layout.key(), prediction=p.prediction.data,
                   backend=self.session.spec.backend, fidelity=p.size.fidelity, trial_size=p.size.record())
        if self.session.writes.direct(trial):  # else its run is begun with its result (finish)
            self._begin_run(p, params_now=True)

    def _begin_run(self, p: Proposal, params_now: bool) -> None:
        """The trial's MLflow child run, its id stored with the trial; `params_now` False: its params go with the
        record's batch (one call less)."""
        if not self.tracker:
            return
        run_id = self.tracker.child(p.trial.number, p.layout, self.session.spec.backend, params_now=params_now)
        if run_id:  # else recorded later from the storage (at the end, or on --resume)
            self.write(p.trial, mlflow_run_id=run_id)

    def infeasible(self, trial: optuna.Trial, layout: Layout | None, prediction: Prediction | None,
                   reason: str, status: str = "infeasible") -> None:
        """A proposal the cost model (or the Layout itself) refuses: told for free, never run. `status`
        unschedulable: one the cluster can never place (always tracked: it is no cost-model rejection)."""
        self.session.lease.fence()
        memory = (prediction.peak_memory_gib if prediction else None) or 0.0
        if layout is not None:
            self.write(trial, layout=layout, layout_key=layout.key())
        else:  # not even a Layout: its params, to show what was proposed
            self.write(trial, layout=dict(trial.params))
        if prediction is not None:
            self.write(trial, prediction=prediction.data)
        self.write(trial, backend=self.session.spec.backend, status=status, reason=redact_text(reason))
        trial.set_constraint("memory_over_limit_gib", max(memory - self.limit, 0.0))
        trial.set_constraint("not_measured_ok", 1.0)
        # never told a value it did not measure: a rejection is PRUNED, its constraints saying why (TPE ranks it
        # below every feasible trial; Optuna's plots and importance leave it out); one the cluster can never place
        # failed (orchestrator/records/lifecycle.py)
        trial.study.tell(trial, state=TrialState.PRUNED if status == "infeasible" else TrialState.FAIL)
        self.tally.add_status(status)
        tracked = self.tracker and (self.session.track_rejected or status != "infeasible") and layout is not None
        self.stored(trial, self.session.mlflow_record(TrialRecord.of(trial)) if tracked else None)

    def discard(self, trial: optuna.Trial, reason: str) -> None:
        """A proposal that is not a trial at all (a repeat, nothing left to propose)."""
        self.session.lease.fence()
        self.write(trial, reason=reason)
        trial.study.tell(trial, state=TrialState.FAIL)
        self.tally.add_status(None)
        self.stored(trial, None)

    def finish(self, p: Proposal, result: TrialResult) -> dict[str, Any]:
        """Judge the result, store it, send it to MLflow; a storage that refuses it keeps it in the spool."""
        trial = p.trial
        if p.measured is None:  # a kept result was judged when it was measured: judging it again would, e.g.,
            result = self.judged(p, result)  # compose a proxy's figures to full size twice
        used, at_full = self.session.sizing.gpu_seconds(p.size, result)
        result.extra.update(gpu_seconds=used, full_size_gpu_seconds=at_full)
        memory = result.peak_memory_gib if result.peak_memory_gib is not None else p.prediction.peak_memory_gib
        ok = result.status == "ok" and result.tokens_per_sec_per_gpu is not None
        over = (memory or 0.0) - self.limit
        if result.status == "oom":
            over = max(over, 1.0)  # it did not fit, whatever the partial numbers say
        _redact_result(result)  # stored and sent to MLflow: no credential a trainer's error quoted
        attrs: dict[str, Any] = {"status": result.status, "result": result}
        if result.error:
            attrs["reason"] = result.error[:2000]
        attrs.update(failure_attrs(result))
        attrs.update(stop_attrs(result))
        if result.extra.get("command"):
            attrs["command"] = result.extra["command"]
        self.session.lease.fence()
        if not self.session.writes.direct(trial):
            self._begin_run(p, params_now=False)
        try:
            self.write(trial, **attrs)
            trial.set_constraint("memory_over_limit_gib", max(over, 0.0))
            trial.set_constraint("not_measured_ok", 0.0 if ok else 1.0)
            if ok:  # a measurement: its objectives
                trial.study.tell(trial, [_finite(result.tokens_per_sec_per_gpu), _finite(memory)])
            else:  # failed (oom, error, timeout, invalid, unschedulable): FAIL, with no value it did not measure;
                # pruned (it could not win: sweep/steps.py): PRUNED, its steps its intermediate values
                trial.study.tell(trial, state=TrialState.PRUNED if result.status == "pruned" else TrialState.FAIL)
            self.tally.add_status(result.status)
        except studies.STORAGE_ERRORS:
            self._fence_if_readable()
            try:
                self.session.spool.add(trial.number, dict(trial.params), TrialRecord.of(trial).with_attrs(**attrs))
            except OSError as refused:  # the run directory too: the sweep's fault, the trial run again on --resume
                raise run_directory.failure(refused, trial.number) from None
            raise
        # each of its MLflow writes passes the lease's fence (orchestrator/tracking/client.py, FencedClient)
        self.stored(trial, self.session.mlflow_record(TrialRecord.of(trial).with_attrs(**attrs))
                    if self.tracker else None)
        return {"trial": trial.number, "layout": short_label(p.layout), "status": result.status,
                "fidelity": p.size.fidelity,
                "tokens": result.tokens_per_sec_per_gpu, "predicted": p.prediction.tokens_per_sec_per_gpu,
                "memory": result.peak_memory_gib, "fits": ok and over <= 0}

    def stored(self, trial: optuna.Trial, run: RunRecord | None) -> None:
        """`trial` was told: the trials now stored get their MLflow records, in order, never before they are
        stored (MLflow is a view of the storage)."""
        if run is not None:
            self._unsent[trial.number] = run
        self.send(self.session.writes.told(trial))

    def flush(self) -> None:
        """Store what can be stored (the end of a sweep), and send it to MLflow."""
        self.send(self.session.writes.flush())

    def send(self, numbers: list[int]) -> None:
        for number in numbers:
            run = self._unsent.pop(number, None)
            if run is not None and self.tracker:
                self.tracker.record(run)

    def judged(self, p: Proposal, result: TrialResult) -> TrialResult:
        """The result the sweep records, judged where it enters: a proxy's measurement as it ran, then composed
        to the full layout (its peak is then a prediction: above the limit it does not fit, not invalid); any
        other result (full size, or a what-if backend's answer for the full layout) as the full layout's."""
        prior, spec, size = self.session.prior, self.session.spec, p.size
        what_if = isinstance(result.extra, dict) and result.extra.get("source") in WHAT_IF_SOURCES
        plan = None if what_if else size.plan  # a proxy's: its measurement is composed
        composed = plan is not None
        if plan is not None:
            result = validate(result, size.layout, prior.gpu, model=plan.model, seq_len=spec.seq_len,
                              num_gpus=size.world)
        result = full_scale(size, result, prior.gpu, spec.seq_len)
        full = size.plan.full_layout if size.plan is not None else size.layout
        # a failed run's claims too: what is recorded is a number or nothing
        return numbers_only(validate(result, full, prior.gpu, model=prior.model, seq_len=spec.seq_len,
                                     num_gpus=self.session.sizing.num_gpus, memory_measured=not composed))

    def _fence_if_readable(self) -> None:
        """The fence before the spool: a storage that cannot even be read says nothing about the lease."""
        try:
            self.session.lease.fence()
        except studies.STORAGE_ERRORS:
            pass

    def interrupted(self, proposals: list[Proposal]) -> None:
        """Trials running when the sweep stopped: failed with the reason (re-run on --resume, or recorded from
        the result they stored before their tell); nothing when another driver has taken the study over (its
        recovery re-runs them). A trial already told, or kept in the result spool, is left as it is: it was
        measured, and failing it now would count it once and run it again."""
        try:
            self.session.lease.fence()
        except LeaseLost:
            return
        except Exception as exc:  # noqa: BLE001 -- a storage that cannot be read: try the writes below anyway
            log.warning("could not check the driver lease before marking trials interrupted: %s",
                        redact_text(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__)
        settled = self._settled(proposals)
        for p in proposals:
            if p.trial.number in settled:
                continue
            try:
                self.write(p.trial, reason=INTERRUPTED, status="interrupted")
                p.trial.study.tell(p.trial, state=TrialState.FAIL)
                if self.tracker:
                    self.tracker.mark_failed(p.trial.number, INTERRUPTED)
            except Exception as exc:  # noqa: BLE001 -- the sweep is stopping anyway; --resume finds it RUNNING
                log.warning("could not mark trial %d as interrupted (%s); --resume will re-run it", p.trial.number,
                            self._why(exc))
        try:  # an analytic sweep's told trials not yet stored (writes.py): stored now, as far as they can be
            self.flush()
        except LeaseLost:
            return
        except Exception as exc:  # noqa: BLE001 -- the sweep is stopping anyway; --resume asks them again
            # info, not a warning: the line the sweep stops with says what failed
            log.info("could not store the trials told before the sweep stopped (%s); --resume asks them again",
                     self._why(exc))

    def _why(self, exc: Exception) -> str:
        if isinstance(exc, studies.STORAGE_ERRORS):
            return type(studies.storage_failure(exc, self.session.spec.storage)).__name__
        return redact_text(f"{type(exc).__name__}: {exc}")

    def _settled(self, proposals: list[Proposal]) -> set[int]:
        """The numbers of those that need no marking: told (finished in their study) or kept in the result spool."""
        numbers = {p.trial.number for p in proposals}
        settled = {n for n in self.session.spool.records() if n in numbers}
        try:
            for study in {id(p.trial.study): p.trial.study for p in proposals}.values():
                settled |= {t.number for t in study.get_trials(deepcopy=False)
                            if t.number in numbers and t.state.is_finished()}
        except Exception as exc:  # noqa: BLE001 -- a storage that cannot be read: the writes below say more
            log.warning("could not read which trials were told before marking them interrupted: %s",
                        type(exc).__name__)
        return settled


def _redact_result(result: TrialResult) -> None:
    """The free text of a result (its error, the command it ran) with every credential shape masked."""
    result.error = redact_text(result.error)
    result.failure_reason = redact_text(result.failure_reason)
    if isinstance(result.extra, dict) and result.extra.get("command"):
        result.extra["command"] = redact_mapping(result.extra["command"])
    if isinstance(result.extra, dict) and result.extra.get("failures"):
        result.extra["failures"] = redact_mapping(result.extra["failures"])


def failure_attrs(result: TrialResult) -> dict[str, Any]:
    """A failed trial's root cause as stored fields (what the leaderboard and the child run's tags show)."""
    values = {"failure_class": result.failure_class, "failure_rank": result.failure_rank,
              "failure_reason": result.failure_reason}
    return {k: v for k, v in values.items() if v is not None}


def stop_attrs(result: TrialResult) -> dict[str, Any]:
    """The rule that stopped a trial early (search_spaces/stopping.py) as a stored field, and the reason of one that
    still measured (measured enough: its interval) where it has no error to say why."""
    rule = result.extra.get("stop_rule") if isinstance(result.extra, dict) else None
    if not isinstance(rule, str):
        return {}
    attrs: dict[str, Any] = {"stop_rule": rule}
    if not result.error and isinstance(result.extra.get("stop_reason"), str):
        attrs["reason"] = result.extra["stop_reason"][:2000]
    return attrs


def short_label(layout: Layout) -> str:
    """The parallel sizes above 1 and the recompute choice (the progress view's layout column)."""
    parts = [f"{name}{value}" for name, value in layout.params((*PARALLEL_SIZES, "mbs")).items() if value != 1]
    parts.append(f"rc={layout.recompute}")
    return " ".join(parts)


def _finite(value: Any) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0
