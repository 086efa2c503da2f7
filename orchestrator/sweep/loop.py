"""The sweep loop: propose -> screen -> dispatch -> record, until the budget is spent.

    propose   Optuna asks its sampler for a trial: every search dimension is a parameter, the params name a
              Layout (the rules of thumb and re-runs are enqueued trials, taken first)
    screen    the cost model: a layout that is illegal, or that it says cannot fit, is told to Optuna as
              infeasible with the reason, for free (never run)
    dispatch  a backend runs the trial (a future); up to max_concurrent at once
    record    the result is judged (search_spaces.validation), told to Optuna, then sent to MLflow

Order of writes per trial, so that a SIGKILL anywhere loses nothing and doubles nothing: ask -> user attrs
(layout, prediction, mlflow_run_id) -> run -> user attrs (status, result) -> tell -> MLflow child finished.
(An analytic sweep asks and tells on an in-memory copy of the study and stores each finished trial whole, then
sends it to MLflow: sweep/writes.py.)
The tell is the commit: a trial stopped before it (Ctrl-C, SIGTERM, SIGKILL) is failed as interrupted, its
child run closed FAILED, and `--resume` measures it again, or records the result it had already stored, as a
new trial; a trial told is never run again (its MLflow record is completed on resume).
Opening and resuming (stores checked first, the lease, the situation, recovery) is `session.py`.
"""

from __future__ import annotations

import concurrent.futures
import gc
import io
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import optuna

from search_spaces.result import MEASURED_STATUSES, TrialResult

from orchestrator.dispatch.base import stop, submit
from orchestrator.errors import RunDirectoryError, TrackingLost
from orchestrator.records import HEADLINE, TrialRecord, lifecycle, metrics, queries
from orchestrator.search.prior import Prior
from orchestrator.spec.schema import WHAT_IF_BACKENDS, SweepSpec
from orchestrator.storage import run_directory, studies
from orchestrator.sweep.convergence import Convergence
from orchestrator.sweep.lease import LeaseLost
from orchestrator.sweep.progress import SweepProgress
from orchestrator.sweep.record import INTERRUPTED, Proposal, Recorder, Screen
from orchestrator.sweep.session import Session, open_session
from orchestrator.sweep.steps import StepWatcher
from orchestrator.tracking.tracker import Tracker

log = logging.getLogger("moe_autotune")


@dataclass
class SweepOutcome:
    study: optuna.Study
    best: optuna.trial.FrozenTrial | None
    pareto: list[optuna.trial.FrozenTrial]
    n_measured: int
    n_infeasible: int
    wall_time_s: float
    summary: queries.StudySummary
    """The study as every view counts it (its lifecycle tally, spend, best): what the command prints."""
    mlflow_pending: int = 0
    messages: list[str] = field(default_factory=list)
    stopped: str | None = None
    """Why the sweep stopped (StudyRecord.stopped): converged, its budget with the chance that remains, ..."""
    exit_code: int = field(init=False)
    """3: MLflow did not receive every record (kept for --resume); 0: a layout was measured that fits; else 1."""

    def __post_init__(self) -> None:
        self.exit_code = 3 if self.mlflow_pending else 0 if self.best is not None else 1


