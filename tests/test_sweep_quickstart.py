"""The quickstart end to end: the real Megatron-Core trainer on CPU ranks through Ray, via the CLI."""

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient

from orchestrator import study as studies

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_real_trainer_sweep(tmp_path):
    # A shorter budget than the example's (CI time); the full example is timed in the sweep's report.
    argv = [sys.executable, "-m", "orchestrator.cli", "sweep", str(ROOT / "examples" / "quickstart.yaml"),
            "--n-trials", "3", "--quiet", "--storage", f"sqlite:///{tmp_path / 'optuna.db'}",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MOE_AUTOTUNE_TRAINER_MODULE", None)
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "best layout" in done.stdout
    study = optuna.load_study(study_name="quickstart", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    ran = studies.measured_trials(study)
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
