"""A sweep's MLflow parent run records how its model's config.json was read (issue 55): the block
`moe-autotune model CONFIG` prints (model_reading.txt) and its --json (model_reading.json) as artifacts, the
total and active parameters, layers and experts as params and the layers by kind, compressed, as a tag; the model
as the sweep tunes it (model_overrides applied). A catalog model has no reading to record."""

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from search_spaces.catalog.models import load_model
from search_spaces.catalog.reading import describe, reading_lines

from orchestrator.spec.schema import parse_spec
from orchestrator.sweep import run_sweep
from orchestrator.tracking.parent_run import MODEL_READING, READING_PARAMS, model_reading
from tests.sweep_helpers import prior_for

ROOT = Path(__file__).resolve().parents[2]
MAVERICK = ROOT / "tests" / "data" / "hf_configs" / "llama-4-maverick-17b-128e-instruct.json"  # nested, as published


@pytest.mark.slow  # end to end (an analytic sweep, ~5 s): the full suite runs it, the fast lane does not
@pytest.mark.timeout(300)
def test_a_config_path_sweep_records_its_models_reading_in_the_parent_run(tmp_path, sweep_spec, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands in tmp_path
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = parse_spec(sweep_spec("read", tracking_uri=uri, model=str(MAVERICK), model_overrides={"num_layers": 4},
                                 gpu="h100", gpus_per_node=8, seq_len=4096, fixed={}, budget={"n_trials": 4}))
    out = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert out.exit_code == 0
    client = MlflowClient(uri)
    parent = client.get_run(out.study.user_attrs["mlflow_parent_run_id"])
    run_id = parent.info.run_id

    expected = json.loads(json.dumps(describe(load_model(str(MAVERICK)).with_overrides(num_layers=4))))
    recorded = json.loads(Path(client.download_artifacts(run_id, MODEL_READING, str(tmp_path))).read_text())
    assert recorded == expected and recorded["text_config"] and recorded["layers"] == 4
    text = Path(client.download_artifacts(run_id, "model_reading.txt", str(tmp_path))).read_text()
    assert text.splitlines() == reading_lines(expected)
    assert "layers: 4 = dense+chunked, MoE+chunked, dense+chunked, MoE+global" in text
    assert {f"model.{k}": str(expected[k]) for k in READING_PARAMS}.items() <= parent.data.params.items()
    assert parent.data.params["model.experts"] == "128" and parent.data.params["model.topk"] == "1"
    assert parent.data.tags["model.pattern"] == expected["pattern"]


def test_a_catalog_model_has_no_reading_to_record():
    assert model_reading({"model": "tiny-moe"}) is None
    full = model_reading({"model": str(MAVERICK), "model_overrides": {"num_layers": None, "hidden_size": None}})
    assert full == describe(load_model(str(MAVERICK))) and full["pattern"].startswith("12 × [")
