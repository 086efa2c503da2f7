"""Opening a sweep: every store checked first, then the study created (or resumed), its lease taken, MLflow
started; on --resume the situation checked and what a dead or stopped driver left behind recovered.

Nothing is created before the MLflow store, the Optuna storage and the work directory are known to work,
and (for a new study) before the cost model finds something that fits: a bad input is one line and leaves
nothing behind that a corrected rerun would trip over.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from search_spaces.errors import SpecError
from search_spaces.failures import RECORD_SUFFIX
from search_spaces.layouts.emptiness import why_empty
from search_spaces.layouts.space import explore
from search_spaces.result import MEASURED_STATUSES

from orchestrator import dispatch
from orchestrator.dispatch import Backend, TrialRequest, canonical_backend
from orchestrator.dispatch.base import unplaceable
from orchestrator.errors import LeaseLost, StorageError, TrackingLost
from orchestrator.records import StudyRecord, TrialRecord, enqueue, queries
from orchestrator.redact import redact_mapping, redact_text
from orchestrator.search.prior import Prior, make_prior
from orchestrator.search.proposer import Proposer
from orchestrator.search.space import SweepSpace
from orchestrator.spec.schema import WHAT_IF_BACKENDS, SweepSpec
from orchestrator.storage import studies
from orchestrator.sweep import held
from orchestrator.sweep.fidelity import Sizing, TrialSize
from orchestrator.sweep.lease import Lease
from orchestrator.sweep.spool import ResultSpool
from orchestrator.sweep.writes import DirectWrites, SweepWrites, sweep_writes
from orchestrator.tracking.runs import RunRecord
from orchestrator.tracking.tracker import Tracker

log = logging.getLogger("moe_autotune")

# why a trial that was running when the sweep was stopped (Ctrl-C, SIGTERM from scancel) was failed
INTERRUPTED = "sweep interrupted"


@dataclass
class Session:
    spec: SweepSpec
    search: Proposer
    """The search (orchestrator/search/proposer.py): the prior, the space and the sampler, which the loop asks for
    each proposal."""
    study: optuna.Study
    lease: Lease
    tracker: Tracker | None
    spool: ResultSpool
    workdir: Path
    resumed: bool
    messages: list[str] = field(default_factory=list)
    backend: Backend | None = None
    """What runs the trials, started (Ray) and asked whether it can place a trial at all before anything was
    stored (open_session); closed with the session."""
    writes: SweepWrites = field(init=False)
    """Where the loop asks and tells (writes.py): the study itself until the session has started."""
    sizing: Sizing = field(init=False)
    """Which size each trial runs at and what it costs (fidelity.py): the spec read once, here."""
    memory_limit_gib: float = field(init=False)
    """The memory a GPU has: above it a layout does not fit."""

    def __post_init__(self) -> None:
        self.writes = DirectWrites(self.study)
        self.sizing = Sizing.of(self.spec, self.prior.model, self.prior.gpu, self.prior.num_gpus)
        self.memory_limit_gib = self.search.memory_limit_gib

    @property
    def prior(self) -> Prior:
        return self.search.prior

    @property
    def space(self) -> SweepSpace:
        return self.search.space

    @property
    def track_rejected(self) -> bool:
        return self.spec.tracks_rejections

    def request(self, number: int, size: TrialSize) -> TrialRequest:
        """What the backend runs: the layout at its size (what-if backends answer for the full layout)."""
        spec = self.spec
        if spec.backend in WHAT_IF_BACKENDS and size.plan is not None:
            layout, world, layers = size.plan.full_layout, self.sizing.num_gpus, self.sizing.num_layers
        else:
            layout, world, layers = size.layout, size.world, size.num_layers
        nodes, per_node = self.sizing.placement(world)
        lengths = spec.packing.lengths if spec.packing.mode == "packed" else None  # packed has them (Packing)
        return TrialRequest(layout=layout, model=spec.model, seq_len=spec.seq_len, gpu=spec.gpu,
                            num_gpus=world, nodes=nodes, gpus_per_node=per_node,
                            steps=spec.steps, warmup=spec.warmup, timeout_s=spec.trial_timeout_s,
                            workdir=self.trial_folder(number), num_layers=layers,
                            hidden_size=spec.model_overrides.hidden_size, trial_number=number,
                            lengths=str(Path(lengths).resolve()) if lengths is not None else None,
                            **self._stopping())

    def _stopping(self) -> dict[str, Any]:
        """The rules the trainer applies itself (search_spaces/stopping.py), as TrialRequest's fields."""
        stop = self.spec.stopping
        limit = (stop.memory_limit_gib or self.memory_limit_gib) if stop.will_not_fit else None
        return {"stop_within": stop.measured_within, "min_measured": stop.min_measured_steps,
                "memory_limit_gib": limit}

    def trial_folder(self, number: int) -> Path:
        """Where trial `number` keeps its files (its logs, result and failure records) in the run directory."""
        return self.workdir / f"trial-{number:04d}"

    def summary(self) -> queries.StudySummary:
        """The study as every view counts it (records/queries.py): its lifecycle tally, measured trials, best."""
        return queries.summary(self.study)

    def unplaceable(self, request: TrialRequest) -> str | None:
        """Why the cluster can never place a trial of `request` (None: it can, or has no such limit)."""
        return unplaceable(self.backend, request.nodes, request.gpus_per_node)

    def mlflow_record(self, record: TrialRecord) -> RunRecord:
        """What a trial's child run gets: its record (the sweep's backend when it records none) and its logs: every
        node's log and every rank's failure record (search_spaces.failures), redacted as they are logged."""
        if record.backend is None:
            record = record.with_attrs(backend=self.spec.backend)
        folder = self.trial_folder(record.number)
        logs = sorted(str(p) for pattern in ("*.log", f"*{RECORD_SUFFIX}") for p in folder.glob(pattern))
        return RunRecord(record, tuple(logs))

    def _close_tracker(self) -> None:
        """The MLflow writer ended, every record it was sent made; at once when the lease was lost (the driver that
        took the study makes them from the storage)."""
        assert self.tracker is not None
        try:
            self.tracker.close()
        except LeaseLost:
            log.info("the study was taken over: its last MLflow records are the new driver's to make")
        except TrackingLost:  # the sweep's line says so; the records are in the storage for --resume
            log.info("the MLflow store vanished: its last records are made by --resume")

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()  # its trials are recorded: Ray goes first, then the MLflow writer and the lease
        if self.tracker:
            self._close_tracker()  # before the lease is released: the writer writes under it
        try:
            self.lease.release()
        except studies.STORAGE_ERRORS as exc:  # a full disk (its own error line says so): the lease expires
            log.info("could not release the study's lease (%s); it expires when this process is gone",
                     type(studies.storage_failure(exc, self.spec.storage)).__name__)
        studies.let_go(self.lease.storage)


