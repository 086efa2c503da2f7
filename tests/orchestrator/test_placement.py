"""Resource preflight and prompt stops (issue 53, item 5).

A sweep whose trials the Ray cluster can never place (a GPU spec on a Ray cluster without GPUs) stops before
anything is stored, with one line naming what a trial asks for and what the cluster has (exit 2); a trial larger
than the cluster while smaller ones fit is refused alone (`unschedulable`, never run, free like a rejection); a trial
the cluster does not place within `placement_timeout_s` is `unschedulable`, not `timeout`; Ctrl-C or SIGTERM while a
real Ray trial runs ends the command promptly with the trial's process tree killed and the trial recorded as
interrupted, and `--resume` completes the sweep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from mlflow import MlflowClient

from search_spaces.layouts.layout import Layout

from orchestrator.commands.cli import main
from orchestrator.dispatch.analytic import AnalyticBackend
from orchestrator.dispatch.base import TrialRequest
from orchestrator.dispatch.ray_cluster import placeable_now
from orchestrator.errors import ClusterError
from orchestrator.records import TrialRecord, queries
from orchestrator.records.trial import TRIAL_TAG
from orchestrator.storage import studies
from orchestrator.sweep import run_sweep
from tests.orchestrator.test_interrupt_resume import assert_counted_once
from tests.sweep_helpers import FAKE_TRAINER, make_spec, prior_for, spec_data, write_spec

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("moe-autotune"))
# what Ray's C++ side prints when it dies under a connected driver (absl's failure handler, RAY_CHECK)
STACK_LINES = ("Traceback", "*** SIG", "@ 0x", "StackTrace", "Check failed", "[C++]")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", **extra}


def _study_names(storage: str) -> list[str]:
    path = studies.store_path(storage)
    if path is not None and not path.exists():
        return []
    return optuna.get_all_study_names(storage=studies.open_storage(storage, create=False))


def _nothing_stored(spec) -> None:
    """No study, no MLflow experiment, no work directory: a corrected rerun starts clean."""
    assert _study_names(spec.storage) == []
    assert MlflowClient(spec.tracking_uri).get_experiment_by_name(spec.name) is None
    assert not (Path(spec.workdir) / spec.name).exists()


# ---- in process: the loop's side of it (the analytic backend standing in for a cluster) --------------------------
@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_a_cluster_that_can_place_no_trial_is_refused_before_anything_is_stored(tmp_path, monkeypatch):
    spec = make_spec(tmp_path, "unplaceable")
    monkeypatch.setattr(AnalyticBackend, "unplaceable", lambda self, nodes, per_node: "a trial asks for 1 node with "
                        f"{per_node} GPUs; the Ray cluster has 1 node with no GPU", raising=False)
    with pytest.raises(ClusterError, match="a trial asks for 1 node with 4 GPUs; the Ray cluster has") as caught:
        run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)
    _nothing_stored(spec)
    monkeypatch.delattr(AnalyticBackend, "unplaceable")  # the cluster mended: the same command runs
    assert run_sweep(spec, prior=prior_for(spec), show_progress=False).exit_code == 0


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_trials_the_cluster_can_never_place_are_unschedulable_free_and_tracked(tmp_path, monkeypatch):
    """The smallest trial fits, some larger ones do not (here: every other one asked after the preflight): those
    are refused one by one, recorded with the reason, never run, and do not count against the budget."""
    asked: list[tuple[int, int]] = []

    def unplaceable(self, nodes, per_node):
        asked.append((nodes, per_node))
        return None if len(asked) % 2 else "a trial asks for 9 nodes; the Ray cluster has 1 node"

    monkeypatch.setattr(AnalyticBackend, "unplaceable", unplaceable, raising=False)
    spec = make_spec(tmp_path, "partly", budget={"n_trials": 4})
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0 and out.n_measured == 4 == len(queries.measured_records(out.study))
    refused = [r for r in queries.finished_records(out.study) if r.status == "unschedulable"]
    assert refused and all(r.reason == "never placeable on this Ray cluster: a trial asks for 9 nodes; the Ray "
                                      "cluster has 1 node" and r.result is None for r in refused)
    assert all(r.state == "fail" and not r.values for r in refused)  # failed in Optuna too, no value told
    assert any("could not be placed on the Ray cluster" in m for m in out.messages)
    # each has its child run, tag status unschedulable (no cost-model rejection), failed (the trial lifecycle)
    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name).experiment_id
    found = client.search_runs([experiment], "tags.status = 'unschedulable'")
    runs = {run.data.tags.get(TRIAL_TAG): run for run in found}
    assert set(runs) == {str(r.number) for r in refused}
    assert all(run.info.status == "FAILED" for run in runs.values())
    assert main(["check", spec.name, "--storage", spec.storage]) == 0
    board = queries.leaderboard(out.study)
    assert set(board[board["status"] == "unschedulable"]["trial"]) == {r.number for r in refused}


# ---- real Ray -----------------------------------------------------------------------------------------------------
def _fake_spec(tmp_path: Path, name: str, **changes):
    return spec_data(tmp_path, name, **{**FAKE_TRAINER, "gpus_per_node": 2, "seq_len": 128, "seed": 5,
                                        "budget": {"n_trials": 2}, "trial_timeout_s": 300, **changes})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gpu_sweep_on_a_ray_cluster_without_gpus_stops_at_once_with_one_line(tmp_path):
    """The reported case: `gpu: h100` on a Ray cluster without GPUs waited out every trial's timeout, then 651 s
    were lost with nothing said. Now: one line, exit 2, nothing stored, and the same command (not --resume) runs
    again once the cluster is right."""
    data = _fake_spec(tmp_path, "gpuless", gpu="h100", gpus_per_node=1, fixed={})
    spec = write_spec(tmp_path / "spec.json", data)
    began = time.monotonic()
    done = subprocess.run([CLI, "sweep", str(spec), "--quiet"], cwd=tmp_path, env=_env(CUDA_VISIBLE_DEVICES=""),
                          capture_output=True, text=True, timeout=240)  # a hang guard, not a speed test
    print(f"refused in {time.monotonic() - began:.1f} s")
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("error: no trial of sweep 'gpuless' can run on this Ray cluster: a trial asks for "
                               "1 node with 1 GPU and 1 CPU; the Ray cluster has 1 node with no GPU and "), lines[0]
    _nothing_stored(make_spec(tmp_path, "gpuless", **{k: v for k, v in data.items() if k != "name"}))


def _request(tmp_path: Path, name: str, ranks: int, seconds: float = 0) -> TrialRequest:
    return TrialRequest(layout=Layout(gbs=8, precision="fp32"), model="tiny-moe", seq_len=128, gpu="cpu",
                        num_gpus=ranks, nodes=1, gpus_per_node=ranks, steps=3, warmup=1, timeout_s=120,
                        workdir=tmp_path / name, env={"FAKE_TRAINER_SECONDS": str(seconds)})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_trial_not_placed_within_the_bound_is_unschedulable_and_a_queue_behind_the_sweeps_own_is_not(tmp_path):
    import ray

    from orchestrator.dispatch.local import LocalRayBackend

    spec = make_spec(tmp_path, "placement", **{**FAKE_TRAINER, "gpus_per_node": 2, "seq_len": 128,
                                               "placement_timeout_s": 1.0, "budget": {"n_trials": 3,
                                                                                      "max_concurrent": 3}})
    backend = LocalRayBackend(spec)
    try:
        cpus = int(sum(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]))
        assert backend.unplaceable(1, cpus) is None
        assert backend.unplaceable(1, cpus + 1) == (f"a trial asks for 1 node with {cpus + 1} CPUs; the Ray cluster "
                                                    f"has 1 node with no GPU and {cpus} CPUs")
        assert backend.unplaceable(2, 1).startswith("a trial asks for 2 nodes, each with 1 CPU")
        assert placeable_now(1, {"CPU": cpus}) and not placeable_now(1, {"CPU": cpus + 1})
        assert not placeable_now(2, {"CPU": 1}), "two nodes' bundles on a one-node cluster"
        # the first takes every CPU for 4 s; the second waits behind it, past the 1 s bound: that is a queue
        first = backend.submit(_request(tmp_path, "first", cpus, seconds=4))
        time.sleep(0.5)
        queued = backend.submit(_request(tmp_path, "queued", cpus))
        big = backend.submit(_request(tmp_path, "big", cpus + 1)).result(timeout=120)
        results = [first.result(timeout=200), queued.result(timeout=200)]
    finally:
        backend.close()
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    assert big.status == "unschedulable", big.error
    assert big.error.startswith(f"not placed within placement_timeout_s (1 s), never started: a trial asks for 1 "
                                f"node with {cpus + 1} CPUs; the Ray cluster has 1 node with no GPU and {cpus} CPUs")
    assert not (tmp_path / "big" / "command.json").exists(), "an unschedulable trial never starts"


class _SlowRay:
    """Ray on a loaded machine: a placement group whose resources are free is still not placed (the CI case: the
    queue's first trial ended, its CPUs were free, and Ray took past the 1 s bound to place the next)."""

    def __init__(self, monkeypatch, free_now: bool):
        import ray

        import orchestrator.dispatch.local as local

        monkeypatch.setattr(ray, "wait", lambda refs, timeout: (time.sleep(timeout), ([], refs))[1])
        monkeypatch.setattr(local, "placeable_now", lambda nodes, bundle: free_now)
        monkeypatch.setattr(local, "alive_nodes", lambda: [{"CPU": 2.0}])
        monkeypatch.setattr(local, "cluster_free", lambda: "2 CPUs free now" if free_now else "no CPU free now")

    def ready(self):
        return object()


@pytest.mark.parametrize("free_now", [True, False], ids=["free", "busy"])
def test_the_placement_clock_stands_still_while_the_free_resources_could_place_the_trial(tmp_path, monkeypatch,
                                                                                         free_now):
    """Ray's own placement latency is not the cluster's fault: only a wait that the cluster's free resources could
    not end counts against placement_timeout_s."""
    import concurrent.futures
    import threading

    from orchestrator.dispatch.local import LocalRayBackend

    backend = object.__new__(LocalRayBackend)  # its state only: Ray is the fake above
    backend.spec = make_spec(tmp_path, "clock", **{**FAKE_TRAINER, "placement_timeout_s": 0.5})
    backend.use_gpus, backend._placed, backend._waiting = False, 0, []
    backend._stopping, backend._lock = threading.Event(), threading.Lock()
    pg = _SlowRay(monkeypatch, free_now)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(backend._await_placement, pg, _request(tmp_path, "slow", 2))
        try:
            result = waiting.result(timeout=2.5)  # five times the bound
        except concurrent.futures.TimeoutError:
            result = None
        backend._stopping.set()
        stopped = waiting.result(timeout=30)
    if free_now:
        assert result is None and stopped.status == "interrupted", stopped
    else:
        assert result is not None and result.status == "unschedulable", result
        assert "no CPU free now" in result.error


def _trainers(folder: Path) -> list[psutil.Process]:
    """Live processes of the trials under `folder` (the trainer's argv names its result file there)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(folder) in part for part in proc.info["cmdline"] or ()) and proc.status() != "zombie":
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("signum, launcher, processes", [(signal.SIGINT, "python", 1),
                                                         (signal.SIGTERM, "torchrun", 3)], ids=["SIGINT", "SIGTERM"])
def test_a_stop_during_a_real_ray_trial_ends_promptly_kills_the_trial_and_resume_completes(tmp_path, signum,
                                                                                           launcher, processes):
    """`processes`: the trial's tree (torchrun: the launcher and one rank per CPU "GPU", each in a session of its
    own)."""
    data = _fake_spec(tmp_path, "stopped", launcher=launcher)
    spec = write_spec(tmp_path / "spec.json", data)
    runs = Path(data["workdir"])
    proc = subprocess.Popen([CLI, "sweep", str(spec), "--quiet"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(FAKE_TRAINER_SECONDS="600"))
    deadline = time.monotonic() + 240
    while len(_trainers(runs)) < processes:  # the trial's whole tree runs: it is in flight
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    time.sleep(1)
    began = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)  # a hang guard: before, a stop waited for the trial to end
    print(f"{signum.name}: the command ended {time.monotonic() - began:.1f} s after the signal")
    assert proc.returncode == 130, err[-2000:]
    assert not any(mark in err for mark in STACK_LINES), err[-3000:]
    assert {line for line in err.splitlines() if line.strip()} <= {"aborted"}, err[-2000:]  # nothing but ours
    assert _trainers(runs) == [], "a trainer process outlived the sweep"
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    records = [TrialRecord.of(t) for t in study.trials]
    assert [(r.state, r.status) for r in records if r.layout is not None and r.status != "infeasible"] == [
        ("fail", "interrupted")]
    resumed = subprocess.run([CLI, "sweep", str(spec), "--quiet", "--resume"], cwd=tmp_path, capture_output=True,
                             text=True, env=_env(), timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_counted_once(data["storage"], data["name"], data["budget"]["n_trials"])
