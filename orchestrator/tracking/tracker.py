"""MLflow records: one experiment per sweep, a parent run per sweep, one nested child run per trial.

Optuna storage is the source of truth; MLflow is a view of it that must not lose or double anything:
- a child run is found by its tag `optuna_trial_number` before one is created (resume never duplicates);
- when MLflow is unreachable the record goes to a local JSONL spool and is flushed later; `sync` replays
  any finished trial MLflow lacks from the Optuna storage; if records still cannot be delivered at the end
  the sweep says so loudly (exit code non-zero) — never silently.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from search_spaces.bounded import loads_json, parse_count
from search_spaces.layouts.layout import PARALLEL_SIZES, Layout

from orchestrator.errors import LeaseLost, TrackingError
from orchestrator.records import TRIAL_TAG, VIEW_METRICS, TrialRecord
from orchestrator.redact import redact_mapping, redact_text, redact_uri
from orchestrator.storage import connections, tracking_store
from orchestrator.tracking.environment import recorded_environment
from orchestrator.tracking.writer_process import WriterProcess

log = logging.getLogger("moe_autotune")

for _name in ("mlflow", "alembic"):  # table-creation chatter would break the live view
    logging.getLogger(_name).setLevel(logging.WARNING)

PARENT_TAG = "moe_autotune.role"
STUDY_TAG = "moe_autotune.study"
SUPERSEDED_TAG = "moe_autotune.superseded_trial"
CORRUPT_SPOOL = "mlflow-spool.corrupt.jsonl"
# MLflow 3's experiment kind: "custom_model_development" is its model-training view (runs, not traces)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
# a saved view of the runs page (MLflow's "Views" menu), opened by `?viewStateShareKey=<id>`
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
TRIALS_VIEW = "moe-autotune-trials"
LEADERBOARD_TABLE = "leaderboard.json"
# MlflowClient methods that only read: every other call is a write and passes the tracker's fence first
CLIENT_READS = frozenset({"search_experiments", "get_experiment", "get_experiment_by_name", "search_runs",
                          "get_run", "get_metric_history", "list_artifacts", "download_artifacts"})


def check_store(tracking_uri: str) -> None:
    """A store a sweep will write that cannot take writes (MLflow would retry an unusable SQLite file for
    minutes): one TrackingError line (TrackingStore.check)."""
    tracking_store(tracking_uri).check()


def preload_store(tracking_uri: str) -> None:
    """Load MLflow's store libraries now (about a second): a sweep does it while its child explores the space,
    instead of when it opens the store. Nothing is opened or created."""
    tracking_store(tracking_uri).preload()


def require_existing_store(tracking_uri: str) -> None:
    """A read-only command's MLflow store must exist (opening it would create it): one SpecError line."""
    tracking_store(tracking_uri).require_existing()


def unusable(tracking_uri: str, exc: Exception) -> TrackingError:
    """One line naming the store and why it cannot be used."""
    # redact before cutting: a cut could split a password from its '@'
    text = str(exc).strip().splitlines()
    why = redact_uri(text[0])[:300] if text else type(exc).__name__
    return TrackingError(f"cannot use the MLflow tracking URI {redact_uri(tracking_uri)!r}: {why}")


def safe_environment() -> dict[str, Any]:
    """environment.json: the software's versions and the allow-listed variables, redacted
    (orchestrator/tracking/environment.py)."""
    return recorded_environment()


