"""A sweep of packed documents: the spec field, the cost model's ranking by real tokens, MLflow's record of the
distribution and the exports' packing settings."""

from __future__ import annotations

import json

import pytest

from search_spaces.errors import SpecError

from orchestrator.commands.cli import main
from orchestrator.spec.schema import SweepSpec
from tests.sweep_helpers import make_spec, spec_data, write_spec

HISTOGRAM = {"format": "moe-autotune document lengths v1", "source": "test", "lengths": [20, 60, 200],
             "counts": [6, 3, 1]}


@pytest.fixture
def lengths(tmp_path):
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(HISTOGRAM))
    return path


def test_the_spec_says_how_samples_are_built(tmp_path, lengths):
    assert SweepSpec.model_fields["packing"].description and make_spec(tmp_path).packing.mode == "full"
    spec = make_spec(tmp_path, packing={"mode": "packed", "lengths": str(lengths)})
    assert spec.packing.histogram(spec.seq_len).documents == 10
    assert spec.situation()["packing"].startswith("sha256:")
    assert "packing" not in make_spec(tmp_path).situation()  # older full-length studies resume as before


@pytest.mark.parametrize("packing, needle", [
    ({"mode": "packed"}, "needs lengths"),
    ({"mode": "full", "lengths": "x.json"}, "only read with mode: packed"),
    ({"mode": "thd"}, "packing.mode"),
])
def test_a_bad_packing_field_is_one_line(tmp_path, packing, needle):
    with pytest.raises(SpecError, match=needle):
        make_spec(tmp_path, packing=packing)


def test_documents_longer_than_the_sequence_refuse_the_spec(tmp_path, capsys):
    path = tmp_path / "long.json"
    path.write_text(json.dumps({**HISTOGRAM, "lengths": [20, 60, 2000]}))
    spec = write_spec(tmp_path / "s.yaml", spec_data(tmp_path, packing={"mode": "packed", "lengths": str(path)}))
    assert main(["sweep", str(spec), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "longer than seq_len 256" in err, err


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
def test_a_packed_sweep_records_the_distribution_and_exports_the_packing(tmp_path, lengths, capsys):
    data = spec_data(tmp_path, name="packed", packing={"mode": "packed", "lengths": str(lengths)},
                     budget={"n_trials": 3})
    spec = write_spec(tmp_path / "s.yaml", data)
    assert main(["sweep", str(spec), "--quiet"]) == 0
    capsys.readouterr()
    import mlflow

    client = mlflow.MlflowClient(data["tracking_uri"])
    exp = client.get_experiment_by_name("packed")
    (parent,) = [r for r in client.search_runs([exp.experiment_id]) if "packing" in r.data.params]  # the parent
    assert not parent.data.tags.get("mlflow.parentRunId")
    assert parent.data.params["packing"] == "packed" and parent.data.params["packing.documents"] == "10.0"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "packing")}
    assert "packing/lengths.json" in artifacts
    assert main(["export", "packed", "--storage", data["storage"], "--allow-estimated",
                 "--format", "megatron-args"]) == 0
    assert "--dataloader-inter-document-masking" in capsys.readouterr().out
    assert main(["export", "packed", "--storage", data["storage"], "--allow-estimated", "--format", "bridge-yaml"]) == 0
    import yaml

    dataset = yaml.safe_load(capsys.readouterr().out)["dataset"]
    assert dataset["seq_length"] == 256 and dataset["packed_sequence_specs"]["packed_sequence_size"] == 256
    # the report: the cost model's best for full-length documents beside its best for these, in the sweep's space
    assert main(["report", "packed", "--storage", data["storage"], "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "report.html").read_text()
    assert 'id="packing"' in page and "best layout for full-length documents is tp" in page
    lengths.unlink()  # moved or deleted since the sweep: the page says so, it is still written
    assert main(["report", "packed", "--storage", data["storage"], "--out", str(tmp_path / "report")]) == 0
    assert "no comparison with full-length documents" in (tmp_path / "report" / "report.html").read_text()
