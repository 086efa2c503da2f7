"""A proxy sweep with the real trainer on CPU, end to end (issue 12): trials run on 2 of the target's 4 ranks,
their results are composed to full size, MLflow records both; `confirm` then measures the best at full size
and `promote` takes that confirmed trial."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.layouts.layout import Layout
from search_spaces.proxy import derive_proxy

from orchestrator.commands.cli import main
from orchestrator.outputs.check import check
from orchestrator.records import queries
from orchestrator.storage import studies
from tests.sweep_helpers import spec_data

pytestmark = pytest.mark.slow
TINY, CPU = load_model("tiny-moe"), load_gpu("cpu")


@pytest.mark.timeout(1800)
def test_proxy_sweep_records_measured_and_composed_then_confirm_and_promote(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    storage, uri = f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = spec_data(tmp_path, "proxy-local", seq_len=128, backend="ray", fidelity="proxy", trial_gpus=2,
                     free=["ep", "pp"], fixed={"precision": "fp32", "tp": 1, "cp": 1, "vpp": 1, "mbs": 1,
                                               "recompute": "none"},
                     budget={"n_trials": 2}, steps=2, warmup=1, trial_timeout_s=900, seed=1, storage=storage,
                     tracking_uri=uri)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["sweep", str(tmp_path / "spec.json"), "--quiet"]) == 0
    assert "proxy (2 GPUs)" in capsys.readouterr().out

    study, problems = check(storage, "proxy-local")
    assert problems == []
    ran = queries.measured_trials(study)
    assert len(ran) == 2 and all(t.user_attrs["fidelity"] == "proxy" for t in ran)
    client = MlflowClient(uri)
    for t in ran:
        result = t.user_attrs["result"]
        assert result["status"] == "ok"
        # what ran: the smallest world parallel folding allows for this layout; the figures are for 4 ranks
        plan = derive_proxy(TINY, Layout.from_dict(t.user_attrs["layout"]), CPU, 4)
        assert result["num_gpus"] == plan.world <= 2
        assert result["extra"]["composed"]["tokens_per_sec_per_gpu"] == pytest.approx(t.values[0])
        assert result["extra"]["gpu_seconds"] < result["extra"]["full_size_gpu_seconds"]
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.tags["fidelity"] == "proxy" and run.data.params["proxy.world"] == str(result["num_gpus"])
        assert run.data.metrics["composed_tokens_per_sec_per_gpu"] == pytest.approx(t.values[0])
        assert "proxy_measured_tokens_per_sec_per_gpu" in run.data.metrics and "gpu_seconds" in run.data.metrics
        assert "composed.json" in {a.path for a in client.list_artifacts(run.info.run_id)}

    assert main(["promote", "proxy-local", "--storage", storage]) == 2
    assert "only proxy measurements" in capsys.readouterr().err
    assert main(["confirm", "proxy-local", "--top", "1", "--storage", storage, "--trial-gpus", "4", "--quiet"]) == 0
    confirmed = [t for t in queries.measured_trials(studies.load_study(storage, "proxy-local"))
                 if t.user_attrs.get("proposed_by") == "confirm"]
    assert len(confirmed) == 1 and confirmed[0].user_attrs["fidelity"] == "full"
    assert confirmed[0].user_attrs["result"]["num_gpus"] == 4
    assert main(["promote", "proxy-local", "--storage", storage]) == 0
    assert f"trial {confirmed[0].number}" in capsys.readouterr().out
    assert check(storage, "proxy-local")[1] == []