class Tracker:
    def __init__(self, tracking_uri: str, experiment_name: str, spool_path: Path):
        # every MLflow call bounded (orchestrator/storage/connections.py): a server that is down costs a trial's record
        # seconds, not minutes (the spool keeps the record)
        connections.bound_mlflow()
        self.tracking_uri = tracking_uri
        self.store = tracking_store(tracking_uri)
        self.store.check()  # before the client: MLflow retries an unusable SQLite file for minutes
        self._client: _FencedClient | None = None  # made at the first call: a new SQLite store is created then
        # Called before every MLflow write: the sweep's study lease (LeaseLost once another driver took over)
        self.fence: Callable[[], None] = lambda: None
        self.experiment_name = experiment_name
        self.spool_path = Path(spool_path)
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.study_name = experiment_name  # the parent's study (start() says; a length family shares experiments)
        self._children: dict[int, _Child] = {}  # trial number -> its run
        # trials whose run creation raised: the server may have made the run all the same (it stopped before
        # answering), so the next attempt looks for that run before making another
        self._uncertain: set[int] = set()
        self.pending = 0  # records in the spool
        self.spool_torn = 0  # torn last records skipped
        self.spool_set_aside = 0  # damaged records moved to mlflow-spool.corrupt.jsonl
        self._writer: WriterProcess | None = None  # makes the records behind the sweep (write_behind)
        self._quiet_until: Callable[[], float] = lambda: 0.0

    @property
    def client(self) -> "_FencedClient":
        """The store's bounded client (TrackingStore.open: a missing SQLite store is created whole here)."""
        if self._client is None:
            self._client = _FencedClient(self.store.open(create=True), lambda: self.fence())
        return self._client

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
    def start(self, spec: dict[str, Any], study_name: str, resume: bool, tags: dict[str, str] | None = None) -> str:
        exp = self.client.get_experiment_by_name(self.experiment_name)
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
            self.client.log_text(parent.info.run_id, json.dumps(redact_mapping(spec), indent=2), "spec.json")
            self.client.log_dict(parent.info.run_id, safe_environment(), "environment.json")
            if spec.get("calibration"):
                self._log_calibration(parent.info.run_id, Path(spec["calibration"]))
            if (spec.get("packing") or {}).get("mode") == "packed":
                self._log_packing(parent.info.run_id, Path(spec["packing"]["lengths"]))
        else:
            self.client.update_run(parent.info.run_id, status="RUNNING")
        self.parent_run_id = parent.info.run_id
        self.study_name = study_name
        # e.g. the Slurm job and Ray cluster it runs on, from the start (a cancelled job is linked too)
        for key, value in (tags or {}).items():
            self.client.set_tag(self.parent_run_id, key, redact_text(str(value)))
        self._load_children()
        return self.parent_run_id

    def _log_calibration(self, run_id: str, path: Path) -> None:
        """The calibration file the cost model used: a param (its name and content hash) and the file itself."""
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self.client.log_param(run_id, "calibration", redact_text(f"{path.name} sha256:{digest[:16]}"))
        self.client.log_artifact(run_id, str(path), "calibration")

    def _log_packing(self, run_id: str, path: Path) -> None:
        """Packed documents: the distribution's summary as params and the histogram file as an artifact."""
        from search_spaces.cost.packing import load_histogram

        summary = load_histogram(path).describe()
        self.client.log_param(run_id, "packing", "packed")
        for key in ("documents", "mean_tokens", "median_tokens", "p90_tokens", "longest_tokens",
                    "token_weighted_median"):
            self.client.log_param(run_id, f"packing.{key}", summary[key])
        self.client.log_dict(run_id, redact_mapping(summary), "packing/summary.json")
        self.client.log_artifact(run_id, str(path), "packing")

    def _load_children(self) -> None:
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent_run_id}'",
                                           max_results=1000, page_token=token)
            for run in page:
                number = parse_count(run.data.tags.get(TRIAL_TAG) or "")  # a value read back: bounded
                if number is not None:
                    self._children[number] = _Child(run.info.run_id, run.info.status, dict(run.data.params),
                                                    may_hold_record=True)
            token = page.token
            if not token:
                return

    def finish(self, summary: dict[str, Any], pareto_csv: str | None, status: str = "FINISHED") -> None:
        self.settle()
        run_id = self.parent_run_id
        best = summary.get("best") or {}
        metrics = [Metric(f"best_{k}", float(v), _now(), 0) for k, v in (best.get("measured") or {}).items()
                   if _finite(v)]
        tags = [RunTag(f"best.{k}", str(v)) for k, v in (best.get("layout") or {}).items()]
        tags += [RunTag("best_layout_key", str(best.get("layout_key", ""))),
                 RunTag("n_trials", str(summary.get("n_trials", "")))]
        if "rejected_by_model" in summary:
            metrics.append(Metric("rejected_by_model", float(len(summary["rejected_by_model"])), _now(), 0))
        self.client.log_batch(run_id, metrics=metrics, tags=tags)
        self.client.log_dict(run_id, redact_mapping(summary), "summary.json")
        if pareto_csv is not None:
            self.client.log_text(run_id, redact_text(pareto_csv), "pareto.csv")
        self.client.set_terminated(run_id, status)

    def log_views(self, leaderboard: Any, pareto_figure: Any, report_files: Iterable[Path]) -> None:
        """The sweep's views on its parent run: the leaderboard (a DataFrame) as an MLflow table and a CSV, the
        Pareto plot (a plotly figure, opens offline) and the report's files (under report/)."""
        run_id = self.parent_run_id
        if LEADERBOARD_TABLE in {a.path for a in self.client.list_artifacts(run_id)}:
            # log_table would append to a resumed sweep's table: the whole table replaces it instead
            self.client.log_text(run_id, leaderboard.to_json(orient="split", index=False, date_format="iso"),
                                 LEADERBOARD_TABLE)
        else:
            self.client.log_table(run_id, leaderboard, LEADERBOARD_TABLE)
        self.client.log_text(run_id, leaderboard.to_csv(index=False), "leaderboard.csv")
        self.client.log_figure(run_id, pareto_figure, "pareto.html",
                               save_kwargs={"include_plotlyjs": True})  # inlined: MLflow's default is a CDN
        for path in report_files:
            self.client.log_artifact(run_id, str(path), "report")

    # ---- children ----------------------------------------------------------------------------------
    def child(self, number: int, layout: Layout, backend: str, params_now: bool = True) -> str | None:
        """The run of trial `number`, created when the trial starts (an analytic trial: with its result, its params
        then logged with the record, `params_now` False); None (recorded later from the storage) when MLflow
        cannot be reached now."""
        try:
            return self._child(number, layout, backend, params_now).run_id
        except Exception as exc:  # noqa: BLE001 -- MLflow down: the record waits in the storage and the spool
            log.warning("MLflow: no run for trial %d yet (%s: %s); it is recorded when MLflow is back",
                        number, type(exc).__name__, redact_text(str(exc)))
            return None

    def _child(self, number: int, layout: Layout | None, backend: str, params_now: bool = True) -> "_Child":
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
        self._children[number] = child = _Child(run.info.run_id, "RUNNING", params, params_logged=False)
        self._uncertain.discard(number)
        if params_now:
            self._log_params(child)
        return child

    def _log_params(self, child: "_Child") -> None:
        self.client.log_batch(child.run_id, params=[Param(k, v) for k, v in sorted(child.params.items())])
        child.params_logged = True

    def _created_unanswered(self, number: int, params: dict[str, str]) -> "_Child | None":
        """The run an earlier, unanswered create_run of trial `number` made after all (None when it made none):
        adopted like a resumed run, so its record is completed rather than doubled."""
        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.`mlflow.parentRunId` = '{self.parent_run_id}' and tags.`{TRIAL_TAG}` = '{number}'",
            max_results=10)
        for run in runs:
            if dict(run.data.params) not in ({}, params):  # another layout's: one run per trial and layout
                self._supersede(_Child(run.info.run_id, run.info.status, dict(run.data.params)), number)
            elif number in self._uncertain:
                if not run.data.params and params:
                    self.client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in sorted(params.items())])
                self._children[number] = _Child(run.info.run_id, run.info.status, params, may_hold_record=True)
                self._uncertain.discard(number)
        return self._children.get(number)

    def _supersede(self, child: "_Child", number: int) -> None:
        self.client.set_tag(child.run_id, "status", "interrupted")
        self.client.set_tag(child.run_id, "reason", f"superseded: trial {number} runs another layout")
        self.client.set_tag(child.run_id, SUPERSEDED_TAG, str(number))
        self.client.delete_tag(child.run_id, TRIAL_TAG)
        if child.status == "RUNNING":
            self.client.set_terminated(child.run_id, "KILLED")

    def is_finished(self, number: int) -> bool:
        self.settle()
        child = self._children.get(number)
        return child is not None and child.status in ("FINISHED", "FAILED", "KILLED")

    def record(self, run: "RunRecord") -> bool:
        """Log a finished trial (its run begun here, the rest by the writer when one makes the records behind the
        sweep); on failure keep it in the spool. True when MLflow has it, or the writer will make it."""
        if self._writer is None:
            return self._record_or_spool(run)
        record = run.record
        try:  # begun here: this process holds the runs' ids, and a trial's record goes to the run it names
            child = self._child(record.number, record.layout, record.backend or "", params_now=False)
        except LeaseLost:
            raise
        except Exception as exc:  # noqa: BLE001 -- MLflow down/misbehaving: keep the record, say why later
            self._spool_failed(run, exc)
            return False
        self._answered(self._writer.send((child, run, self._quiet_until())))
        if not self._writer.alive:  # gone: what it left is made here now
            self.settle()
        return True

    def _record_or_spool(self, run: "RunRecord") -> bool:
        try:
            self._record(run)
            return True
        except LeaseLost:  # taken over: the record is the new driver's to make, not the spool's
            raise
        except Exception as exc:  # noqa: BLE001 -- MLflow down/misbehaving: keep the record, say why later
            self._spool_failed(run, exc)
            return False

    def _spool_failed(self, run: "RunRecord", exc: Exception) -> None:
        self._spool({"trial_number": run.record.number, "payload": run.payload(),
                     "error": redact_text(f"{type(exc).__name__}: {exc}")})

    def _record(self, run: "RunRecord") -> None:
        record = run.record
        child = self._child(record.number, record.layout, record.backend or "", params_now=False)
        run_id = child.run_id
        t = _now()
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
        self.client.set_terminated(run_id, "FINISHED")
        child.status = "FINISHED"

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

    def mark_failed(self, number: int, reason: str) -> None:
        self.settle()  # a record still with the writer closes its run first
        child = self._children.get(number)
        if child is None and number in self._uncertain:  # a stop in its run's creation: the run may exist
            child = self._created_unanswered(number, {})
        if child is not None and child.status == "RUNNING":
            self.client.set_tag(child.run_id, "status", "interrupted")
            self.client.set_tag(child.run_id, "reason", redact_text(reason))
            self.client.set_terminated(child.run_id, "FAILED")
            child.status = "FAILED"

    # ---- records made behind the sweep ---------------------------------------------------------------
    def write_behind(self, quiet_until: Callable[[], float]) -> bool:
        """From now on, finished trials' records (their log_batch and set_terminated) are made by a forked writer
        (orchestrator/tracking/writer_process.py) on another core while the sweep goes on: half of an analytic sweep's
        time
        is MLflow's. False where no writer could be forked, or the store is not a database (an HTTP server: a fork
        cannot share the client's pooled sockets): the records are made here, as before.

        Each run is still begun here (its id is stored with the trial). Nothing is doubled or lost:
        - the fence: `quiet_until` is the lease's (Lease.quiet_until). The writer writes a record only before it
          (no rival can have taken the study then) and hands it back after it, for this process's fence to judge;
        - every record is answered before the sweep reads what MLflow holds (flush, finish, mark_failed,
          is_finished: `settle`); a record the writer could not deliver is in the spool, as here;
        - a writer that died hands back what it had not answered; such a record, and one handed back, is made here
          as a resumed one is: what its run already holds is not logged again;
        - the writer dies with this process: the records it had not made are made from the storage by the resume,
          like those of a driver killed before it sent them."""
        if not self.store.forkable:  # an HTTP client's pooled sockets cannot be shared by a fork
            return False
        self._quiet_until = quiet_until
        self._writer = WriterProcess.start(self._write_behind)
        return self._writer is not None

    def settle(self) -> None:
        """Wait until the writer has answered every record sent to it (or is gone: the rest are made here)."""
        writer = self._writer
        if writer is None:
            return
        self._answered(writer.answers(wait=True))
        if not writer.alive:
            self._writer = None
            writer.kill()
            for _, run, _ in writer.unanswered:
                self._children[run.record.number].may_hold_record = True
                self._record_or_spool(run)

    def close(self) -> None:
        """End the writer, its records answered first; killed when that fails (a lease lost: the new driver makes
        them from the storage)."""
        writer = self._writer
        if writer is None:
            return
        try:
            self.settle()
        except BaseException:
            writer.kill()
            raise
        finally:
            self._writer = None
        writer.close()

    def _answered(self, answers: list[tuple[Any, Any]]) -> None:
        """The writer's answers: each trial's run as the writer left it, and what became of its record."""
        for (_, run, _), (outcome, child) in answers:
            self._children[run.record.number] = child
            if outcome == _SPOOLED:
                self.pending += 1
            elif outcome == _HANDED_BACK:
                child.may_hold_record = True  # what it holds is not logged again
                self._record_or_spool(run)

    def _write_behind(self, request: tuple["_Child", "RunRecord", float]) -> tuple[str, "_Child"]:
        """In the writer: make one record while the lease is quiet, else hand it back."""
        child, run, quiet_until = request
        self.fence = lambda: _before(quiet_until)
        self._children[run.record.number] = child
        try:
            return (_RECORDED if self._record_or_spool(run) else _SPOOLED), child
        except LeaseLost:
            return _HANDED_BACK, child

    # ---- spool -------------------------------------------------------------------------------------
    def _spool(self, record: dict[str, Any]) -> None:
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.spool_path, "ab") as fh:
            if fh.tell() and not _ends_with_newline(self.spool_path):
                fh.write(b"\n")  # a crash tore the last record: never glue the next one onto it
            fh.write((json.dumps(record, default=str) + "\n").encode())
            fh.flush()
            os.fsync(fh.fileno())
        self.pending += 1

    def flush(self) -> int:
        """Deliver spooled records; returns how many are still pending.

        A torn last line (a crash mid-write) is skipped; a damaged line anywhere else is moved to
        mlflow-spool.corrupt.jsonl. Both are logged and counted (spool_torn, spool_set_aside)."""
        self.settle()  # the writer's records first: a record it could not deliver is in the spool
        if not self.spool_path.is_file():
            self.pending = 0
            return 0
        raw = self.spool_path.read_bytes()
        lines = raw.decode("utf-8", errors="replace").splitlines()
        torn_tail = bool(raw) and not raw.endswith(b"\n")
        left, damaged = [], []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            rec = _spool_record(line)
            if rec is None:
                if torn_tail and i == len(lines) - 1:
                    self.spool_torn += 1
                    log.warning("MLflow spool %s: skipped a torn last record (the sweep stopped while writing "
                                 "it); the Optuna storage still has the trial", self.spool_path)
                else:
                    damaged.append(line)
                continue
            try:
                if not self.is_finished(rec["trial_number"]):
                    self._record(RunRecord.from_payload(rec["trial_number"], rec["payload"]))
            except LeaseLost:
                raise
            except Exception:  # noqa: BLE001 -- MLflow still down: the record stays in the spool
                left.append(line)
        self._set_aside(damaged)
        if left:
            self.spool_path.write_text("\n".join(left) + "\n")
        else:
            self.spool_path.unlink()
        self.pending = len(left)
        return self.pending

    def _set_aside(self, lines: list[str]) -> None:
        if not lines:
            return
        corrupt = self.spool_path.with_name(CORRUPT_SPOOL)
        with open(corrupt, "a") as fh:
            fh.write("\n".join(lines) + "\n")
        self.spool_set_aside += len(lines)
        log.warning("MLflow spool %s: %d corrupt record(s) moved to %s (not delivered; the Optuna storage "
                     "still has the trials)", self.spool_path, len(lines), corrupt)


