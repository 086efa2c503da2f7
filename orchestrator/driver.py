"""The sweep loop: ask Optuna, check with the cost model, dispatch to a backend, tell Optuna, record MLflow.

Order of writes per trial (so a SIGKILL anywhere loses nothing and doubles nothing):
  ask -> user_attrs (layout, prediction, mlflow_run_id) -> run -> user_attrs (status, result) -> tell
  -> MLflow child run finished.  On --resume: RUNNING trials are failed and their layouts re-enqueued;
  finished trials MLflow lacks are replayed from the storage into their (single) child run.
"""

from __future__ import annotations

import concurrent.futures
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from search_spaces.errors import SpecError
from search_spaces.layout import Layout
from search_spaces.result import TrialResult

from orchestrator import study as studies
from orchestrator.backends import TrialRequest, make_backend, make_prior
from orchestrator.bulk_store import add_finished_trials
from orchestrator.prior import Prediction, Prior
from orchestrator.progress import SweepProgress
from orchestrator.redact import redact_uri
from orchestrator.sampler import LayoutProposer, make_sampler
from orchestrator.spec import SweepSpec
from orchestrator.tracking import Tracker
from orchestrator.validate import validate


# backends whose trials take microseconds: the study runs in memory and is stored at the end
INSTANT_BACKENDS = ("analytic", "replay")


# why a trial that was running when the sweep was stopped (Ctrl-C, SIGTERM from scancel) was failed
INTERRUPTED = "sweep interrupted"


@dataclass
class SweepOutcome:
    study: optuna.Study
    best: optuna.trial.FrozenTrial | None
    pareto: list[optuna.trial.FrozenTrial]
    n_measured: int
    n_infeasible: int
    wall_time_s: float
    mlflow_pending: int = 0
    messages: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.mlflow_pending:
            return 3
        return 0 if self.best is not None else 1


@dataclass
class _Running:
    trial: optuna.Trial
    layout: Layout
    prediction: Prediction
    request: TrialRequest


