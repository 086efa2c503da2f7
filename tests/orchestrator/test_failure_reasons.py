"""Honest failure reasons (issue 53) through the orchestrator: the backend names the rank that failed first and its
class, not the rank that reported first; `status` (table and `--csv`), the MLflow child run (tags, the logs and
every rank's failure record as artifacts, redacted) and `check` show the same root cause.

The real trainer's ranks (two, through torchrun and Ray) with rank 1 SIGKILLed or raising; the stand-in trainer
(tests/fake_trainer.py) for the sweep, where rank 0's connection reset claims the result after rank 1 raised.
"""

from __future__ import annotations

import contextlib
import csv
import io
from pathlib import Path

import pytest
from mlflow import MlflowClient

from search_spaces.failures import read_records
from search_spaces.layouts.layout import Layout

from orchestrator.commands.cli import main
from orchestrator.dispatch.base import TrialRequest
from orchestrator.records import queries
from orchestrator.sweep import run_sweep
from tests.sweep_helpers import FAKE_TRAINER, make_spec, prior_for

pytestmark = pytest.mark.slow
SECRET = "hunter2-fault-53"


@pytest.mark.timeout(900)
def test_the_backend_names_the_rank_killed_or_raising_first_not_rank_0s_reset(tmp_path, monkeypatch):
    from orchestrator.dispatch.local import LocalRayBackend

    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    spec = make_spec(tmp_path, "root-cause", backend="ray", gpus_per_node=2, seq_len=64,
                     budget={"n_trials": 2, "max_concurrent": 2})
    backend = LocalRayBackend(spec)

    def request(name: str, fault: str) -> TrialRequest:
        return TrialRequest(layout=Layout(gbs=2, precision="fp32"), model="tiny-moe", seq_len=64, gpu="cpu",
                            num_gpus=2, nodes=1, gpus_per_node=2, steps=2, warmup=1, timeout_s=600,
                            workdir=tmp_path / name, env={"MOE_AUTOTUNE_FAULT": fault, "MOE_AUTOTUNE_FAULT_RANK": "1"})
    try:
        futures = {name: backend.submit(request(name, f"{name}@1")) for name in ("crash", "raise")}
        results = {name: future.result(timeout=840) for name, future in futures.items()}
    finally:
        backend.close()
    crash = results["crash"]  # torchrun stopped rank 0 (SIGTERM) once rank 1 was SIGKILLed: its summary says so
    assert (crash.status, crash.failure_class, crash.failure_rank) == ("error", "killed", 1), crash.error
    assert crash.failure_reason == "ended by SIGKILL (exit code -9)"
    assert crash.error.startswith("rank 1: ended by SIGKILL")
    raised = results["raise"]
    assert (raised.status, raised.failure_class, raised.failure_rank) == ("error", "error", 1), raised.error
    assert raised.failure_reason == "RuntimeError: injected by MOE_AUTOTUNE_FAULT=raise@1 on rank 1"
    # rank 0 failed too, by the reset rank 1's exit caused: recorded, never the cause
    peers = {f.rank: f for f in read_records(tmp_path / "raise" / "result.json")}
    assert peers[0].failure_class == "communication" and peers[1].failure_class == "error"
    assert peers[1].time < peers[0].time


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


@pytest.mark.timeout(400)
def test_status_csv_mlflow_and_check_show_the_root_cause_redacted(tmp_path, monkeypatch):
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    monkeypatch.setenv("MOE_AUTOTUNE_FAULT", "raise@0")
    monkeypatch.setenv("MOE_AUTOTUNE_FAULT_RANK", "1")
    monkeypatch.setenv("MOE_AUTOTUNE_FAULT_NOTE", f"at postgresql://alice:{SECRET}@db.example/optuna")
    spec = make_spec(tmp_path, "failing", **{**FAKE_TRAINER, "gpus_per_node": 2, "seq_len": 128, "seed": 5,
                                             "budget": {"n_trials": 2, "max_concurrent": 1}})
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 1  # no trial measured a layout that fits
    ran = queries.measured_records(out.study)
    assert len(ran) == 2
    for record in ran:
        assert (record.status, record.failure_class, record.failure_rank) == ("error", "error", 1)
        assert record.failure_reason.startswith("RuntimeError: injected on rank 1 at postgresql://***@db.example")
        assert record.reason.startswith("rank 1: RuntimeError: injected") and SECRET not in record.reason

    table = tmp_path / "board.csv"
    code, printed = _cli("status", spec.name, "--storage", spec.storage, "--csv", str(table))
    assert code == 0
    assert "error (rank 1)" in printed and "RuntimeError: injected on rank 1" in printed
    rows = list(csv.DictReader(table.open()))
    assert [(r["failure_class"], r["failure_rank"]) for r in rows] == [("error", "1")] * 2
    assert all(r["failure_reason"].startswith("RuntimeError: injected on rank 1") for r in rows)
    assert SECRET not in printed + table.read_text()

    client = MlflowClient(spec.tracking_uri)
    for record in ran:
        run = client.get_run(record.mlflow_run_id)
        assert run.data.tags["failure_class"] == "error" and run.data.tags["failure_rank"] == "1"
        assert run.data.tags["failure_reason"] == record.failure_reason
        logs = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "logs")}
        assert {"node-0.log", "result.json.rank0.failure.json", "result.json.rank1.failure.json"} <= logs
        folder = Path(client.download_artifacts(run.info.run_id, "logs", str(tmp_path / "art" / run.info.run_id)))
        recorded = (folder / "result.json.rank1.failure.json").read_text()
        assert "injected on rank 1" in recorded and SECRET not in recorded
    assert _cli("check", spec.name, "--storage", spec.storage)[0] == 0