def open_session(spec: SweepSpec, resume: bool = False, prior: Prior | None = None,
                 run_tags: dict[str, str] | None = None) -> Session:
    """`run_tags`: tags for the parent MLflow run (e.g. the Slurm job and Ray cluster the sweep runs on)."""
    if spec.lengths:
        raise SpecError("a length family runs with orchestrator.sweep.family.run_family, one length at a time")
    prior = prior or make_prior(spec)
    prior.model, prior.gpu  # noqa: B018 -- unknown model or GPU names fail here, before anything is stored
    workdir = Path(spec.workdir) / spec.name
    if not resume:
        _check_something_fits(spec, prior)  # the cost model alone: before any store is looked at
    if resume:  # a study another driver holds: refused naming it, before a check waits on a file that driver holds
        held.refuse_held(spec.storage, spec.name)
    # every store checked before any is created (a refused sweep leaves nothing); each new one is then made whole
    tracker = Tracker(spec.tracking_uri, spec.experiment_name, workdir / "mlflow-spool.jsonl") \
        if spec.tracking_uri.lower() != "none" else None
    if tracker:
        tracker.check()  # a tracking URI that cannot be used: one line, nothing created
    _check_workdir(workdir)
    storage = _open_checked(spec, resume)
    backend = dispatch.start(spec, prior)  # a cluster that cannot place a trial at all: refused before anything exists
    try:
        return _create(spec, resume, prior, run_tags, tracker, storage, workdir, backend)
    except BaseException:
        backend.close()
        raise