class _FencedClient:
    """The tracker's MlflowClient, each write behind the fence: a driver whose study was taken over while it
    was paused stops at its next MLflow call, not after finishing the record it was in the middle of."""

    def __init__(self, client: MlflowClient | connections.BoundedClient, fence: Callable[[], None]):
        self._client, self._fence = client, fence

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in CLIENT_READS or not callable(attr):
            return attr

        def fenced(*args: Any, **kwargs: Any) -> Any:
            self._fence()
            return attr(*args, **kwargs)
        return fenced


@dataclass
class _Child:
    """What the tracker knows of a trial's run, without another round trip to the server."""
    run_id: str
    status: str  # RUNNING | FINISHED | FAILED | KILLED
    params: dict[str, str]
    # the run may hold part of its trial's record, whose figures are then not logged again: begun by an earlier
    # driver of the study (found on resume), or a record of it begun here that did not finish (spooled, handed back)
    may_hold_record: bool = False
    params_logged: bool = True  # False: made for a finished trial's record, whose batch logs its params


_RECORDED, _SPOOLED, _HANDED_BACK = "recorded", "spooled", "handed back"  # the writer's answers


def _before(deadline: float) -> None:
    """The writer's fence: the lease's quiet time is over (a rival may hold it now): the sweep's own fence judges."""
    if time.monotonic() >= deadline:
        raise LeaseLost("the lease's quiet time is over: the record is handed back to the sweep")


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _spool_record(line: str) -> dict[str, Any] | None:
    """The record a spool line holds, or None when the line is damaged."""
    try:
        rec = loads_json(line, "MLflow spool line")  # bounded: nesting, digits (SpecError is a ValueError)
    except ValueError:
        return None
    ok = (isinstance(rec, dict) and isinstance(rec.get("trial_number"), int)
          and not isinstance(rec.get("trial_number"), bool) and isinstance(rec.get("payload"), dict))
    return rec if ok else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


