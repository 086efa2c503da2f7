"""MLflow records: one experiment per sweep, a parent run per sweep, one nested child run per trial.

Optuna storage is the source of truth; MLflow is a view of it that must not lose or double anything:
- a child run is found by its tag `optuna_trial_number` before one is created (resume never duplicates);
- when MLflow is unreachable the record goes to a local JSONL spool (orchestrator/tracking/record_spool.py) and is
  flushed later; `sync` replays any finished trial MLflow lacks from the Optuna storage; if records still cannot be
  delivered at the end the sweep says so loudly (exit code non-zero) — never silently.

The tracker's other parts: the store and its fenced client (client.py), the names and views of its runs
(views.py), a trial's run and record (runs.py), the records made behind the sweep by a forked writer
(write_behind.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

from mlflow.entities import Metric, Param, RunTag

from search_spaces.bounded import parse_count
from search_spaces.layouts.layout import Layout

from orchestrator.errors import LeaseLost, TrackingError, TrackingLost
from orchestrator.records import TRIAL_TAG
from orchestrator.records.lifecycle import mlflow_status
from orchestrator.redact import redact_mapping, redact_text
from orchestrator.storage import connections, run_directory, tracking_store
from orchestrator.tracking import parent_run
from orchestrator.tracking.client import FencedClient, unusable
from orchestrator.tracking.record_spool import RecordSpool
from orchestrator.tracking.runs import ChildRun, RunRecord, step_metrics
from orchestrator.tracking.store_watch import StoreWatch, deleted_experiment, lost_runs
from orchestrator.tracking.views import (
    EXPERIMENT_KIND_TAG,
    PARENT_TAG,
    PROXY_PARAM,
    STUDY_TAG,
    SUPERSEDED_TAG,
    TRAINING_KIND,
    layout_params,
    mark_training_experiment,
    now_ms,
)
from orchestrator.tracking.write_behind import WriteBehind
from orchestrator.tracking.writer_process import WriterProcess

log = logging.getLogger("moe_autotune")
ORPHANED = "orphaned: made by a driver that had lost the study's lease ({})"  # why a resume closes a run aside


class Tracker(WriteBehind):
    def __init__(self, tracking_uri: str, experiment_name: str, spool_path: Path):
        # every MLflow call bounded (orchestrator/storage/connections.py): a server that is down costs a trial's record
        # seconds, not minutes (the spool keeps the record)
        connections.bound_mlflow()
        self.tracking_uri = tracking_uri
        self.store = tracking_store(tracking_uri)
        self.store.check()  # before the client: MLflow retries an unusable SQLite file for minutes
        self.watch = StoreWatch(self.store)  # each write asks whether the store is still the one opened
        self._client: FencedClient | None = None  # made at the first call: a new SQLite store is created then
        # Called before every MLflow write: the sweep's study lease (LeaseLost once another driver took over)
        self.fence: Callable[[], None] = lambda: None
        self.experiment_name = experiment_name
        self.spool = RecordSpool(spool_path)  # the records MLflow could not take
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.study_name = experiment_name  # the parent's study (start() says; a length family shares experiments)
        self._children: dict[int, ChildRun] = {}  # trial number -> its run
        # trials whose run creation raised: the server may have made the run all the same (it stopped before
        # answering), so the next attempt looks for that run before making another
        self._uncertain: set[int] = set()
        self._writer: WriterProcess | None = None  # makes the records behind the sweep (write_behind)
        self._quiet_until: Callable[[], float] = lambda: 0.0

    @property
    def client(self) -> FencedClient:
        """The store's bounded client (TrackingStore.open: a missing SQLite store is created whole here)."""
        if self._client is None:
            self._client = FencedClient(self.store.open(create=True), self._before_write)
            self.watch.opened()
        return self._client

    def _before_write(self) -> None:
        """Each MLflow write: the lease's fence, then the store must still be the one opened (StoreWatch)."""
        self.fence()
        self.watch.check()

    def verify(self) -> None:
        """The sweep's end: TrackingLost when the store, or its parent run, vanished since the last write."""
        self.watch.parent_gone(self.client, self.parent_run_id)

    def close(self) -> None:
        try:
            super().close()  # the writer's records made first
        finally:
            self.watch.release()

    def open(self) -> None:
        """Open the store now (a new SQLite store is created whole): before the sweep creates its study."""
        self.client  # noqa: B018 -- the property opens it

    def check(self) -> None:
        """Can this store be used at all? One line naming the problem, before the sweep creates anything: a
        SQLite store that is not there yet is only checked (its folder takes writes: TrackingStore.check), and is
        created at the first record."""
        if not self.store.exists():
            return
        try:
            self.client.search_experiments(max_results=1)
        except TrackingError:
            raise
        except Exception as exc:  # noqa: BLE001 -- any failure here means the URI cannot be used
            raise unusable(self.tracking_uri, exc) from None

    # ---- parent ------------------------------------------------------------------------------------
    def start(self, spec: dict[str, Any], study_name: str, resume: bool, tags: dict[str, str] | None = None,
              named: dict[int, str | None] | None = None) -> str:
        """The sweep's parent run (made, or found on --resume); `named`: each stored trial's own run id (its
        record's mlflow_run_id, None when it names none), which decides the runs a resume adopts (_load_children)."""
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is not None and exp.lifecycle_stage == "deleted":  # MLflow refuses runs in it, and a new one its name
            raise TrackingLost(lost_runs(self.store.shown, *deleted_experiment(exp.name, exp.experiment_id)))
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(
            self.experiment_name, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
        mark_training_experiment(self.client, self.experiment_id, spec.get("free"))  # also an older experiment
        parent = None
        if resume:
            runs = self.client.search_runs(
                [self.experiment_id],
                f"tags.`{PARENT_TAG}` = 'parent' and tags.`{STUDY_TAG}` = '{study_name}'",
                max_results=1, order_by=["attributes.start_time DESC"])
            parent = runs[0] if runs else None
        if parent is None:
            parent = self.client.create_run(self.experiment_id, run_name=study_name,
                                            tags={PARENT_TAG: "parent", STUDY_TAG: study_name})
            parent_run.log_parent_files(self.client, parent.info.run_id, spec)
        else:
            self.client.update_run(parent.info.run_id, status="RUNNING")
        self.parent_run_id = parent.info.run_id
        self.study_name = study_name
        # e.g. the Slurm job and Ray cluster it runs on, from the start (a cancelled job is linked too)
        for key, value in (tags or {}).items():
            self.client.set_tag(self.parent_run_id, key, redact_text(str(value)))
        self._load_children(named or {})
        return self.parent_run_id

    def _load_children(self, named: dict[int, str | None]) -> None:
        """The parent's child runs, each adopted by its trial number unless it is an orphan (_adopts)."""
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent_run_id}'",
                                           max_results=1000, page_token=token)
            for run in page:
                number = parse_count(run.data.tags.get(TRIAL_TAG) or "")  # a value read back: bounded
                if number is None:
                    continue
                child = ChildRun(run.info.run_id, run.info.status, dict(run.data.params), may_hold_record=True,
                                 started_ms=run.info.start_time)
                kept = self._adopts(number, child, named)
                if kept is not None:
                    self._children[number] = kept
            token = page.token
            if not token:
                return

    def _adopts(self, number: int, child: ChildRun, named: dict[int, str | None]) -> ChildRun | None:
        """Which of `child` and the run already adopted for trial `number` the resume reuses (None: neither).
        A run the trial's stored record does not name, or a running second run of one trial number, was made by
        a driver that had lost the study's lease (paused between its fence and the write): an orphan, closed
        here as such and never filled with a record (issue 58)."""
        other = self._children.get(number)
        own = named.get(number)
        if own is not None and child.run_id != own:
            self._close_aside(child, number, ORPHANED.format(f"trial {number} names run {own}"))
            return None
        if other is None or own is not None:
            return child
        keep, drop = (other, child) if child.status == "RUNNING" else (child, other)
        self._close_aside(drop, number, ORPHANED.format(f"trial {number} has run {keep.run_id}"))
        return keep

    def finish(self, summary: dict[str, Any], pareto_csv: str | None, status: str = "FINISHED") -> None:
        self.settle()
        parent_run.log_summary(self.client, self.parent_run_id, summary, pareto_csv, status)

    def log_views(self, leaderboard: Any, pareto_figure: Any, report_files: Iterable[Path]) -> None:
        """The sweep's views on its parent run (parent_run.log_views)."""
        parent_run.log_views(self.client, self.parent_run_id, leaderboard, pareto_figure, report_files)

    # ---- children ----------------------------------------------------------------------------------
    def child(self, number: int, layout: Layout, backend: str, params_now: bool = True) -> str | None:
        """The run of trial `number`, created when the trial starts (an analytic trial: with its result, its params
        then logged with the record, `params_now` False); None (recorded later from the storage) when MLflow
        cannot be reached now."""
        try:
            return self._child(number, layout, backend, params_now).run_id
        except TrackingLost:  # the store is gone: the sweep stops
            raise
        except Exception as exc:  # noqa: BLE001 -- MLflow down: the record waits in the storage and the spool
            self.watch.runs_gone(exc, self.client, self.experiment_id, self.parent_run_id)  # or TrackingLost
            log.warning("MLflow: no run for trial %d yet (%s: %s); it is recorded when MLflow is back",
                        number, type(exc).__name__, redact_text(str(exc)))
            return None

    def _child(self, number: int, layout: Layout | None, backend: str, params_now: bool = True) -> ChildRun:
        """A child run belongs to one trial, and one layout, for ever: an existing run of this trial number
        is reused only when its layout params match (a resume), else it is closed as superseded. A run made
        for a finished trial (`params_now` False) gets its params with the record's own batch: one call less."""
        params = layout_params(layout) if layout is not None else {}
        child = self._children.get(number)
        if child is not None and child.params in ({}, params):
            if params and not child.params:  # begun without them (stopped between its creation and its params)
                child.params, child.params_logged = params, False
                if params_now:
                    self._log_params(child)
            return child
        if child is not None:
            self._supersede(child, number)
        elif number in self._uncertain:
            child = self._created_unanswered(number, params)
            if child is not None:
                return child
        self._uncertain.add(number)
        run = self.client.create_run(self.experiment_id, run_name=f"trial-{number}", tags={
            "mlflow.parentRunId": self.parent_run_id, TRIAL_TAG: str(number), "backend": backend,
            STUDY_TAG: self.study_name, "status": "running"})
        self._children[number] = child = ChildRun(run.info.run_id, "RUNNING", params, params_logged=False,
                                                  started_ms=run.info.start_time)
        self._uncertain.discard(number)
        if params_now:
            self._log_params(child)
        return child

    def _log_params(self, child: ChildRun) -> None:
        self.client.log_batch(child.run_id, params=[Param(k, v) for k, v in sorted(child.params.items())])
        child.params_logged = True

    def _created_unanswered(self, number: int, params: dict[str, str]) -> "ChildRun | None":
        """The run an earlier, unanswered create_run of trial `number` made after all (None when it made none):
        adopted like a resumed run, so its record is completed rather than doubled."""
        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.`mlflow.parentRunId` = '{self.parent_run_id}' and tags.`{TRIAL_TAG}` = '{number}'",
            max_results=10)
        for run in runs:
            if dict(run.data.params) not in ({}, params):  # another layout's: one run per trial and layout
                self._supersede(ChildRun(run.info.run_id, run.info.status, dict(run.data.params)), number)
            elif number in self._uncertain:
                if not run.data.params and params:
                    self.client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in sorted(params.items())])
                self._children[number] = ChildRun(run.info.run_id, run.info.status, params, may_hold_record=True,
                                                  started_ms=run.info.start_time)
                self._uncertain.discard(number)
        return self._children.get(number)

    def _supersede(self, child: ChildRun, number: int) -> None:
        self._close_aside(child, number, f"superseded: trial {number} runs another layout")

    def _close_aside(self, child: ChildRun, number: int, reason: str) -> None:
        """A run that is not trial `number`'s (superseded or orphaned): it says why, names the trial only as
        SUPERSEDED_TAG (neither `check` nor a resume counts it) and, were it running, is closed KILLED."""
        self.client.set_tag(child.run_id, "status", "interrupted")
        self.client.set_tag(child.run_id, "reason", reason)
        self.client.set_tag(child.run_id, SUPERSEDED_TAG, str(number))
        self.client.delete_tag(child.run_id, TRIAL_TAG)
        if child.status == "RUNNING":
            self.client.set_terminated(child.run_id, "KILLED")

    def is_finished(self, number: int) -> bool:
        self.settle()
        child = self._children.get(number)
        return child is not None and child.status in ("FINISHED", "FAILED", "KILLED")

    def record(self, run: RunRecord) -> bool:
        """Log a finished trial (its run begun here, the rest by the writer when one makes the records behind the
        sweep); on failure keep it in the spool. True when MLflow has it, or the writer will make it."""
        if self._writer is None:
            return self._record_or_spool(run)
        record = run.record
        try:  # begun here: this process holds the runs' ids, and a trial's record goes to the run it names
            child = self._child(record.number, record.layout, record.backend or "", params_now=False)
        except (LeaseLost, TrackingLost):
            raise
        except Exception as exc:  # noqa: BLE001 -- MLflow down/misbehaving: keep the record, say why later
            self._spool_failed(run, exc)
            return False
        self._answered(self._writer.send((child, run, self._quiet_until())))
        if not self._writer.alive:  # gone: what it left is made here now
            self.settle()
        return True

    def _record_or_spool(self, run: RunRecord) -> bool:
        try:
            self._record(run)
            return True
        except (LeaseLost, TrackingLost):  # taken over, or the store gone: the storage has the record
            raise
        except Exception as exc:  # noqa: BLE001 -- MLflow down/misbehaving: keep the record, say why later
            self._spool_failed(run, exc)
            return False

    def _spool_failed(self, run: RunRecord, exc: Exception) -> None:
        self.watch.runs_gone(exc, self.client, self.experiment_id, self.parent_run_id)  # or TrackingLost
        try:
            self.spool.add({"trial_number": run.record.number, "payload": run.payload(),
                            "error": redact_text(f"{type(exc).__name__}: {exc}")})
        except OSError as refused:  # the run directory, not the Optuna storage: one line, exit 7 (or 4)
            raise run_directory.failure(refused) from None

    def _record(self, run: RunRecord) -> None:
        record = run.record
        child = self._child(record.number, record.layout, record.backend or "", params_now=False)
        run_id = child.run_id
        # at the run's start time, not now: the same record made again (whatever raced) logs the same rows
        t = child.started_ms or now_ms()
        metrics = [Metric(key, value, t, step) for key, value, step in record.mlflow_metrics()]
        if child.may_hold_record:
            metrics = self._not_yet_logged(run_id, metrics)
        # a reason may quote a trainer's error: what is recorded is redacted (orchestrator/redact.py)
        tags = [RunTag(k, redact_text(v)) for k, v in {**record.mlflow_tags(), TRIAL_TAG: str(record.number)}.items()]
        params = [Param(f"{PROXY_PARAM}{k}", redact_text(v)) for k, v in record.proxy_params().items()]
        if not child.params_logged:  # a run made just now, for this record (see _child)
            params = [Param(k, v) for k, v in sorted(child.params.items())] + params
        # from its first write on, the run may hold part of this record: a retry of it (the spool's flush, a
        # writer's record handed back) logs only the figures the run does not have yet
        child.may_hold_record = True
        self.client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        child.params_logged = True
        if record.composed:  # the full-scale figures of a proxy trial, measured and modelled parts side by side
            self.client.log_dict(run_id, {"composed": record.composed, "proxy": record.proxy_plan}, "composed.json")
        # trials that ran keep their evidence (an analytic "measurement" is the prediction: nothing to keep)
        if record.status != "infeasible" and record.backend != "analytic":
            self.client.log_dict(run_id, redact_mapping(record.evidence()), "trial.json")
            if record.command:
                self.client.log_text(run_id, json.dumps(redact_mapping(record.command), indent=1), "command.json")
            for path in run.logs:
                if Path(path).is_file():
                    self._log_redacted(run_id, Path(path), "logs")
        # FINISHED for a measurement, FAILED for a trial that failed (its class and reason are tags), KILLED for
        # one interrupted (orchestrator/records/lifecycle.py)
        status = mlflow_status(record.status)
        self.client.set_terminated(run_id, status)
        child.status = status

    def _log_redacted(self, run_id: str, path: Path, folder: str) -> None:
        """A trainer's log as an artifact of the same name, line by line with every credential shape masked."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="moe-autotune-log-") as tmp:
            copy = Path(tmp) / path.name
            with open(path, encoding="utf-8", errors="replace") as src, open(copy, "w", encoding="utf-8") as dst:
                for line in src:
                    dst.write(redact_text(line))
            self.client.log_artifact(run_id, str(copy), folder)

    def _not_yet_logged(self, run_id: str, metrics: list[Metric]) -> list[Metric]:
        """The metrics a run does not have yet: a driver killed between logging a trial's figures and closing its
        run leaves them there, and the resume that records the trial again must not log them twice (each figure
        is one point, each step of a history once)."""
        logged = self.client.get_run(run_id).data.metrics
        if not logged:
            return metrics
        have = {(m.key, m.step) for key in logged for m in self.client.get_metric_history(run_id, key)}
        return [m for m in metrics if (m.key, m.step) not in have]

    def log_steps(self, number: int, steps: list[dict[str, Any]]) -> None:
        """A running trial's reported steps as step-indexed metrics of its run (runs.step_metrics), as they come."""
        child = self._children.get(number)
        if not self.watch.lost and child is not None and child.status == "RUNNING" and steps:
            self.client.log_batch(child.run_id, metrics=step_metrics(steps, now_ms()))

    def mark_failed(self, number: int, reason: str) -> None:
        if self.watch.lost:  # nothing more to a store that is gone: the storage has the trial's state
            return
        self.settle()  # a record still with the writer closes its run first
        child = self._children.get(number)
        if child is None and number in self._uncertain:  # a stop in its run's creation: the run may exist
            child = self._created_unanswered(number, {})
        if child is not None and child.status == "RUNNING":
            self.client.set_tag(child.run_id, "status", "interrupted")
            self.client.set_tag(child.run_id, "reason", redact_text(reason))
            self.client.set_terminated(child.run_id, "FAILED")
            child.status = "FAILED"

    # ---- spool -------------------------------------------------------------------------------------
    def flush(self) -> int:
        """Deliver spooled records (RecordSpool.flush); returns how many are still pending."""
        self.settle()  # the writer's records first: a record it could not deliver is in the spool
        pending = self.spool.flush(self._deliver_spooled)
        if self.watch.lost:  # each record was refused: the store is gone (the storage keeps them)
            raise TrackingLost(self.watch.lost)
        return pending

    def _deliver_spooled(self, number: int, payload: dict[str, Any]) -> None:
        if not self.is_finished(number):
            self._record(RunRecord.from_payload(number, payload))