def _open_checked(spec: SweepSpec, resume: bool) -> studies.StudyStorage:
    """The study's storage, checked and opened; a resume's storage found locked names the study's lease holder."""
    try:
        return studies.open_checked(spec.storage, spec.name, resume)
    except StorageError as exc:
        if not resume:
            raise
        raise held.name_holder(exc, spec.storage, spec.name) from None


def _create(spec: SweepSpec, resume: bool, prior: Prior, run_tags: dict[str, str] | None, tracker: Tracker | None,
            storage: studies.StudyStorage, workdir: Path, backend: Backend) -> Session:
    """The session's study, lease, MLflow run and work directory made (or resumed), once every check passed."""
    _check_workdir(workdir, create=True)
    if tracker:
        tracker.open()
    sizing = Sizing.of(spec, prior.model, prior.gpu, prior.num_gpus)
    search = Proposer.make(spec.search, prior, spec.seed, runnable=lambda lay: sizing.size(lay).refusal is None)
    try:
        study, existed = studies.create_or_resume(storage, spec.storage, spec.name, search.sampler, resume)
    except studies.STORAGE_ERRORS as exc:  # refused or full before the study was made: nothing stored
        raise studies.storage_failure(exc, spec.storage, "cannot create the study in") from None
    try:
        lease = Lease(study, storage)
        lease.acquire()
    except studies.STORAGE_ERRORS as exc:  # a study its storage will not let us change
        raise studies.storage_failure(exc, spec.storage) from None
    if tracker:
        tracker.fence = lease.fence
    session = Session(spec, search, study, lease, tracker,
                      ResultSpool(workdir / "results-spool.jsonl"), workdir, resumed=existed, backend=backend)
    try:
        _start(session, storage, existed, run_tags or {})
        session.writes = sweep_writes(study, storage, spec.backend, lease.fence)
        if tracker and spec.backend == "analytic":  # trials of microseconds: their MLflow records are most of it
            tracker.write_behind(lease.quiet_until)
    except studies.STORAGE_ERRORS as exc:  # e.g. the disk filled while the study was set up
        session.close()
        raise studies.storage_failure(exc, spec.storage) from None
    except BaseException:
        session.close()
        raise
    return session


def _start(session: Session, storage: studies.StudyStorage, existed: bool, run_tags: dict[str, str]) -> None:
    spec, study = session.spec, session.study
    spec_data = spec.model_dump(mode="json")
    if existed:
        _check_situation(study, spec)
    else:
        # stored without credentials (a URI's password, a token): StudyRecord.of reads the URIs back usable
        session.lease.store(spec=redact_mapping(spec_data), situation=spec.situation(), model=spec.model,
                            seq_len=spec.seq_len, gpu=spec.gpu, num_gpus=session.sizing.num_gpus, backend=spec.backend,
                            memory_limit_gib=session.memory_limit_gib,
                            tracking_uri=redact_text(spec.tracking_uri), family=spec.experiment)
        for params, source in session.search.seeds():
            enqueue(study, params, skip_if_exists=True, proposed_by=source)
    session.lease.store(budget=spec.budget.model_dump())
    studies.name_metrics(study)  # a new study, or an older one resumed: Optuna's tools name its two objectives
    if session.tracker:
        named = {t.number: TrialRecord.of(t).mlflow_run_id for t in study.get_trials(deepcopy=False)} \
            if existed else None  # the runs a resume may adopt: each trial's own
        parent = session.tracker.start(spec_data, spec.name, resume=existed, tags=run_tags, named=named)
        session.lease.store(mlflow_experiment_id=session.tracker.experiment_id, mlflow_parent_run_id=parent)
    if existed:
        _recover(session, storage)


def _check_workdir(workdir: Path, create: bool = False) -> None:
    """The work directory takes files: checked in its nearest existing folder (nothing is created, a refused
    sweep leaves nothing), then made (`create`) once the study is known to run."""
    try:
        if create:
            workdir.mkdir(parents=True, exist_ok=True)
        there = workdir
        while not there.exists() and there != there.parent:
            there = there.parent
        probe = there / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SpecError(f"work directory {str(workdir)!r} is not writable: {exc.strerror or exc}") from None


