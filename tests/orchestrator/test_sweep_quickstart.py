"""The quickstart end to end: the real Megatron-Core trainer on CPU ranks through Ray, via the CLI."""

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient

from orchestrator.records import queries

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_real_trainer_sweep(tmp_path):
    # A shorter budget than the example's (CI time); the full example is timed in the sweep's report.
    argv = [sys.executable, "-m", "orchestrator.commands.cli", "sweep", str(ROOT / "examples" / "quickstart.yaml"),
            "--n-trials", "3", "--quiet", "--storage", f"sqlite:///{tmp_path / 'optuna.db'}",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MOE_AUTOTUNE_TRAINER_MODULE", None)
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "best layout" in done.stdout
    study = optuna.load_study(study_name="quickstart", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    ran = queries.measured_trials(study)
    assert len(ran) == 3
    ok = [t for t in ran if t.user_attrs["status"] == "ok"]
    assert len({t.user_attrs["layout_key"] for t in ok}) >= 2, [t.user_attrs.get("reason") for t in ran]
    for t in ok:
        result = t.user_attrs["result"]
        assert result["tokens_per_sec_per_gpu"] > 0 and len(result["step_times_s"]) >= 1
        assert t.user_attrs["command"][1:3] == ["-m", "torch.distributed.run"]
        assert "trainers.megatron_moe" in t.user_attrs["command"]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(ok[0].user_attrs["mlflow_run_id"])
    assert run.data.metrics["tokens_per_sec_per_gpu"] == pytest.approx(ok[0].values[0])
    assert "logs" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_qwen3_next_sweep_runs_gated_delta_net_trials_end_to_end(tmp_path, monkeypatch):
    """A quickstart-size sweep of the hybrid family: Optuna proposes, the cost model screens (with the
    delta-net rules and memory terms), Ray runs the real trainer's GatedDeltaNet layers, MLflow records."""
    from orchestrator.spec.schema import parse_spec
    from orchestrator.sweep import run_sweep
    from tests.sweep_helpers import prior_for

    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    spec = parse_spec({
        "name": "qwen3-next-quick", "model": "tiny-qwen3-next", "seq_len": 256, "gpu": "cpu", "gpus_per_node": 2,
        "gbs": 4, "fixed": {"precision": "fp32", "dispatcher": "alltoall"}, "free": ["tp", "cp", "ep", "mbs"],
        "budget": {"n_trials": 3, "max_concurrent": 1}, "steps": 2, "warmup": 1, "trial_timeout_s": 240,
        "backend": "local", "seed": 7, "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "workdir": str(tmp_path / "runs")})
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0 and out.n_measured == 3
    ran = queries.measured_trials(out.study)
    assert all(t.user_attrs["status"] == "ok" for t in ran), [t.user_attrs.get("reason") for t in ran]
    assert len({t.user_attrs["layout_key"] for t in ran}) == 3
    for t in ran:
        result = t.user_attrs["result"]
        assert result["applied"]["attention"] == ["GatedDeltaNet", "SelfAttention"]
        assert result["tokens_per_sec_per_gpu"] > 0 and result["loss"][-1] < result["loss"][0]
    client = MlflowClient(spec.tracking_uri)
    run = client.get_run(ran[0].user_attrs["mlflow_run_id"])
    assert run.data.tags["status"] == "ok" and "predicted_peak_memory_gib" in run.data.metrics


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sweep_over_cp_pp_and_ep_runs_every_trial(tmp_path, monkeypatch):
    """Long-context MoE is CP with PP and EP: a tiny-moe sweep of CP 2 x PP 2 x EP 2 layouts (the seed recipes'
    shape; the search over VPP and recompute, the real trainer through Ray) measures every layout it runs; none
    errors (CP x PP crashed every trial before: issue 53)."""
    from orchestrator.spec.schema import parse_spec
    from orchestrator.sweep import run_sweep
    from tests.sweep_helpers import prior_for

    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    spec = parse_spec({
        "name": "cp-pp-ep", "model": "tiny-moe", "seq_len": 128, "gpu": "cpu", "gpus_per_node": 4, "gbs": 4,
        "fixed": {"precision": "fp32", "dispatcher": "alltoall", "cp": 2, "pp": 2, "ep": 2, "tp": 1, "mbs": 1},
        "free": ["vpp", "recompute"], "budget": {"n_trials": 2, "max_concurrent": 1}, "steps": 2, "warmup": 1,
        "trial_timeout_s": 300, "backend": "ray", "seed": 3, "search": "grid",
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}", "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "workdir": str(tmp_path / "runs")})
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0 and out.n_measured == 2
    ran = queries.measured_trials(out.study)
    assert all(t.user_attrs["status"] == "ok" for t in ran), [t.user_attrs.get("reason") for t in ran]
    applied = [t.user_attrs["result"]["applied"] for t in ran]
    assert all((a["cp"], a["pp"], a["ep"]) == (2, 2, 2) for a in applied), applied
    assert len({t.user_attrs["layout_key"] for t in ran}) == 2
