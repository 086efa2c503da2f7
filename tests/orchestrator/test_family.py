"""A length family in one sweep (issue 13): one study per length, shortest first, each seeded from the previous
length's best layouts scaled by the rules of thumb; the family table in the sweep's output, in `status` and in
the report; cost settings shown as the time and dollars to train."""

from __future__ import annotations

import json
import re

import optuna
import pytest

from search_spaces.layouts.layout import Layout

from orchestrator.commands.cli import main
from orchestrator.outputs.check import check
from orchestrator.records import queries
from orchestrator.storage import studies
from orchestrator.sweep.family import scale_to_length
from tests.sweep_helpers import spec_data


def test_a_longer_length_keeps_the_sequence_per_cp_rank():
    lay = Layout(tp=1, cp=8, ep=32, pp=8, gbs=128)
    assert scale_to_length(lay, 32768, 65536, 1024, 64).cp == 16  # DP gives way
    assert scale_to_length(lay, 32768, 131072, 1024, 64).cp == 32
    assert scale_to_length(lay, 32768, 131072, 64, 64).cp == 8  # TP*CP*PP already fills 64 GPUs
    assert scale_to_length(lay, None, 65536, 1024, 32).gbs == 32


@pytest.mark.slow  # three full-scale sub-sweeps, status and report end to end (~1 min on 2 cores)
@pytest.mark.timeout(1200)
def test_a_deepseek_family_at_32k_64k_128k_prints_its_table_and_trend(tmp_path, capsys):
    spec = {"name": "dsv3-family", "model": "deepseek-v3", "seq_len": [32768, 65536, 131072], "gpu": "h100",
            "nodes": 128, "gpus_per_node": 8, "budget": {"n_trials": 12}, "backend": "analytic", "seed": 0,
            "cost": {"usd_per_gpu_hour": 2.5, "train_tokens": 1.0e12},
            "storage": f"sqlite:///{tmp_path / 'o.db'}", "tracking_uri": f"sqlite:///{tmp_path / 'm.db'}",
            "workdir": str(tmp_path / "runs")}
    (tmp_path / "f.json").write_text(json.dumps(spec))
    assert main(["sweep", str(tmp_path / "f.json"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "length family dsv3-family" in out and "TF/s vs shortest" in out
    assert re.search(r"trains 1e\+12 tokens on 1024 GPUs in [\d.,]+ days, \$[\d.]+[kMB]?", out)
    members = studies.family_members(spec["storage"], "dsv3-family")
    assert [m.user_attrs["seq_len"] for m in members] == [32768, 65536, 131072]
    for shorter, longer in zip(members, members[1:]):  # each length starts from the previous one's best
        carried = [t for t in longer.trials if t.user_attrs.get("proposed_by") == "previous length"]
        assert carried
        best_cp = {Layout.from_dict(t.user_attrs["layout"]).cp for t in queries.finished_trials(shorter)
                   if queries.fits(t)}
        assert {Layout.from_dict(t.user_attrs["layout"]).cp for t in carried} & {2 * c for c in best_cp}
    assert main(["status", "dsv3-family", "--storage", spec["storage"]]) == 0
    table = capsys.readouterr().out
    assert all(str(n) in table for n in (32768, 65536, 131072)) and "100%" in table  # the shortest is the base
    for member in members:
        assert check(spec["storage"], member.study_name)[1] == []
    assert {r.info.run_name for r in _parents(spec)} == {m.study_name for m in members}  # one experiment
    assert main(["report", "dsv3-family", "--storage", spec["storage"], "--out", str(tmp_path / "rep"),
                 "--no-mlflow"]) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert 'id="fig-length_family"' in page and "days" in page and "$" in page


def _parents(spec):
    from mlflow import MlflowClient

    client = MlflowClient(spec["tracking_uri"])
    exp = client.get_experiment_by_name(spec["name"])
    return client.search_runs([exp.experiment_id], "tags.`moe_autotune.role` = 'parent'")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_cpu_family_of_two_lengths_runs_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    spec = spec_data(tmp_path, "tiny-family", seq_len=[128, 256], gpus_per_node=2, gbs=4, backend="ray",
                     free=["ep", "cp", "recompute"], fixed={"precision": "fp32", "tp": 1, "pp": 1, "vpp": 1, "mbs": 1},
                     budget={"n_trials": 2}, steps=2, warmup=1, trial_timeout_s=600, seed=2)
    (tmp_path / "f.json").write_text(json.dumps(spec))
    assert main(["sweep", str(tmp_path / "f.json"), "--quiet"]) == 0
    assert "length family tiny-family" in capsys.readouterr().out
    names = [s.study_name for s in optuna.get_all_study_summaries(spec["storage"])]
    assert sorted(names) == ["tiny-family-128", "tiny-family-256"]
    for name in names:
        study, problems = check(spec["storage"], name)
        assert problems == [] and len(queries.measured_trials(study)) == 2
        assert all(t.user_attrs["status"] == "ok" for t in queries.measured_trials(study))
