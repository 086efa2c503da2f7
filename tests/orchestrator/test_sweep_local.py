"""The local backend through real Ray: parallel trials, process-tree timeout, crash and OOM as results.

Uses tests/fake_trainer.py (returns at once) so the orchestration is what is measured.
"""

import json
import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from search_spaces.layouts.layout import Layout

from orchestrator.dispatch.base import TrialRequest
from orchestrator.records import queries
from orchestrator.spec.schema import parse_spec
from orchestrator.sweep import run_sweep
from tests.sweep_helpers import FAKE_TRAINER, prior_for

# this module's sweep: the fake trainer on 2 ranks, 4 trials two at a time (sweep_spec: tests/conftest.py)
LOCAL_FAKE = {**FAKE_TRAINER, "gpus_per_node": 2, "seq_len": 128, "seed": 5,
              "budget": {"n_trials": 4, "max_concurrent": 2}}


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(pid))
    return found


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_local_sweep_records_optuna_and_mlflow(sweep_spec, monkeypatch):
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    spec = parse_spec(sweep_spec("local-fake", LOCAL_FAKE))
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0 and out.n_measured == 4
    ran = queries.measured_trials(out.study)
    assert all(t.user_attrs["status"] == "ok" for t in ran)
    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.name)
    parent_id = out.study.user_attrs["mlflow_parent_run_id"]
    for t in ran:
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.tags["optuna_trial_number"] == str(t.number)
        assert run.data.tags["mlflow.parentRunId"] == parent_id
        assert run.data.tags["status"] == "ok" and run.info.status == "FINISHED"
        assert run.data.params["tp"] == str(t.user_attrs["layout"]["tp"])
        for name in ("tokens_per_sec_per_gpu", "predicted_tokens_per_sec_per_gpu", "peak_memory_gib"):
            assert name in run.data.metrics, name
        steps = client.get_metric_history(run.info.run_id, "step_time_s")
        assert sorted(m.step for m in steps) == [0, 1, 2]
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"trial.json", "command.json", "logs"} <= artifacts
        command = t.user_attrs["command"]
        assert command[1:3] == ["-m", "tests.fake_trainer"] and "--result" in command
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'")
    numbers = [r.data.tags["optuna_trial_number"] for r in children]
    assert len(numbers) == len(set(numbers)) == len(queries.finished_trials(out.study))
    assert client.get_run(parent_id).info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hang_is_killed_with_its_tree_and_crash_and_oom_are_results(tmp_path, sweep_spec):
    from orchestrator.dispatch.local import LocalRayBackend

    spec = parse_spec(sweep_spec("local-fake", LOCAL_FAKE, budget={"n_trials": 3, "max_concurrent": 3}))
    backend = LocalRayBackend(spec)
    try:
        def request(name, fault, timeout):
            return TrialRequest(layout=Layout(gbs=8, precision="fp32"), model="tiny-moe", seq_len=128, gpu="cpu",
                                num_gpus=2, nodes=1, gpus_per_node=1, steps=3, warmup=1, timeout_s=timeout,
                                workdir=tmp_path / name, env={"MOE_AUTOTUNE_FAULT": fault})
        futures = {name: backend.submit(request(name, fault, timeout)) for name, fault, timeout in
                   [("hang", "hang@0", 4), ("crash", "crash@0", 60), ("oom", "oom@0", 60)]}
        results = {name: fut.result(timeout=200) for name, fut in futures.items()}
    finally:
        backend.close()
    assert results["hang"].status == "timeout" and "killed" in results["hang"].error
    assert _processes_mentioning(str(tmp_path / "hang")) == [], "orphaned trainer processes"
    assert results["crash"].status == "error" and "-9" in results["crash"].error
    assert results["oom"].status == "oom"
    commands = json.loads((tmp_path / "oom" / "command.json").read_text())
    assert commands[0][:3] == [commands[0][0], "-m", "tests.fake_trainer"]