def _check_something_fits(spec: SweepSpec, prior: Prior) -> None:
    """Refuse, before anything is stored, a sweep in which the cost model says nothing can run, naming the
    constraint that binds."""
    if prior.ranked(limit=1):
        return
    where = f"{spec.model} at seq_len {spec.seq_len} on {spec.num_gpus} x {spec.gpu}"
    fixed = f" with fixed {dict(spec.fixed)}" if spec.fixed else ""
    found = explore(prior.model, prior.gpu, spec.num_gpus, spec.seq_len, fixed=prior.pinned, gbs=spec.gbs, top=1,
                    free=spec.free)
    if found.legal_count == 0:  # the rules that emptied the space, as `space` names them
        raise SpecError(str(why_empty(found, f"{where}{fixed}", prior.memory_limit_gib)))
    raise SpecError(f"nothing fits in memory: none of the {found.legal_count} legal layouts of {where}{fixed} "
                    f"fits the {prior.memory_limit_gib:.1f} GiB per GPU (memory binds; try more GPUs, "
                    f"a shorter seq_len, or free recompute/offload/precision)")


def _check_situation(study: optuna.Study, spec: SweepSpec) -> None:
    """--resume must continue the same situation (SITUATION_FIELDS): name the first field that differs."""
    recorded = StudyRecord.of(study).stored_situation
    for name, now in spec.situation().items():
        then = recorded.get(name)
        if name == "backend" and isinstance(then, str):  # recorded under an older name (local is ray)
            then = _backend_name(then)
        if then != now:
            raise SpecError(f"cannot resume study {spec.name!r} with a different {name}: it was run with "
                            f"{recorded.get(name)!r}, the spec now says {now!r} (use --study-name for a new study)")


def _backend_name(name: str) -> str:
    try:
        return canonical_backend(name)
    except SpecError:
        return name


def _recover(session: Session, storage: studies.StudyStorage) -> None:
    """What the last driver left: results it could not store, trials it left running or interrupted.

    Each such trial is failed as interrupted, with the reason (never told complete: it does not count, and its
    stored status no longer says what it measured), and queued once more, as a new trial that records the result
    it had measured (kept in the result spool, or stored before its tell) or, when it had none, runs its layout
    again; its MLflow child is closed as failed."""
    study, tracker = session.study, session.tracker
    session.lease.fence()
    kept = session.spool.records()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        reason = "the driver stopped while the trial was running; its layout runs again"
        stored = TrialRecord.of(t)  # read before the tell: what it stored while running
        TrialRecord.write(studies.running_trial(storage, study, t.number), status="interrupted", reason=reason)
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        if tracker:
            tracker.mark_failed(t.number, reason)
        if t.params:
            _retry(study, t.number, t.params, reason, kept.get(t.number) or stored)
    session.spool.clear()
    trials = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]
    retried = {r.retry_of for r in trials}
    for r in trials:
        if r.state == "fail" and r.reason == INTERRUPTED and r.number not in retried and r.params:
            _retry(study, r.number, r.params, None, r)
    if tracker:
        tracker.flush()
        for record in queries.finished_records(study):
            if record.status and not tracker.is_finished(record.number) and (
                    session.track_rejected or record.status != "infeasible"):
                tracker.record(session.mlflow_record(record))


def _retry(study: optuna.Study, number: int, params: dict[str, Any], reason: str | None, measured: TrialRecord) -> None:
    """Queue trial `number`'s layout again; a judged result it had measured is recorded, not measured again."""
    attrs: dict[str, Any] = {"proposed_by": "resume", "retry_of": number}
    if measured.result is not None and measured.result.status in MEASURED_STATUSES:
        attrs["measured_result"] = TrialRecord.attrs(result=measured.result)["result"]
        reason = "measured before the driver stopped, not yet recorded: its result is recorded, not run again"
    if reason:
        attrs["retry_reason"] = reason
    enqueue(study, params, **attrs)