class Dispatcher:
    """Runs proposals on the backend, at most `limit` at once."""

    def __init__(self, session: Session, limit: int):
        self.session = session
        self.limit = limit
        assert session.backend is not None, "open_session starts the backend"
        self.backend = session.backend  # the session's: it closes it (Session.close), after the last record
        self.running: dict[concurrent.futures.Future, Proposal] = {}
        self.steps = StepWatcher(session)  # the running trials' steps: reported, and the cannot-win rule asked
        # a backend whose trials run writes in their folders (what-if backends answer without running anything)
        self.writes_folders = session.spec.backend not in WHAT_IF_BACKENDS
        self.fault: RunDirectoryError | None = None
        """The run directory refused a trial's writes: the sweep stops, that trial left running (interrupted)."""

    def submit(self, proposal: Proposal) -> None:
        """Start the trial; its folder is asked first whether it takes writes (a refusal fails the trial's future, and
        `done` makes it the sweep's fault, not the layout's)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if proposal.measured is not None:  # kept from an earlier run: recorded, not run again
            future.set_result(proposal.measured)
        else:
            request = self.session.request(proposal.trial.number, proposal.size)
            refused = run_directory.probe(request.workdir) if self.writes_folders else None
            if refused is not None:
                future.set_exception(refused)
            else:
                future = submit(self.backend, request, self.steps.feed(proposal))
        self.running[future] = proposal

    def done(self, timeout: float) -> list[tuple[concurrent.futures.Future, Proposal, TrialResult]]:
        """Trials the backend has finished. They stay `running` until `settle`d once recorded: a sweep stopped
        while one is being recorded (or waits to be) fails it with the others, never leaves it half-recorded."""
        finished, _ = concurrent.futures.wait(self.running, timeout=timeout,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
        out = []
        for future in finished:
            proposal = self.running[future]
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 -- a backend bug becomes the trial's error, not a lost trial
                result = TrialResult(status="error", error=f"backend failed: {type(exc).__name__}: {exc}")
            fault = self._environment(proposal, result)
            if fault is not None:  # left running: the stop records it as interrupted, --resume runs it again
                self.fault = self.fault or fault
                continue
            out.append((future, proposal, result))
        return out

    def _environment(self, proposal: Proposal, result: TrialResult) -> RunDirectoryError | None:
        """A trial that failed in a folder that no longer takes writes (a read-only or full run directory, the
        trainer unable to write its result) failed by the environment: the sweep's fault, not its layout's."""
        if result.status != "error" or not self.writes_folders:
            return None
        number = proposal.trial.number
        refused = run_directory.probe(self.session.trial_folder(number))
        return run_directory.failure(refused, number) if refused is not None else None

    def settle(self, future: concurrent.futures.Future) -> None:
        """The trial of `future` is recorded: no longer running."""
        self.running.pop(future, None)

    @property
    def busy(self) -> set[tuple[str, str]]:
        return {(p.layout.key(), p.size.fidelity) for p in self.running.values()}

    def stop(self) -> None:
        """The sweep stops: the running trials' process trees are killed now, while they are recorded."""
        stop(self.backend)


