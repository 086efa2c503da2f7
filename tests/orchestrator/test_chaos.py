"""Chaos with real processes: OOM, hang, hard crash, a Ray worker killed, the orchestrator SIGKILLed,
the MLflow server down, every trial failing. Nothing lost, nothing hung, nothing doubled.

The OOM and crash cases run the real Megatron-Core trainer with its test fault hook (MOE_AUTOTUNE_FAULT);
the others use tests/fake_trainer.py because orchestration is what they test.

This module doubles as a trainer wrapper (`python -m tests.orchestrator.test_chaos <trainer flags>`): it gives each
trial
of a sweep its own fault from MOE_AUTOTUNE_CHAOS_PLAN, then runs the real trainer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# ---- the wrapper trainer -------------------------------------------------------------------------------
def _chaos_trainer() -> None:
    """Trial i (in start order) gets fault i of MOE_AUTOTUNE_CHAOS_PLAN ("oom@1,crash@1,-"; "-" = none)."""
    import runpy

    plan = os.environ["MOE_AUTOTUNE_CHAOS_PLAN"].split(",")
    slots = Path(os.environ["MOE_AUTOTUNE_CHAOS_DIR"])
    slots.mkdir(parents=True, exist_ok=True)
    fault = "-"
    for i, item in enumerate(plan):
        try:
            os.close(os.open(slots / f"slot-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        fault = item
        (slots / f"slot-{i}").write_text(" ".join(sys.argv[1:]))
        break
    os.environ.pop("MOE_AUTOTUNE_FAULT", None)
    if fault != "-":
        os.environ["MOE_AUTOTUNE_FAULT"] = fault
    print(f"chaos wrapper: fault {fault}", flush=True)
    sys.argv[0] = "trainers.megatron_moe"
    runpy.run_module("trainers.megatron_moe", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _chaos_trainer()


# ---- helpers -------------------------------------------------------------------------------------------
# this module's sweeps: tests/sweep_helpers.FAKE_TRAINER with CHAOS over it (each test imports FAKE_TRAINER: not at
# the top, this module is also a trainer), through the sweep_spec fixture (tests/conftest.py)
CHAOS = {"gpus_per_node": 1, "seq_len": 128, "gbs": 4, "budget": {"n_trials": 3}, "seed": 5, "steps": 2,
         "free": ["mbs", "recompute"], "tracking_uri": "none", "trial_timeout_s": 300,
         "fixed": {"precision": "fp32", "cuda_graphs": "none", "dispatcher": "alltoall", "optimizer_offload": 0}}


def _processes_mentioning(text: str) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and text in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _wait_until_gone(text: str, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in _processes_mentioning(text) if _alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _reap(procs) -> None:
    for proc in procs:
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 -- already gone: nothing to clean up
            pass


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _load(storage: str, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


def _count(storage: str, name: str, status: str | None = None) -> int:
    from orchestrator.records import queries

    try:
        study = _load(storage, name)
    except Exception:  # noqa: BLE001 -- not created yet
        return 0
    ran = queries.measured_trials(study)
    return len([t for t in ran if status is None or t.user_attrs.get("status") == status])


def _running(storage: str, name: str) -> int:
    import optuna

    try:
        return len(_load(storage, name).get_trials(states=(optuna.trial.TrialState.RUNNING,)))
    except Exception:  # noqa: BLE001 -- not created yet, or locked for a moment
        return 0


def _env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    env.pop("MOE_AUTOTUNE_TRAINER_MODULE", None)
    env.update(extra)
    return env


def _cli(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("moe-autotune")), *args]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- real trainer: OOM and hard crash ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_trainer_oom_and_crash_are_recorded_and_the_sweep_continues(tmp_path, sweep_spec, monkeypatch):
    """Three real trainer runs at once: one OOMs at step 1, one is SIGKILLed at step 1, one succeeds."""
    from orchestrator.records import queries
    from orchestrator.spec.schema import parse_spec
    from orchestrator.sweep import run_sweep
    from tests.sweep_helpers import FAKE_TRAINER, prior_for

    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    monkeypatch.delenv("MOE_AUTOTUNE_FAULT", raising=False)
    monkeypatch.setenv("MOE_AUTOTUNE_CHAOS_PLAN", "oom@1,crash@1,-")
    monkeypatch.setenv("MOE_AUTOTUNE_CHAOS_DIR", str(tmp_path / "slots"))
    spec = parse_spec(sweep_spec("real-faults", FAKE_TRAINER, CHAOS, trainer_module="tests.orchestrator.test_chaos",
                                 launcher="torchrun", budget={"n_trials": 3, "max_concurrent": 3},
                                 trial_timeout_s=600))
    outcome = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    ran = {t.user_attrs["status"]: t for t in queries.measured_trials(outcome.study)}
    assert outcome.n_measured == 3 and sorted(ran) == ["error", "ok", "oom"], \
        {s: t.user_attrs.get("reason", "")[-500:] for s, t in ran.items()}

    # hard crash: status error, with the launcher's log tail kept as evidence
    crash = ran["error"]
    tail = crash.user_attrs["result"]["extra"]["log_tail"]
    assert "fault crash@1" in tail and ("SIGKILL" in tail or "Signal 9" in tail or "-9" in tail), tail[-1500:]
    assert "without a result" in crash.user_attrs["reason"]

    # the sweep went on: the good layout was measured and is the best
    assert outcome.exit_code == 0 and outcome.best is not None
    assert outcome.best.number == ran["ok"].number

    # OOM: status oom, the layout it tried, and its memory (so the cost model can be checked against it)
    oom = ran["oom"]
    result = oom.user_attrs["result"]
    assert "OutOfMemoryError" in result["error"] and "oom@1" in result["error"]
    assert result["layout"] == oom.user_attrs["layout"]
    limits = oom.constraints
    over = limits["memory_over_limit_gib"] if isinstance(limits, dict) else limits[0]
    assert over > 0, "an OOM trial must not count as fitting"
    assert oom not in outcome.pareto
    assert result["peak_memory_gib"] is not None and result["peak_memory_gib"] > 0, \
        "an OOM result should carry the peak memory measured up to the failure"
    leftovers = _wait_until_gone(str(tmp_path / "runs"), 30)
    _reap(leftovers)
    assert leftovers == [], "trainer processes left behind"


# ---- hang: killed with its whole tree; every trial failing gives a summary, not a crash ----------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hanging_trials_are_killed_with_their_tree_and_all_failing_is_a_clear_summary(tmp_path, sweep_spec,
                                                                                       monkeypatch, capsys):
    import yaml

    from orchestrator.commands.cli import main
    from tests.sweep_helpers import FAKE_TRAINER

    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    monkeypatch.setenv("MOE_AUTOTUNE_FAULT", "hang@0")
    runs = tmp_path / "runs"
    data = sweep_spec("all-hang", FAKE_TRAINER, CHAOS, launcher="torchrun", trial_timeout_s=25,
                      budget={"n_trials": 2, "max_concurrent": 2})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))

    seen: dict[int, set[int]] = {}  # trial-dir marker hits: pid -> parent pid
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            for proc in _processes_mentioning(str(runs)):
                try:
                    seen.setdefault(proc.pid, proc.ppid())  # the parent it was started by
                except Exception:  # noqa: BLE001 -- gone meanwhile
                    pass
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        code = main(["sweep", str(tmp_path / "spec.yaml"), "--quiet"])
    finally:
        stop.set()
        watcher.join()
    leftovers = _wait_until_gone(str(runs), 10)
    _reap(leftovers)  # never leave hung processes on a shared machine, even when the test fails
    err = capsys.readouterr().err
    assert code not in (0, 2) and code is not None, f"exit code {code}"
    assert "Traceback" not in err
    assert "no trial measured a layout that fits" in err and "timeout 2" in err, err[-2000:]
    # torchrun and its worker were both seen, i.e. a real tree was killed
    assert any(ppid in seen for ppid in seen.values()), f"no process tree was observed: {seen}"
    assert leftovers == [], "orphaned trainer processes after the timeout: " + "; ".join(
        f"pid {p.pid} ppid {p.info.get('ppid', '?')}: {' '.join(p.info['cmdline'] or [])[:120]}" for p in leftovers)
    study = _load(data["storage"], "all-hang")
    for t in study.trials:
        if t.user_attrs.get("status") != "infeasible":
            assert t.user_attrs["status"] == "timeout" and "killed" in t.user_attrs["reason"]


# ---- a Ray worker killed mid-trial: retried once, then recorded ----------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_ray_worker_killed_mid_trial_is_retried_once_then_recorded(tmp_path, sweep_spec, monkeypatch):
    import psutil

    from search_spaces.layouts.layout import Layout

    from orchestrator.dispatch.base import TrialRequest
    from orchestrator.dispatch.local import LocalRayBackend
    from orchestrator.spec.schema import parse_spec
    from tests.sweep_helpers import FAKE_TRAINER

    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    monkeypatch.delenv("MOE_AUTOTUNE_FAULT", raising=False)
    spec = parse_spec(sweep_spec("chaos", FAKE_TRAINER, CHAOS, budget={"n_trials": 2, "max_concurrent": 2}))
    kills_wanted = {"once": 1, "twice": 2}
    killed: Counter = Counter()
    killed_workers: set[int] = set()
    stop = threading.Event()

    def killer():
        while not stop.is_set():
            for name, wanted in kills_wanted.items():
                if killed[name] >= wanted:
                    continue
                for proc in _processes_mentioning(str(tmp_path / name / "result.json")):
                    try:
                        worker = proc.parent()
                        if worker is None or worker.pid in killed_workers or worker.pid == os.getpid():
                            continue
                        if "ray" not in " ".join(worker.cmdline()).lower():
                            continue
                        worker.kill()
                        killed_workers.add(worker.pid)
                        killed[name] += 1
                    except psutil.NoSuchProcess:
                        pass
            time.sleep(0.3)

    backend = LocalRayBackend(spec)
    thread = threading.Thread(target=killer, daemon=True)
    try:
        def request(name):
            return TrialRequest(layout=Layout(gbs=4, precision="fp32"), model="tiny-moe", seq_len=128, gpu="cpu",
                                num_gpus=1, nodes=1, gpus_per_node=1, steps=2, warmup=1, timeout_s=120,
                                workdir=tmp_path / name, env={"FAKE_TRAINER_SECONDS": "6"})
        thread.start()
        futures = {name: backend.submit(request(name)) for name in kills_wanted}
        results = {name: fut.result(timeout=400) for name, fut in futures.items()}
    finally:
        stop.set()
        thread.join()
        backend.close()
    assert killed == kills_wanted, f"the test did not kill as planned: {killed}"
    once, twice = results["once"], results["twice"]
    assert once.status == "ok", once.error
    assert once.extra["attempts"] == 2 and len(once.extra["infrastructure_errors"]) == 1
    assert twice.status == "interrupted" and "twice" in twice.error
    assert twice.extra["attempts"] == 2
    leftovers = _wait_until_gone(str(tmp_path / "once"), 10) + _wait_until_gone(str(tmp_path / "twice"), 10)
    _reap(leftovers)
    assert leftovers == [], "trainer processes outlived their killed Ray worker"


# ---- the orchestrator SIGKILLed, then --resume (real console script, real MLflow server) ---------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkilled_console_sweep_resumes_with_a_real_mlflow_server(tmp_path, sweep_spec):
    """Extends test_sweep_resume.py: the real `moe-autotune` command, two trials in flight, an MLflow server."""
    import optuna
    import yaml
    from mlflow import MlflowClient

    from orchestrator.records import queries
    from tests.mlflow_server import MlflowServer
    from tests.sweep_helpers import FAKE_TRAINER

    n_trials = 4
    with MlflowServer(tmp_path / "mlflow") as server:
        data = sweep_spec("kill-me", FAKE_TRAINER, CHAOS, tracking_uri=server.uri,
                          budget={"n_trials": n_trials, "max_concurrent": 2})
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
        env = _env(FAKE_TRAINER_SECONDS="4")
        log = open(tmp_path / "first.log", "wb")
        first = subprocess.Popen(_cli("sweep", str(tmp_path / "spec.yaml"), "--quiet"), cwd=tmp_path, env=env,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while not (_count(data["storage"], "kill-me") >= 1 and _running(data["storage"], "kill-me") >= 1):
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the first sweep made no progress"
                time.sleep(0.3)
            os.kill(first.pid, signal.SIGKILL)  # the driver only, as `kill -9 PID` would
            first.wait()
            # its trainers go with it (Ray kills the dead driver's workers; PR_SET_PDEATHSIG does the rest)
            leftovers = _wait_until_gone(str(tmp_path / "runs"), 60)
            assert leftovers == [], "trainers outlived the killed driver"
        finally:
            _kill_group(first)  # Ray's own processes of the dead driver
            _reap(_processes_mentioning(str(tmp_path / "runs")))
            log.close()
        killed_at = _count(data["storage"], "kill-me")
        assert 1 <= killed_at < n_trials

        second = subprocess.run(_cli("sweep", str(tmp_path / "spec.yaml"), "--quiet", "--resume"), cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]

        study = optuna.load_study(study_name="kill-me", storage=data["storage"])
        ran = queries.measured_trials(study)
        assert len(ran) == n_trials
        assert len({t.user_attrs["layout_key"] for t in ran}) == n_trials, "a layout was measured twice"
        assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
        client = MlflowClient(server.uri)
        exp = client.get_experiment_by_name("kill-me")
        parents = client.search_runs([exp.experiment_id], "tags.`moe_autotune.role` = 'parent'")
        assert len(parents) == 1
        children = client.search_runs([exp.experiment_id],
                                      f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'", max_results=1000)
        per_trial = Counter(r.data.tags["optuna_trial_number"] for r in children)
        assert all(n == 1 for n in per_trial.values()), f"doubled MLflow runs: {per_trial}"
        by_number = {r.data.tags["optuna_trial_number"]: r for r in children}
        for t in ran:
            run = by_number[str(t.number)]
            assert run.info.status == "FINISHED" and run.data.tags["status"] == t.user_attrs["status"]
        assert client.get_run(parents[0].info.run_id).info.status == "FINISHED"


# ---- the MLflow server down for a while ----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mlflow_down_for_a_while_loses_nothing(tmp_path, sweep_spec):
    """(a) down mid-sweep and back before the end: every trial reaches MLflow, exit 0;
    (b) down until the end: the sweep says so and exits non-zero, keeps the records, and --resume delivers them."""
    import yaml
    from mlflow import MlflowClient

    from orchestrator.records import queries
    from tests.mlflow_server import MlflowServer, free_port
    from tests.sweep_helpers import FAKE_TRAINER

    port = free_port()
    server = MlflowServer(tmp_path / "mlflow", port=port).start()
    # bounded HTTP retries: with MLflow's defaults (7 retries, exponential backoff) each call to a dead server
    # blocks for minutes; the tracker's own spool is what keeps the records
    env = _env(FAKE_TRAINER_SECONDS="6")

    def children_of(name):
        client = MlflowClient(server.uri)
        exp = client.get_experiment_by_name(name)
        runs = client.search_runs([exp.experiment_id], max_results=1000)
        return [r for r in runs if "optuna_trial_number" in r.data.tags
                and r.data.tags.get("moe_autotune.role") != "parent"]

    def check_all_delivered(name, storage):
        study = _load(storage, name)
        runs = children_of(name)
        per_trial = Counter(r.data.tags["optuna_trial_number"] for r in runs)
        assert all(n == 1 for n in per_trial.values()), f"doubled MLflow runs: {per_trial}"
        by_number = {r.data.tags["optuna_trial_number"]: r for r in runs}
        for t in queries.measured_trials(study):
            run = by_number.get(str(t.number))
            assert run is not None, f"trial {t.number} never reached MLflow"
            assert run.info.status == "FINISHED" and run.data.tags["status"] == t.user_attrs["status"]
            assert "tokens_per_sec_per_gpu" in run.data.metrics

    try:
        # (a) down while trials 2-3 run, back before the sweep ends
        data = sweep_spec("flaky-mlflow", FAKE_TRAINER, CHAOS, tracking_uri=server.uri, budget={"n_trials": 6})
        (tmp_path / "a.yaml").write_text(yaml.safe_dump(data))
        proc = subprocess.Popen(_cli("sweep", str(tmp_path / "a.yaml"), "--quiet"), cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while _count(data["storage"], "flaky-mlflow") < 1:
                assert proc.poll() is None and time.monotonic() < deadline, "sweep (a) made no progress"
                time.sleep(0.3)
            server.stop()
            while _count(data["storage"], "flaky-mlflow") < 2:
                assert proc.poll() is None and time.monotonic() < deadline, "sweep (a) stalled without MLflow"
                time.sleep(0.3)
            server = MlflowServer(tmp_path / "mlflow", port=port).start()
            assert proc.poll() is None and _count(data["storage"], "flaky-mlflow") < 6, \
                "test precondition: MLflow must be back before the sweep ends (machine too slow?)"
            out, err = proc.communicate(timeout=400)
        finally:
            _kill_group(proc)
        assert proc.returncode == 0, err[-3000:]
        assert _count(data["storage"], "flaky-mlflow") == 6
        check_all_delivered("flaky-mlflow", data["storage"])

        # (b) down until the end: loud, kept, delivered by --resume
        data = sweep_spec("mlflow-gone", FAKE_TRAINER, CHAOS, tracking_uri=server.uri, budget={"n_trials": 3})
        (tmp_path / "b.yaml").write_text(yaml.safe_dump(data))
        proc = subprocess.Popen(_cli("sweep", str(tmp_path / "b.yaml"), "--quiet"), cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while _count(data["storage"], "mlflow-gone") < 1:
                assert proc.poll() is None and time.monotonic() < deadline, "sweep (b) made no progress"
                time.sleep(0.3)
            server.stop()
            out, err = proc.communicate(timeout=400)
        finally:
            _kill_group(proc)
        assert proc.returncode not in (0, None), "the sweep hid that MLflow lost records"
        assert "MLflow" in err and "--resume" in err, err[-2000:]
        assert "Traceback" not in err
        assert _count(data["storage"], "mlflow-gone") == 3, "results were lost while MLflow was down"
        spool = tmp_path / "runs" / "mlflow-gone" / "mlflow-spool.jsonl"
        assert spool.is_file() and spool.read_text().strip(), "no local spool of the undelivered records"

        server = MlflowServer(tmp_path / "mlflow", port=port).start()
        again = subprocess.run(_cli("sweep", str(tmp_path / "b.yaml"), "--quiet", "--resume"), cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=400)
        assert again.returncode == 0, again.stderr[-3000:]
        assert _count(data["storage"], "mlflow-gone") == 3, "resume ran extra trials"
        check_all_delivered("mlflow-gone", data["storage"])
    finally:
        server.stop()