class Sweep:
    def __init__(self, spec: SweepSpec, resume: bool = False, prior: Prior | None = None,
                 show_progress: bool = True):
        self.spec = spec
        self.resume = resume
        self.prior = prior or make_prior(spec)
        self.show_progress = show_progress
        self.workdir = Path(spec.workdir) / spec.name
        self._track_rejected = (spec.track_rejected if spec.track_rejected is not None
                                else spec.backend not in INSTANT_BACKENDS)

    # ---- setup ---------------------------------------------------------------------------------
    def _open(self) -> None:
        spec = self.spec
        self.prior.model, self.prior.gpu  # bad model/GPU names fail here, before anything is stored
        if not self.resume:
            self._check_something_fits()
        self.proposer = LayoutProposer(self.prior, spec.free, seed=spec.seed)
        real, existed = studies.create_or_resume(spec.storage, spec.name, make_sampler(spec.seed), self.resume)
        if not existed:
            for key, value in {"spec": spec.dump(), "model": spec.model, "seq_len": spec.seq_len,
                               "gpu": spec.gpu, "num_gpus": spec.num_gpus, "backend": spec.backend,
                               "memory_limit_gib": self.prior.memory_limit_gib,
                               "tracking_uri": spec.tracking_uri}.items():
                real.set_user_attr(key, value)
        self.real_study = real
        if spec.backend in INSTANT_BACKENDS:
            # What-if trials cost microseconds: run the study in memory, write it to the storage at the end
            # (a SQLite round trip per suggest/attr would be most of the sweep).
            self.study = optuna.create_study(sampler=make_sampler(spec.seed), directions=studies.DIRECTIONS,
                                             study_name=spec.name)
            for key, value in real.user_attrs.items():
                self.study.set_user_attr(key, value)
            self.study.add_trials([t for t in real.get_trials(deepcopy=False) if t.state.is_finished()])
            self._copied = len(self.study.trials)
        else:
            self.study = real
        if not existed:
            self.proposer.enqueue_seeds(self.study)
        self.tracker = None
        if spec.tracking_uri.lower() != "none":
            self.tracker = Tracker(spec.tracking_uri, spec.name, self.workdir / "mlflow-spool.jsonl")
            try:
                parent = self.tracker.start(spec.dump(), spec.name, resume=existed)
            except Exception as exc:
                # redact before cutting: a cut could split a password from its '@'
                why = redact_uri(str(exc).splitlines()[0])[:200] if str(exc) else type(exc).__name__
                raise SpecError(f"cannot reach MLflow at {redact_uri(spec.tracking_uri)!r}: {why}") from None
            for study in {id(self.study): self.study, id(self.real_study): self.real_study}.values():
                study.set_user_attr("mlflow_experiment_id", self.tracker.experiment_id)
                study.set_user_attr("mlflow_parent_run_id", parent)
        self.search = self._make_search() if spec.search == "calibrated" else None
        if existed:
            self._recover()

    def _check_something_fits(self) -> None:
        """Refuse, before anything is stored, a sweep in which the cost model says nothing can run,
        naming the constraint that binds."""
        if self.prior.ranked(limit=1):
            return
        from search_spaces.space import explore

        spec = self.spec
        where = f"{spec.model} at seq_len {spec.seq_len} on {spec.num_gpus} x {spec.gpu}"
        fixed = f" with fixed {dict(spec.fixed)}" if spec.fixed else ""
        found = explore(self.prior.model, self.prior.gpu, spec.num_gpus, spec.seq_len,
                        fixed=dict(spec.fixed) or None, gbs=spec.gbs, top=1)
        if found.legal_count == 0:
            rule, count = max(found.rejected_by_rule.items(), key=lambda kv: kv[1], default=("?", 0))
            raise SpecError(f"no legal layout of {where}{fixed}: rule {rule!r} binds "
                            f"(rejects {count} of {found.total} combinations)")
        raise SpecError(f"nothing fits in memory: none of the {found.legal_count} legal layouts of {where}{fixed} "
                        f"fits the {self.prior.memory_limit_gib:.1f} GiB per GPU (memory binds; try more GPUs, "
                        f"a shorter seq_len, or free recompute/offload/precision)")

    def _make_search(self):
        """The calibrated search, taught what an earlier run of this study measured (on --resume)."""
        from orchestrator.search import CalibratedSearch

        search = CalibratedSearch.from_prior(self.prior, seed=self.spec.seed or 0)
        for t in studies.measured_trials(self.study):
            if t.user_attrs.get("layout"):
                res = t.user_attrs.get("result") or {}
                search.observe(Layout.from_dict(t.user_attrs["layout"]), t.user_attrs["status"],
                               res.get("tokens_per_sec_per_gpu"), res.get("peak_memory_gib"))
        return search

    def _recover(self) -> None:
        """Fail trials a dead orchestrator left RUNNING (re-proposing them) and replay MLflow gaps."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            reason = "orchestrator died while the trial was running; re-proposed"
            self.study._storage.set_trial_user_attr(t._trial_id, "reason", reason)
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            if self.tracker:
                try:
                    self.tracker.mark_failed(t.number, reason)
                except Exception:
                    pass
            if t.params:
                self.study.enqueue_trial(t.params, user_attrs={"proposed_by": "resume", "retry_of": t.number})
        # trials an interrupted sweep (Ctrl-C, scancel) failed on its way out: run their layouts again, once
        retried = {t.user_attrs.get("retry_of") for t in self.study.get_trials(deepcopy=False)}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            if t.user_attrs.get("reason") == INTERRUPTED and t.number not in retried and t.params:
                self.study.enqueue_trial(t.params, user_attrs={"proposed_by": "resume", "retry_of": t.number})
        if self.tracker:
            self.tracker.flush()
            for t in studies.finished_trials(self.study):
                if t.user_attrs.get("status") and not self.tracker.is_finished(t.number) and (
                        self._track_rejected or t.user_attrs["status"] != "infeasible"):
                    self.tracker.record(t.number, self._payload(t.number, t.user_attrs))

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> SweepOutcome:
        start = time.monotonic()
        self._open()
        spec = self.spec
        budget = spec.budget
        finished = studies.finished_trials(self.study)
        tried = {t.user_attrs["layout_key"] for t in finished if t.user_attrs.get("layout_key")}
        measured = len(studies.measured_trials(self.study))
        infeasible = 0
        max_proposals = budget.n_trials * budget.max_proposals_per_trial
        proposals = 0
        exhausted = False
        running: dict[concurrent.futures.Future, _Running] = {}
        backend = make_backend(spec, self.prior)
        messages: list[str] = []
        try:
            with SweepProgress(f"sweep {spec.name}", budget.n_trials, enabled=self.show_progress) as view:
                view.bar.update(view.task, completed=measured)
                while True:
                    out_of_time = budget.wall_time_s is not None and time.monotonic() - start > budget.wall_time_s
                    while (not exhausted and not out_of_time and measured + len(running) < budget.n_trials
                           and len(running) < budget.max_concurrent):
                        proposals += 1
                        if proposals > max_proposals:
                            exhausted = True
                            messages.append(f"stopped proposing after {max_proposals} proposals")
                            break
                        busy = tried | {r.layout.key() for r in running.values()}
                        outcome = self._propose(busy)
                        if outcome == "exhausted":
                            exhausted = True
                            messages.append("every layout of the space has been tried")
                        elif outcome == "infeasible":
                            infeasible += 1
                            view.advance(None, len(running), measured)
                        elif isinstance(outcome, _Running):
                            tried.add(outcome.layout.key())
                            running[backend.submit(outcome.request)] = outcome
                    if not running:
                        break
                    done, _ = concurrent.futures.wait(running, timeout=1.0,
                                                      return_when=concurrent.futures.FIRST_COMPLETED)
                    for fut in done:
                        item = running.pop(fut)
                        try:
                            result = fut.result()
                        except Exception as exc:  # a backend bug must not lose the trial
                            result = TrialResult(status="error", error=f"backend failed: {type(exc).__name__}: {exc}")
                        measured += 1
                        row = self._finish(item, result)
                        view.advance(row, len(running), measured)
        except BaseException:
            for item in running.values():  # Ctrl-C / scancel / crash: say what happened to what was running
                try:
                    item.trial.set_user_attr("reason", INTERRUPTED)
                    item.trial.set_user_attr("status", "interrupted")
                    self.study.tell(item.trial, state=TrialState.FAIL)
                    if self.tracker:
                        self.tracker.mark_failed(item.trial.number, INTERRUPTED)
                except Exception:
                    pass
            raise
        finally:
            backend.close()
            self._write_back()
        return self._summarise(start, measured, infeasible, messages)

    def _write_back(self) -> None:
        """In-memory (analytic) studies: store the new finished trials, numbered as in memory."""
        if self.study is self.real_study:
            return
        new = [t for t in self.study.get_trials(deepcopy=False)[self._copied:] if t.state.is_finished()]
        add_finished_trials(self.real_study, new)
        self._copied += len(self.study.get_trials(deepcopy=False)[self._copied:])

    def _propose(self, busy: set[str]) -> _Running | str:
        searched = None
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if self.search is not None and not waiting:  # enqueued ones (rules of thumb, retries) go first
            searched = self.search.propose(busy)
            if searched is None:
                return "exhausted"
            self.study.enqueue_trial(self.proposer.params_of(searched), user_attrs={"proposed_by": "calibrated"})
        trial = self.study.ask()
        params = self.proposer.suggest(trial)
        if searched is not None:
            layout = searched  # as proposed: layout_of() would take the non-free fields from the base
        else:
            try:
                layout = self.proposer.layout_of(params)
            except SpecError as exc:  # not even a valid Layout (e.g. GBS not a multiple of MBS)
                trial.set_user_attr("layout", {**self.proposer.base.to_dict(), **params})
                self._tell_infeasible(trial, None, str(exc))
                return "infeasible"
        key = layout.key()
        if key in busy:
            trial.set_user_attr("reason", f"repeated proposal of {key}; proposing an untried layout instead")
            self.study.tell(trial, state=TrialState.FAIL)
            alt, source = self.proposer.instead_of(layout, busy)
            if alt is None:
                return "exhausted"
            self.study.enqueue_trial(alt, user_attrs={"proposed_by": source})
            return "repeat"
        prediction = self.prior.predict(layout)
        trial.set_user_attr("layout", layout.to_dict())
        trial.set_user_attr("layout_key", key)
        trial.set_user_attr("prediction", prediction.data)
        trial.set_user_attr("backend", self.spec.backend)
        # the calibrated search deliberately tries near misses (the model's memory may be pessimistic)
        if not prediction.legal or (not prediction.fits and searched is None):
            self._tell_infeasible(trial, prediction, prediction.reason or "rejected by the cost model")
            return "infeasible"
        request = self._request(trial.number, layout)
        if self.tracker:
            try:
                run_id, _ = self.tracker.child(trial.number, layout.to_dict(), self.spec.backend,
                                               self._run_name(trial.number, layout))
                trial.set_user_attr("mlflow_run_id", run_id)
            except Exception:
                pass  # recorded later from the storage (sync on finish / resume)
        return _Running(trial, layout, prediction, request)

    def _request(self, number: int, layout: Layout) -> TrialRequest:
        spec = self.spec
        return TrialRequest(layout=layout, model=spec.model, seq_len=spec.seq_len, gpu=spec.gpu,
                            num_gpus=spec.num_gpus, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                            steps=spec.steps, warmup=spec.warmup, timeout_s=spec.trial_timeout_s,
                            workdir=self.workdir / f"trial-{number:04d}",
                            num_layers=spec.model_overrides.num_layers,
                            hidden_size=spec.model_overrides.hidden_size, trial_number=number)

    # ---- telling -------------------------------------------------------------------------------
    def _tell_infeasible(self, trial: optuna.Trial, prediction: Prediction | None, reason: str) -> None:
        memory = (prediction.peak_memory_gib if prediction else None) or 0.0
        trial.set_user_attr("status", "infeasible")
        trial.set_user_attr("reason", reason)
        trial.set_constraint("memory_over_limit_gib", max(memory - self.prior.memory_limit_gib, 0.0))
        trial.set_constraint("not_measured_ok", 1.0)
        self.study.tell(trial, [0.0, _finite(memory)])
        if self.tracker and self._track_rejected:
            attrs = dict(trial.user_attrs)
            self.tracker.record(trial.number, self._payload(trial.number, attrs))

    def _finish(self, item: _Running, result: TrialResult) -> dict[str, Any]:
        trial = item.trial
        # numbers that cannot be trusted (above peak, CP/EP not in effect, NaN loss) become status invalid
        result = validate(result, item.layout, self.prior.gpu)
        limit = self.prior.memory_limit_gib
        memory = result.peak_memory_gib if result.peak_memory_gib is not None else item.prediction.peak_memory_gib
        ok = result.status == "ok" and result.tokens_per_sec_per_gpu is not None
        over = (memory or 0.0) - limit
        if result.status == "oom":
            over = max(over, 1.0)  # it did not fit, whatever the partial numbers say
        trial.set_user_attr("status", result.status)
        trial.set_user_attr("result", _jsonable(result.to_dict()))
        if result.error:
            trial.set_user_attr("reason", result.error[:2000])
        if result.extra.get("command"):
            trial.set_user_attr("command", result.extra["command"])
        trial.set_constraint("memory_over_limit_gib", max(over, 0.0))
        trial.set_constraint("not_measured_ok", 0.0 if ok else 1.0)
        values = [_finite(result.tokens_per_sec_per_gpu) if ok else 0.0, _finite(memory)]
        self.study.tell(trial, values)
        if self.search is not None:  # correct the model's prediction from what was measured
            self.search.observe(item.layout, result.status, result.tokens_per_sec_per_gpu, result.peak_memory_gib)
        if self.tracker:
            payload = self._payload(trial.number, dict(trial.user_attrs))
            payload["logs"] = sorted(str(p) for p in Path(item.request.workdir).glob("*.log"))
            self.tracker.record(trial.number, payload)
        return {"trial": trial.number, "layout": _short(item.layout), "status": result.status,
                "tokens": result.tokens_per_sec_per_gpu, "predicted": item.prediction.tokens_per_sec_per_gpu,
                "memory": result.peak_memory_gib}

    def _payload(self, number: int, attrs: dict[str, Any]) -> dict[str, Any]:
        layout = attrs.get("layout") or {}
        return {"layout": layout, "status": attrs.get("status", ""), "result": attrs.get("result"),
                "prediction": attrs.get("prediction"), "backend": attrs.get("backend", self.spec.backend),
                "command": attrs.get("command"), "reason": attrs.get("reason"),
                "run_name": f"trial-{number}",
                "logs": sorted(str(p) for p in (self.workdir / f"trial-{number:04d}").glob("*.log"))}

    @staticmethod
    def _rejections(frame) -> list[dict[str, Any]]:
        """Rejected proposals as rows (for the parent run when they get no child runs)."""
        rows = frame[frame["status"] == "infeasible"]
        cols = ["trial", "tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "recompute", "precision", "reason"]
        return rows[cols].to_dict(orient="records") if not rows.empty else []

    @staticmethod
    def _run_name(number: int, layout: Layout) -> str:
        return f"trial-{number}"

    # ---- the end -------------------------------------------------------------------------------
    def _summarise(self, start: float, measured: int, infeasible: int, messages: list[str]) -> SweepOutcome:
        study = self.real_study
        best = studies.best_fitting_trial(study)
        pareto = studies.pareto_trials(study)
        pending = 0
        if self.tracker:
            try:
                pending = self.tracker.flush()
                summary = {
                    "n_trials": measured,
                    "best": None if best is None else {
                        "trial": best.number, "layout": best.user_attrs.get("layout"),
                        "layout_key": best.user_attrs.get("layout_key"),
                        "measured": {k: (best.user_attrs.get("result") or {}).get(k) for k in
                                     ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "peak_memory_gib")}},
                    "pareto": [t.number for t in pareto]}
                buf = io.StringIO()
                frame = studies.leaderboard(study)
                frame[frame["trial"].isin([t.number for t in pareto])].to_csv(buf, index=False)
                if not self._track_rejected:
                    summary["rejected_by_model"] = self._rejections(frame)
                if not pending:
                    self.tracker.finish(summary, buf.getvalue())
            except Exception as exc:
                pending = max(pending, 1)
                messages.append(f"MLflow: {type(exc).__name__}: {exc}")
        if pending:
            messages.append(f"MLflow did not receive {pending} trial record(s); they are kept in the Optuna "
                            f"storage and {self.tracker.spool_path}; rerun with --resume to deliver them")
        return SweepOutcome(study=study, best=best, pareto=pareto, n_measured=measured,
                            n_infeasible=sum(1 for t in studies.finished_trials(study)
                                             if t.user_attrs.get("status") == "infeasible"),
                            wall_time_s=time.monotonic() - start, mlflow_pending=pending, messages=messages)


def run_sweep(spec: SweepSpec, resume: bool = False, prior: Prior | None = None,
              show_progress: bool = True) -> SweepOutcome:
    return Sweep(spec, resume=resume, prior=prior, show_progress=show_progress).run()


def _finite(value: Any) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0


def _jsonable(data: Any) -> Any:
    if isinstance(data, dict):
        return {str(k): _jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_jsonable(v) for v in data]
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if data is None or isinstance(data, (str, int, float, bool)):
        return data
    return str(data)


def _short(layout: Layout) -> str:
    parts = [f"{k}{getattr(layout, k)}" for k in ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs") if getattr(layout, k) > 1]
    parts.append(f"rc={layout.recompute}")
    return " ".join(parts) or "dp"