class Sweep:
    """One run of the loop over an open session."""

    def __init__(self, session: Session, show_progress: bool = True):
        self.session = session
        self.spec = session.spec
        self.study = session.study
        at_start = session.summary()
        self.recorder = Recorder(session, at_start.tally)  # the live line counts on from what the study holds
        self.screen = Screen(session.memory_limit_gib, session.search.memory_margin)
        self.show_progress = show_progress
        # a layout runs once at each fidelity (`confirm` re-runs a proxy's layout at full size)
        self.taken = at_start.run_keys
        self.measured = at_start.measured
        self.best = at_start.best.values[0] if at_start.best is not None else 0.0  # tokens/s/GPU that fit
        self.proposals = 0
        self.stop_reason: str | None = None
        self.convergence = Convergence(self.spec.budget, session.search)
        self.finished = 0  # trials finished in this run (convergence is asked once per finished trial)
        self.messages: list[str] = []

    def run(self) -> SweepOutcome:
        start = time.monotonic()
        dispatcher = Dispatcher(self.session, self.spec.budget.max_concurrent)
        try:
            self.session.lease.store(stopped=None)  # an earlier run's stop is no longer why: this run says its own
            with SweepProgress(f"sweep {self.spec.name}", self.spec.budget.n_trials,
                               enabled=self.show_progress) as view:
                view.bar.update(view.task, completed=self.measured)
                out_of_time = self._loop(dispatcher, view, start)
                self.recorder.flush()  # nothing is left untold: everything told is stored (writes.py)
        except LeaseLost:  # another driver took the study over: it recovers the running trials, not us
            raise
        except optuna.exceptions.UpdateFinishedTrialError:
            # Optuna refused a write to a trial another driver has finished: the study was taken over between
            # our fence and this write (a rival that keeps no fencing epoch: an older moe-autotune); the fence says so
            self.session.lease.fence()
            raise
        except studies.STORAGE_ERRORS as exc:  # e.g. a full disk: one line naming it, exit 4
            dispatcher.stop()
            _release_what_the_stop_cut_off(exc)
            self.recorder.interrupted(list(dispatcher.running.values()))
            raise studies.storage_failure(exc, self.spec.storage) from None
        except BaseException as exc:  # Ctrl-C, scancel, a crash: say what happened to the running trials
            dispatcher.stop()
            _release_what_the_stop_cut_off(exc)
            self.recorder.interrupted(list(dispatcher.running.values()))
            raise
        self._check_converged()  # the last trial's, if the loop's last pass did not ask
        if self.stop_reason:
            self.messages.append(self.stop_reason)
        stopped = self.stop_reason or self.convergence.at_budget(out_of_time, self.measured)
        return summarise(self.session, start, self.measured, self.messages, stopped)

    def _loop(self, dispatcher: Dispatcher, view: SweepProgress, start: float) -> bool:
        """Run trials until the budget or a stop; True when it stopped for budget.wall_time_s."""
        budget = self.spec.budget
        max_proposals = budget.n_trials * budget.max_proposals_per_trial
        while True:
            self.session.lease.heartbeat()
            out_of_time = budget.wall_time_s is not None and time.monotonic() - start > budget.wall_time_s
            while (self.stop_reason is None and not out_of_time and len(dispatcher.running) < dispatcher.limit
                   and self.measured + len(dispatcher.running) < budget.n_trials):
                if self.proposals >= max_proposals:
                    self.stop_reason = f"stopped proposing after {max_proposals} proposals"
                    break
                self.proposals += 1
                proposal = self._propose(dispatcher.busy)
                if proposal is None:
                    view.advance(None, len(dispatcher.running), self.measured, self.recorder.tally)
                    continue
                self.taken.add((proposal.layout.key(), proposal.size.fidelity))
                dispatcher.submit(proposal)
            if not dispatcher.running:
                return out_of_time
            for future, proposal, result in dispatcher.done(timeout=1.0):
                self.finished += 1
                dispatcher.steps.finished(proposal)  # its last steps reported before its tell
                row = self.recorder.finish(proposal, result)
                dispatcher.settle(future)
                if row["status"] in MEASURED_STATUSES:  # an unschedulable trial never ran: free, as a rejection
                    self.measured += 1
                if row["fits"] and row["tokens"] and row["tokens"] > self.best:
                    self.best = row["tokens"]
                view.advance(row, len(dispatcher.running), self.measured, self.recorder.tally)
            if dispatcher.fault is not None:  # the environment, not a layout: the sweep stops (exit 7, or 4)
                raise dispatcher.fault
            dispatcher.steps.poll()
            self._check_converged()

    def _check_converged(self) -> None:
        """Stop proposing once the calibrated search's chance that a layout beats its answer (the measured layout it
        believes fastest) by more than the margin is below the spec's bound (budget.converge_below)."""
        if self.stop_reason is None:
            self.stop_reason = self.convergence.check(self.session.writes.study, self.finished,
                                                      (k for k, _ in self.taken if k), self.best, self.measured)

    def _propose(self, busy: set[tuple[str, str]]) -> Proposal | None:
        """The next trial to run, or None after telling Optuna why a proposal will not run."""
        self.session.lease.fence()  # asking creates a trial: a write
        proposed = self.session.search.propose(self.session.writes.study)
        trial, layout, prediction = proposed.trial, proposed.layout, proposed.prediction
        if proposed.queued.proposed_by is None:  # sampled (not a rule of thumb or a re-run from the queue)
            if proposed.exhausted:
                self.stop_reason = "every layout of the space has been tried"
                self.recorder.discard(trial, self.stop_reason)
                return None
            self.recorder.write(trial, proposed_by=self.spec.search)
        if layout is None or prediction is None:  # not even a valid Layout (e.g. GBS not a multiple of MBS)
            self.recorder.infeasible(trial, None, None, proposed.invalid or "not a layout")
            return None
        size = self.session.sizing.size(layout)
        taken = (layout.key(), size.fidelity)
        if taken in self.taken or taken in busy:
            self.recorder.discard(trial, f"repeated proposal of {taken[0]} ({taken[1]} size)")
            return None
        reason = self.screen(prediction, proposed.queued.proposed_by) or size.refusal
        if reason:
            self.recorder.infeasible(trial, layout, prediction, reason)
            return None
        request = self.session.request(trial.number, size)
        reason = self.session.unplaceable(request)
        if reason:  # larger than any set of the cluster's nodes: refused, never run (free, as a rejection)
            self.recorder.infeasible(trial, layout, prediction, f"never placeable on this Ray cluster: {reason}",
                                     status="unschedulable")
            self.taken.add(taken)  # recorded once: a repeat of it is discarded
            return None
        proposal = Proposal(trial, layout, prediction, size, measured=_kept_result(proposed.queued))
        self.recorder.start(proposal)
        return proposal