PROXY_PARAM = "proxy."  # params of the layout a proxy trial ran (its world, layers, changed fields)


@dataclass(frozen=True)
class RunRecord:
    """What a trial's child run gets: the trial's record and the log files of its directory."""
    record: TrialRecord
    logs: tuple[str, ...] = ()

    def payload(self) -> dict[str, Any]:
        """The spooled form: the record's user attrs and the logs (what an older spool line holds too)."""
        return {**self.record.stored_attrs(), "logs": list(self.logs)}

    @classmethod
    def from_payload(cls, number: int, payload: dict[str, Any]) -> "RunRecord":
        logs = payload.get("logs")
        return cls(TrialRecord.from_attrs(number, payload),
                   tuple(str(p) for p in logs) if isinstance(logs, list) else ())


def trials_view(free: Iterable[str] | None = None) -> dict[str, Any]:
    """The runs page as the sweep is read: trials ranked by tokens/s/GPU (a metric order lists child runs
    flat, not collapsed under the parent), measured beside predicted, then the searched layout fields."""
    columns = [f"metrics.`{k}`" for k in VIEW_METRICS]
    columns += [f"params.`{k}`" for k in (free or PARALLEL_SIZES)]
    columns += ["tags.`status`", "tags.`fidelity`"]
    # columnOrder puts them first, in this order: the tokens/s column stays in sight on a narrow window
    return {"searchFilter": "", "orderByKey": "metrics.`tokens_per_sec_per_gpu`", "orderByAsc": False,
            "startTime": "ALL", "lifecycleFilter": "Active", "modelVersionFilter": "All Runs", "datasetsFilter": [],
            "selectedColumns": columns, "columnOrder": columns, "runsExpanded": {}}


