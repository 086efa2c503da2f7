"""MLflow records checked through MlflowClient against a real `mlflow server` on 127.0.0.1."""

import json
import re
import time

import optuna
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from orchestrator.errors import LeaseLost, TrackingError
from orchestrator.records import queries
from orchestrator.spec.schema import parse_spec
from orchestrator.storage import studies
from orchestrator.sweep import run_sweep
from orchestrator.tracking.parent_run import safe_environment
from orchestrator.tracking.runs import RunRecord
from orchestrator.tracking.tracker import Tracker
from orchestrator.tracking.views import EXPERIMENT_KIND_TAG, TRIALS_VIEW, VIEW_TAG_PREFIX, layout_params
from tests.mlflow_server import free_port  # the session's `mlflow_server` fixture comes from tests/conftest.py
from tests.sweep_helpers import prior_for

# this module's sweeps, each with its tracking_uri (sweep_spec: tests/conftest.py)
TRACKED = {"budget": {"n_trials": 5}, "seed": 2, "track_rejected": True}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_parent_and_one_child_per_trial_on_a_real_server(tmp_path, sweep_spec, mlflow_server, monkeypatch):
    monkeypatch.setenv("MOE_AUTOTUNE_API_TOKEN", "do-not-log-me")
    monkeypatch.setenv("NCCL_ALGO", "visible")  # an allowed (tuning) variable
    spec = parse_spec(sweep_spec("tracked", TRACKED, tracking_uri=mlflow_server.uri))
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name("tracked")
    assert exp is not None
    parent = client.get_run(out.study.user_attrs["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["best_layout_key"] == out.best.user_attrs["layout_key"]
    assert parent.data.metrics["best_tokens_per_sec_per_gpu"] == pytest.approx(out.best.values[0])
    parent_files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"spec.json", "summary.json", "pareto.csv", "environment.json"} <= parent_files
    env_text = json.dumps(client.load_dict(f"runs:/{parent.info.run_id}/environment.json")) \
        if hasattr(client, "load_dict") \
        else open(client.download_artifacts(parent.info.run_id, "environment.json")).read()
    assert "do-not-log-me" not in env_text and "visible" in env_text

    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    finished = queries.finished_trials(out.study)
    assert len(children) == len(finished) >= 5
    by_number = {int(r.data.tags["optuna_trial_number"]): r for r in children}
    assert set(by_number) == {t.number for t in finished}
    for t in finished:
        run = by_number[t.number]
        assert run.data.tags["status"] == t.user_attrs["status"]
        assert run.data.tags["backend"] == "analytic"
        if (t.user_attrs.get("prediction") or {}).get("tokens_per_sec_per_gpu") is not None:
            assert "predicted_tokens_per_sec_per_gpu" in run.data.metrics
        assert {"tp", "cp", "ep", "pp", "mbs", "recompute"} <= set(run.data.params)
        if t.user_attrs["status"] == "ok":
            assert t.user_attrs["mlflow_run_id"] == run.info.run_id
            for name in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "peak_memory_gib", "step_time_s"):
                assert name in run.data.metrics, name
        if t.user_attrs["status"] == "infeasible":
            assert run.data.tags["reason"]


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(120)
def test_unreachable_tracking_server_fails_loudly_before_any_trial(tmp_path, sweep_spec, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    spec = parse_spec(sweep_spec("tracked", TRACKED, tracking_uri=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(TrackingError, match="cannot use the MLflow tracking URI"):
        run_sweep(spec, prior=prior_for(spec), show_progress=False)
    # nothing was created that a corrected rerun would trip over ("already exists")
    assert not studies.store_path(spec.storage).exists() or not optuna.get_all_study_summaries(spec.storage)
    fixed = spec.model_copy(update={"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    assert run_sweep(fixed, prior=prior_for(fixed), show_progress=False).exit_code == 0


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(200)
def test_mlflow_outage_spools_then_delivers_or_says_so(tmp_path, sweep_spec, monkeypatch):
    spec = parse_spec(sweep_spec("tracked", TRACKED, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                                 budget={"n_trials": 4}))
    real = Tracker._record
    calls = {"n": 0}

    def flaky(self, run):  # the first three deliveries fail: MLflow "down"
        calls["n"] += 1
        if calls["n"] <= 3:
            raise ConnectionError("mlflow down")
        return real(self, run)

    monkeypatch.setattr(Tracker, "_record", flaky)
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0 and out.mlflow_pending == 0
    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    parent_id = out.study.user_attrs["mlflow_parent_run_id"]
    runs = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    numbers = sorted(int(r.data.tags["optuna_trial_number"]) for r in runs if "optuna_trial_number" in r.data.tags)
    assert numbers == sorted(t.number for t in queries.finished_trials(out.study))
    assert all(r.info.status == "FINISHED" for r in runs if "optuna_trial_number" in r.data.tags)

    # never back: exit code says so and the spool keeps the records
    monkeypatch.setattr(Tracker, "_record", lambda self, run: (_ for _ in ()).throw(ConnectionError("down")))
    spec2 = parse_spec(sweep_spec("tracked-down", TRACKED, tracking_uri=spec.tracking_uri, budget={"n_trials": 2}))
    out2 = run_sweep(spec2, prior=prior_for(spec2), show_progress=False)
    assert out2.exit_code == 3 and out2.mlflow_pending >= 2
    spool = tmp_path / "runs" / "tracked-down" / "mlflow-spool.jsonl"
    lines = [json.loads(x) for x in spool.read_text().splitlines()]
    assert {r["trial_number"] for r in lines} >= {t.number for t in queries.measured_trials(out2.study)}
    assert any("MLflow did not receive" in m for m in out2.messages)


def test_safe_environment_drops_secret_names(monkeypatch):
    monkeypatch.setenv("MOE_AUTOTUNE_SECRET_THING", "x")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "y")
    monkeypatch.setenv("NCCL_SECRET_KEY", "z")  # in an allowed namespace, but named like a secret
    monkeypatch.setenv("MOE_AUTOTUNE_FAULT", "oom@1")
    env = safe_environment()["variables"]
    assert not {"MOE_AUTOTUNE_SECRET_THING", "MLFLOW_TRACKING_PASSWORD", "NCCL_SECRET_KEY"} & set(env)
    assert env["MOE_AUTOTUNE_FAULT"] == "oom@1"


def _tear(spool, middle: str | None = None):
    """Leave the spool as a crash would: the last record cut off mid-write (and, if given, a corrupt
    line in the middle). Returns the trial numbers of the records that are still whole."""
    lines = spool.read_text().splitlines()
    assert len(lines) >= 2, "the outage left too few records to tear one"
    whole = [json.loads(x)["trial_number"] for x in lines[:-1]]
    if middle is not None:
        lines.insert(1, middle)
    spool.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # no newline: torn
    return whole


@pytest.mark.timeout(200)
def test_torn_last_spool_line_is_skipped_and_resume_delivers_the_rest(tmp_path, sweep_spec, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands in tmp_path
    spec = parse_spec(sweep_spec("torn", TRACKED, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                                 budget={"n_trials": 3}))
    real = Tracker._record
    monkeypatch.setattr(Tracker, "_record", lambda self, run: (_ for _ in ()).throw(ConnectionError("down")))
    first = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert first.exit_code == 3
    spool = tmp_path / "runs" / "torn" / "mlflow-spool.jsonl"
    _tear(spool)
    monkeypatch.setattr(Tracker, "_record", real)  # MLflow is back

    with caplog.at_level("WARNING"):
        out = run_sweep(spec, resume=True, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0 and out.mlflow_pending == 0
    assert any("torn" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    parent_id = out.study.user_attrs["mlflow_parent_run_id"]
    runs = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    numbers = sorted(int(r.data.tags["optuna_trial_number"]) for r in runs if "optuna_trial_number" in r.data.tags)
    # the torn record's trial is replayed from the Optuna storage: nothing lost, nothing doubled
    assert numbers == sorted(t.number for t in queries.finished_trials(out.study))


def test_corrupt_spool_lines_are_kept_aside_never_dropped(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands in tmp_path
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "spooled", tmp_path / "w" / "mlflow-spool.jsonl")
    tracker.start({"name": "spooled"}, "spooled", resume=False)
    payload = {"layout": {"tp": 1}, "backend": "analytic", "status": "ok", "result": {"tokens_per_sec_per_gpu": 1.0}}
    for number in (0, 1, 2):
        tracker.spool.add({"trial_number": number, "payload": payload})
    _tear(tracker.spool.path, middle='{"trial_number": 7, "payl')  # a damaged record between whole ones
    tracker.spool.add({"trial_number": 3, "payload": payload})  # appended after the torn line: must stay whole
    tracker.spool.add({"trial_number": 4, "payload": "not a record"})  # valid JSON, not a record

    with caplog.at_level("WARNING"):
        pending = tracker.flush()
    assert pending == 0 and not tracker.spool.path.exists()
    assert all(tracker.is_finished(n) for n in (0, 1, 3)) and not tracker.is_finished(2)
    # the fragment of 2 is no longer last once 3 follows it: kept aside like the other damaged lines
    assert tracker.spool.set_aside == 3 and tracker.spool.torn == 0
    corrupt = tracker.spool.path.with_name("mlflow-spool.corrupt.jsonl")
    kept = corrupt.read_text().splitlines()
    assert kept[0] == '{"trial_number": 7, "payl' and kept[1].startswith('{"trial_number": 2') and len(kept) == 3
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "corrupt" in messages and str(corrupt) in messages

    # a torn last line alone (the crash happened during the last write): skipped, said, counted
    for number in (5, 6):
        tracker.spool.add({"trial_number": number, "payload": payload})
    _tear(tracker.spool.path)
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert tracker.flush() == 0
    assert tracker.is_finished(5) and tracker.spool.torn == 1 and tracker.spool.set_aside == 3
    assert any("torn" in r.getMessage() for r in caplog.records)
    assert len(corrupt.read_text().splitlines()) == 3


def _parent_artifacts(client, run_id: str) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "report")}


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
def test_the_sweep_experiment_opens_as_training_and_its_parent_carries_the_leaderboard(tmp_path, sweep_spec,
                                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands in tmp_path
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # MlflowClient.load_table searches with the global URI
    spec = parse_spec(sweep_spec("viewed", TRACKED, tracking_uri=uri, budget={"n_trials": 4}, track_rejected=False))
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("viewed")
    assert exp.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    view = json.loads(exp.tags[VIEW_TAG_PREFIX + TRIALS_VIEW])
    state = json.loads(view["state"])
    assert state["orderByKey"] == "metrics.`tokens_per_sec_per_gpu`" and state["orderByAsc"] is False
    assert state["selectedColumns"][0] == "metrics.`tokens_per_sec_per_gpu`"
    assert {f"params.`{k}`" for k in spec.free} <= set(state["selectedColumns"])

    parent = out.study.user_attrs["mlflow_parent_run_id"]
    assert {"leaderboard.json", "leaderboard.csv", "pareto.html", "report/report.html"} <= _parent_artifacts(
        client, parent)
    assert not [p for p in _parent_artifacts(client, parent) if p.endswith(".png")]  # no PNGs at a sweep's end
    board = queries.leaderboard(out.study)
    csv = open(client.download_artifacts(parent, "leaderboard.csv", str(tmp_path))).read()
    assert csv == board.to_csv(index=False)
    table = client.load_table(exp.experiment_id, "leaderboard.json", run_ids=[parent])
    assert sorted(table["trial"]) == sorted(board["trial"])
    pareto = open(client.download_artifacts(parent, "pareto.html", str(tmp_path))).read()
    # plotly.js inlined (MLflow's default would load it from a CDN): the plot opens offline
    assert "Pareto front" in pareto and not re.search(r"<script[^>]*\bsrc=", pareto)

    # a resumed sweep replaces the table (MLflow's log_table alone would append the old rows again)
    more = parse_spec(sweep_spec("viewed", TRACKED, tracking_uri=uri, budget={"n_trials": 6}, track_rejected=False))
    again = run_sweep(more, resume=True, prior=prior_for(more), show_progress=False)
    assert again.study.user_attrs["mlflow_parent_run_id"] == parent
    board = queries.leaderboard(again.study)
    assert len(board) > len(table)
    table = client.load_table(exp.experiment_id, "leaderboard.json", run_ids=[parent])
    assert sorted(table["trial"]) == sorted(board["trial"])


def test_a_trial_run_logs_loss_and_step_times_as_steps_beside_the_prediction(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "stepped", tmp_path / "w" / "mlflow-spool.jsonl")
    tracker.start({"name": "stepped", "free": ["tp", "pp"]}, "stepped", resume=False)
    payload = {"layout": {"tp": 1}, "backend": "local", "status": "ok",
               "result": {"tokens_per_sec_per_gpu": 100.0, "step_time_s": 0.5, "step_times_s": [0.6, 0.5, 0.5],
                          "loss": [5.0, 4.9, float("nan"), 4.7],
                          "extra": {"fidelity": "full", "gpu_seconds": 8.0, "loss_includes_warmup": True}},
               "prediction": {"tokens_per_sec_per_gpu": 110.0, "peak_memory_gib": 1.5}}
    assert tracker.record(RunRecord.from_payload(0, payload))  # a spool line's payload, as older sweeps wrote it
    client = MlflowClient(uri)
    run = client.get_run(tracker._children[0].run_id)
    loss = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")]
    assert sorted(loss) == [(0, 5.0), (1, 4.9), (3, 4.7)]  # the trainer's steps; a NaN step is left out
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "step_time_s")) == [0, 1, 2]
    assert run.data.metrics["tokens_per_sec_per_gpu"] == 100.0
    assert run.data.metrics["predicted_tokens_per_sec_per_gpu"] == 110.0
    assert run.data.metrics["gpu_seconds"] == 8.0 and run.data.tags["fidelity"] == "full"
    state = json.loads(json.loads(client.get_experiment(tracker.experiment_id).tags[VIEW_TAG_PREFIX + TRIALS_VIEW])
                       ["state"])
    assert [c for c in state["selectedColumns"] if c.startswith("params.")] == ["params.`tp`", "params.`pp`"]


def test_a_resume_records_a_trial_whose_run_a_killed_driver_left_open_without_logging_twice(tmp_path, monkeypatch):
    """A driver killed after logging a trial's figures but before closing its run: the resume records the trial
    into the same run, and every figure (and each step of a history) is there once."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    payload = {"layout": {"tp": 1}, "backend": "local", "status": "ok",
               "result": {"tokens_per_sec_per_gpu": 100.0, "step_time_s": 0.5, "step_times_s": [0.6, 0.5, 0.5],
                          "loss": [5.0, 4.9], "extra": {"fidelity": "full"}},
               "prediction": {"tokens_per_sec_per_gpu": 110.0, "peak_memory_gib": 1.5}}
    first = Tracker(uri, "killed", tmp_path / "w" / "mlflow-spool.jsonl")
    first.start({"name": "killed"}, "killed", resume=False)
    record = RunRecord.from_payload(0, payload).record
    child = first._child(0, record.layout, "local")
    first.client.log_batch(child.run_id, metrics=[Metric(k, v, 0, s) for k, v, s in record.mlflow_metrics()])
    # ... killed here: the run stays RUNNING with its figures
    second = Tracker(uri, "killed", tmp_path / "w" / "mlflow-spool.jsonl")
    second.start({"name": "killed"}, "killed", resume=True)
    assert second.record(RunRecord.from_payload(0, payload))
    client = MlflowClient(uri)
    assert second._children[0].run_id == child.run_id and client.get_run(child.run_id).info.status == "FINISHED"
    for key in ("tokens_per_sec_per_gpu", "predicted_tokens_per_sec_per_gpu", "step_time_s", "loss"):
        steps = [m.step for m in client.get_metric_history(child.run_id, key)]
        assert len(steps) == len(set(steps)) >= 1, (key, steps)
    assert len(client.get_metric_history(child.run_id, "tokens_per_sec_per_gpu")) == 1  # what `check` asks


@pytest.mark.parametrize("failing", ["set_terminated", "log_dict", "log_artifact"])
def test_a_record_that_failed_after_its_figures_is_delivered_from_the_spool_without_logging_them_twice(
        tmp_path, monkeypatch, failing):
    """The same driver's retry, not only a resume's: a record whose figures went (log_batch) before a later write
    of it failed (MLflow's SQLite store "database is locked" under load) is spooled; the flush that delivers it
    must not log the figures again (`check`: "logged more than once"; seen once in the full suite on 3 workers)."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "retried", tmp_path / "w" / "mlflow-spool.jsonl")
    tracker.start({"name": "retried"}, "retried", resume=False)
    log = tmp_path / "trainer.log"
    log.write_text("step 1\n")
    payload = {"layout": {"tp": 1}, "backend": "local", "status": "ok", "command": {"argv": ["python"]},
               "result": {"tokens_per_sec_per_gpu": 100.0, "step_time_s": 0.5, "step_times_s": [0.6, 0.5, 0.5],
                          "loss": [5.0, 4.9], "extra": {"fidelity": "full"}},
               "prediction": {"tokens_per_sec_per_gpu": 110.0, "peak_memory_gib": 1.5}, "logs": [str(log)]}
    real = getattr(MlflowClient, failing)

    def locked(self, *args, **kwargs):
        raise MlflowException("(sqlite3.OperationalError) database is locked")

    monkeypatch.setattr(MlflowClient, failing, locked)
    assert not tracker.record(RunRecord.from_payload(0, payload))  # its figures went, the rest did not: spooled
    run_id = tracker._children[0].run_id
    client = MlflowClient(uri)
    assert client.get_run(run_id).data.metrics["tokens_per_sec_per_gpu"] == 100.0
    monkeypatch.setattr(MlflowClient, failing, real)
    assert tracker.flush() == 0
    assert client.get_run(run_id).info.status == "FINISHED"
    for key in ("tokens_per_sec_per_gpu", "predicted_tokens_per_sec_per_gpu", "step_time_s", "loss"):
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)) >= 1, (key, steps)
    assert len(client.get_metric_history(run_id, "tokens_per_sec_per_gpu")) == 1  # what `check` asks


@pytest.mark.parametrize("store", ["sqlite", "server"])
def test_a_record_made_twice_by_writers_that_raced_is_in_its_run_once(tmp_path, monkeypatch, request, store):
    """By class, not by case: whatever lets two writers make one trial's record (each asked the run what it held
    before the other's figures were there: seen twice in the SIGTERM-and-resume rounds under load), the figures are
    logged at the run's start time, so the second batch is the same rows, which MLflow's store keeps once."""
    monkeypatch.chdir(tmp_path)
    uri = request.getfixturevalue("mlflow_server").uri if store == "server" else f"sqlite:///{tmp_path / 'm.db'}"
    payload = {"layout": {"tp": 1}, "backend": "local", "status": "ok",
               "result": {"tokens_per_sec_per_gpu": 100.0, "step_time_s": 0.5, "step_times_s": [0.6, 0.5, 0.5],
                          "loss": [5.0, 4.9], "extra": {"fidelity": "full"}},
               "prediction": {"tokens_per_sec_per_gpu": 110.0, "peak_memory_gib": 1.5}}
    tracker = Tracker(uri, f"raced-{store}", tmp_path / "w" / "mlflow-spool.jsonl")
    tracker.start({"name": "raced"}, f"raced-{store}", resume=False)
    monkeypatch.setattr(Tracker, "_not_yet_logged", lambda self, run_id, metrics: metrics)  # read before the other
    run = RunRecord.from_payload(0, payload)
    tracker._record(run)
    run_id = tracker._children[0].run_id
    time.sleep(0.01)  # the second writer's clock has moved on
    tracker._children[0].status = "RUNNING"
    tracker._record(run)
    client = MlflowClient(uri)
    for key in ("tokens_per_sec_per_gpu", "predicted_tokens_per_sec_per_gpu", "step_time_s", "loss"):
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)) >= 1, (key, steps)
    assert len(client.get_metric_history(run_id, "tokens_per_sec_per_gpu")) == 1  # what `check` asks


def test_a_run_a_killed_driver_began_without_its_params_gets_them_with_the_record(tmp_path, monkeypatch):
    """An analytic trial's run is begun with its result, its params logged with the record's batch: a driver killed
    between the two leaves a run without params, which the resume's record of that trial completes."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    payload = {"layout": {"tp": 2, "pp": 1}, "backend": "analytic", "status": "ok",
               "result": {"tokens_per_sec_per_gpu": 100.0}, "prediction": {"tokens_per_sec_per_gpu": 100.0}}
    record = RunRecord.from_payload(0, payload).record
    first = Tracker(uri, "unlogged", tmp_path / "w" / "mlflow-spool.jsonl")
    first.start({"name": "unlogged"}, "unlogged", resume=False)
    run_ids = [first.child(n, record.layout, "analytic", params_now=False) for n in (0, 1)]
    client = MlflowClient(uri)
    assert [client.get_run(r).data.params for r in run_ids] == [{}, {}]  # ... killed here
    second = Tracker(uri, "unlogged", tmp_path / "w" / "mlflow-spool.jsonl")
    second.start({"name": "unlogged"}, "unlogged", resume=True)
    assert second.record(RunRecord.from_payload(0, payload))  # trial 0 recorded by the resume
    assert second.child(1, record.layout, "analytic") == run_ids[1]  # trial 1 begun again, its params at once
    for run_id in run_ids:
        assert client.get_run(run_id).data.params == layout_params(record.layout)


def test_a_trial_stopped_as_its_run_was_created_is_failed_with_that_run_closed(tmp_path, monkeypatch):
    """Ctrl-C lands once MLflow has made a trial's run but before the tracker heard back: the trial is then failed
    as interrupted, and its run must be found and closed FAILED, not left running beside a failed trial."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "stopped", tmp_path / "w" / "mlflow-spool.jsonl")
    tracker.start({"name": "stopped"}, "stopped", resume=False)
    real = MlflowClient.create_run

    def made_then_stopped(self, *args, **kwargs):
        real(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(MlflowClient, "create_run", made_then_stopped)
    with pytest.raises(KeyboardInterrupt):
        tracker.child(0, RunRecord.from_payload(0, {"layout": {"tp": 1}}).record.layout, "analytic", params_now=False)
    monkeypatch.setattr(MlflowClient, "create_run", real)
    tracker.mark_failed(0, "sweep interrupted")
    runs = MlflowClient(uri).search_runs([tracker.experiment_id], "tags.`optuna_trial_number` = '0'")
    assert [(r.info.status, r.data.tags["status"]) for r in runs] == [("FAILED", "interrupted")]


def test_a_driver_taken_over_mid_record_makes_no_further_mlflow_write_and_spools_nothing(tmp_path, monkeypatch):
    """The fence stands before every MLflow write, not only before a trial's record: a driver that wakes up
    (SIGSTOP past its lease) in the middle of a record stops at its next call, and the record is the new
    driver's to make (not spooled for this one to deliver)."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "fenced", tmp_path / "w" / "mlflow-spool.jsonl")
    tracker.start({"name": "fenced"}, "fenced", resume=False)
    payload = {"layout": {"tp": 1}, "backend": "local", "status": "ok",
               "result": {"tokens_per_sec_per_gpu": 100.0, "step_time_s": 0.5, "extra": {"fidelity": "full"}},
               "prediction": {"tokens_per_sec_per_gpu": 110.0, "peak_memory_gib": 1.5}}
    record = RunRecord.from_payload(0, payload)
    run_id = tracker._child(0, record.record.layout, "local").run_id
    writes = []

    def fence():  # the lease is lost after the record's first write
        if writes:
            raise LeaseLost("study 'fenced' was taken over")
        writes.append(1)
    tracker.fence = fence
    with pytest.raises(LeaseLost):
        tracker.record(record)
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "RUNNING"  # the record's first write (its figures) went, set_terminated did not
    assert run.data.metrics["tokens_per_sec_per_gpu"] == 100.0
    assert "trial.json" not in {a.path for a in MlflowClient(uri).list_artifacts(run_id)}
    assert not (tmp_path / "w" / "mlflow-spool.jsonl").exists() and tracker.spool.pending == 0
    with pytest.raises(LeaseLost):
        tracker.mark_failed(0, "interrupted")  # the fence stays lost
    assert MlflowClient(uri).get_run(run_id).info.status == "RUNNING"


def test_a_run_the_server_made_without_answering_is_completed_not_doubled(tmp_path, monkeypatch):
    """MLflow stopping in the middle of a create_run: the server made the run but the client got no answer.
    The spooled record (and a trial's start) must find that run again, not make a second one for the trial."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "unanswered", tmp_path / "w" / "mlflow-spool.jsonl")
    tracker.start({"name": "unanswered"}, "unanswered", resume=False)
    real = tracker.client._client

    class Unanswered:  # the run is made, then the connection drops before the answer
        def __getattr__(self, name):
            return getattr(real, name)

        def create_run(self, *args, **kwargs):
            real.create_run(*args, **kwargs)
            raise ConnectionError("connection reset before the answer")

    payload = {"layout": {"tp": 2, "pp": 1}, "backend": "local", "status": "ok",
               "result": {"tokens_per_sec_per_gpu": 100.0, "step_time_s": 0.5, "step_times_s": [0.6, 0.5],
                          "extra": {"fidelity": "full"}},
               "prediction": {"tokens_per_sec_per_gpu": 110.0, "peak_memory_gib": 1.5}}
    class Down:
        def __getattr__(self, name):
            raise ConnectionError("connection refused")

    tracker.client._client = Unanswered()
    assert tracker.child(0, RunRecord.from_payload(0, payload).record.layout, "local") is None  # trial 0 starts
    tracker.client._client = Down()
    assert not tracker.record(RunRecord.from_payload(0, payload))  # ... and ends while MLflow is down: spooled
    tracker.client._client = Unanswered()
    assert not tracker.record(RunRecord.from_payload(1, payload))  # trial 1's record: made, unanswered, spooled
    tracker.client._client = real  # MLflow answers again
    assert tracker.flush() == 0
    runs = MlflowClient(uri).search_runs([tracker.experiment_id], "tags.`optuna_trial_number` != ''")
    per_trial = sorted(r.data.tags["optuna_trial_number"] for r in runs)
    assert per_trial == ["0", "1"], per_trial
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.params["tp"] == "2"
        assert len(MlflowClient(uri).get_metric_history(run.info.run_id, "tokens_per_sec_per_gpu")) == 1