def _kept_result(queued: TrialRecord) -> TrialResult | None:
    """A result an earlier driver measured but could not store (the spool), re-read: judged like any other when
    recorded; one that is not even a result is recorded as invalid, with the reason."""
    kept = queued.measured_result
    if not kept:
        return None
    try:
        return TrialResult.from_dict(kept)
    except (TypeError, ValueError, AttributeError) as exc:
        return TrialResult(status="invalid", error=f"the kept result is not a trial result: {exc}"[:500])


def summarise(session: Session, start: float, measured: int, messages: list[str],
              stopped: str | None = None) -> SweepOutcome:
    """The best and the Pareto front; the parent MLflow run gets them when every record was delivered. `stopped`:
    why the sweep stopped, stored on the study (`status` and the report say it)."""
    study = session.study
    session.lease.fence()  # the parent run's summary is a write
    _record_answer(session)
    if stopped is not None:
        session.lease.store(stopped=stopped)
    found = session.summary()
    best, pareto = found.best, found.pareto
    pending = 0
    if session.tracker:
        try:
            pending = session.tracker.flush()
            if not pending:
                session.tracker.verify()  # a store (or its parent run) gone since its last write: one line, exit 8
                _log_views(session.tracker, study)
                session.tracker.finish(_summary(session, found, measured, messages, stopped),
                                       _pareto_csv(study, pareto))
        except TrackingLost:  # the records are in the Optuna storage: --resume makes them in the store
            raise
        except Exception as exc:  # noqa: BLE001 -- MLflow down at the end: said below, exit code 3
            pending = max(pending, 1)
            messages.append(f"MLflow: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        if pending:
            messages.append(f"MLflow did not receive {pending} trial record(s); they are kept in the Optuna "
                            f"storage and {session.tracker.spool.path}; rerun with --resume to deliver them")
    n_infeasible = found.tally.counts[lifecycle.REJECTED]
    unplaced = sum(1 for r in found.records.values() if r.status == "unschedulable")
    if unplaced:
        messages.append(f"{unplaced} trial(s) could not be placed on the Ray cluster: status unschedulable, never run "
                        f"(the reason of each: moe-autotune status)")
    return SweepOutcome(study=study, best=best, pareto=pareto, n_measured=measured, n_infeasible=n_infeasible,
                        wall_time_s=time.monotonic() - start, summary=found, mlflow_pending=pending,
                        messages=messages, stopped=stopped)


def _record_answer(session: Session) -> None:
    """Store the sweep's answer: a fitting trial of the layout its search believes fastest, a full-size one first (a
    search with no belief stores none, and the best measured trial is the answer: queries.best_fitting_trial)."""
    layout = session.search.answer(session.writes.study)
    session.lease.store(answer=queries.fitting_trial_of(session.study, layout.key()) if layout is not None else None)


def _log_views(tracker: Tracker, study: optuna.Study) -> None:
    """The sweep's views on its parent run: the leaderboard (an MLflow table and a CSV), the Pareto plot and the
    report page (no PNGs: no headless Chrome at every sweep's end; no packed-vs-full comparison, which explores
    the space twice; no parameter importance, whose fANOVA loads scikit-learn, a second or two of every sweep:
    `moe-autotune report` draws them)."""
    import tempfile

    from orchestrator.outputs import report

    with tempfile.TemporaryDirectory(prefix="moe-autotune-report-") as tmp:
        page = report.write(study, tmp, pngs=False, compare_packing=False, importance=False)
        tracker.log_views(queries.leaderboard(study), report.pareto_figure(study),
                          [page.html_path, *page.pngs.values()])


def _summary(session: Session, found: queries.StudySummary, measured: int, notes: list[str],
             stopped: str | None) -> dict[str, Any]:
    best = found.best
    summary: dict[str, Any] = {
        "n_trials": measured,
        "stopped": stopped,  # why: converged, its budget (with the chance that remains), everything tried, ...
        "notes": list(notes),  # why it stopped on its own (converged, everything tried, the cap), what it could not
        "best": None if best is None else _best(found.records[best.number]),
        "pareto": [t.number for t in found.pareto],
        "trials_by_state": dict(found.tally.counts),  # the trial lifecycle's counts (records/lifecycle.py)
        "gpu_hours": found.spend.gpu_hours, "gpu_hours_to_best": found.gpu_hours_to_best,
        "gpu_hours_predicted": found.predicted}
    if not session.track_rejected:  # rejections got no child runs: one table on the parent instead
        frame = queries.leaderboard(session.study)
        rows = frame[frame["status"] == "infeasible"]
        summary["rejected_by_model"] = rows.to_dict(orient="records") if not rows.empty else []
    return summary


def _best(record: TrialRecord) -> dict[str, Any]:
    """The parent run's summary of the best trial: its layout and HEADLINE figures."""
    return {"trial": record.number, "layout": record.layout.to_dict() if record.layout else None,
            "layout_key": record.layout_key, "measured": {m.name: record.measured(m.name) for m in metrics(HEADLINE)}}


def _pareto_csv(study: optuna.Study, pareto: list) -> str:
    buf = io.StringIO()
    frame = queries.leaderboard(study)
    frame[frame["trial"].isin([t.number for t in pareto])].to_csv(buf, index=False)
    return buf.getvalue()


def run_sweep(spec: SweepSpec, resume: bool = False, prior: Prior | None = None, show_progress: bool = True,
              run_tags: dict[str, str] | None = None) -> SweepOutcome:
    session = open_session(spec, resume=resume, prior=prior, run_tags=run_tags)
    try:
        return Sweep(session, show_progress=show_progress).run()
    finally:
        session.close()


def _release_what_the_stop_cut_off(exc: BaseException) -> None:
    """A stop (or a storage error) can land while a storage write is half done: the frames it unwound may still
    hold that write's SQLite cursor, whose connection SQLAlchemy has closed. SQLite keeps such a connection, and
    its write lock, until the cursor's statement is finalized, and the stop's own writes below would wait
    SQLITE_BUSY_S each for this process's own lock. Clearing the frames' locals (the traceback itself is kept) and
    collecting finalizes it."""
    traceback.clear_frames(exc.__traceback__)
    gc.collect()


__all__ = ["INTERRUPTED", "Sweep", "SweepOutcome", "run_sweep"]