def mark_training_experiment(client: MlflowClient | connections.BoundedClient | _FencedClient, experiment_id: str,
                             free: Iterable[str] | None = None) -> None:
    """Tag the sweep's experiment as a model-training one and give it the trials view (idempotent).

    With `free` (the spec's searched fields) the view shows those params; without, an existing view is kept."""
    tags = client.get_experiment(experiment_id).tags
    if tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    key = VIEW_TAG_PREFIX + TRIALS_VIEW
    old = _saved_view(tags.get(key))
    if old is not None and free is None:
        return
    state = json.dumps(trials_view(free))
    if old is None or old.get("state") != state:
        # the envelope of MLflow 3's saved views: a name in the Views menu, the page state as JSON text
        created = old.get("createdAt", _now()) if old else _now()
        client.set_experiment_tag(experiment_id, key, json.dumps(
            {"name": "moe-autotune: trials by tokens/s/GPU", "createdAt": created, "updatedAt": _now(),
             "state": state}))


def _saved_view(value: str | None) -> dict[str, Any] | None:
    """A saved view's envelope, or None when there is none (or it is not one: it is rewritten)."""
    try:
        view = loads_json(value, "saved view") if value else None  # a tag read back: bounded
    except ValueError:
        return None
    return view if isinstance(view, dict) else None


def runs_page_url(base_url: str, experiment_id: str) -> str:
    """The experiment's runs page in the model-training view, opened on the trials view.

    MLflow 3.17's UI picks the view from `workflowType` in the URL (else the browser's last choice, GenAI by
    default), not from the experiment's tag; later MLflow sources also follow the tag."""
    base_url = redact_uri(base_url)  # printed: a server reached through user-info keeps its password out of it
    return (f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?workflowType=machine_learning&viewStateShareKey={TRIALS_VIEW}")


def layout_params(layout: Layout) -> dict[str, str]:
    """The layout as MLflow params: every field, encoded as the CSV and Optuna params encode it."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in layout.params().items()}




def _now() -> int:
    return int(time.time() * 1000)
