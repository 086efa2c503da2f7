"""A calibration that learns: measurements in (tables, studies), a file out, and the commands that use it."""

import csv
import json
import math

import pytest

from search_spaces.calibration.calibration_file import calibration
from search_spaces.calibration.fit import (
    FAMILY_PARAMETERS,
    Calibration,
    Measurement,
    Parameter,
    fit,
    load_calibration,
    log_loss,
    nelder_mead,
    parameters_for,
    predict_tokens,
    with_values,
)
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.commands.cli import main
from orchestrator.dispatch.replay import LAYOUT_COLUMNS, TABLE_COLUMNS

H100_LAYOUTS = [Layout(tp=t, cp=c, gbs=64, precision="bf16") for t, c in ((1, 1), (2, 1), (4, 1), (2, 2), (1, 4))]


def _truth(gemm=0.5, fwd=0.4, bwd=0.3) -> Calibration:
    return calibration().updated({"gemm_efficiency": {"hopper": {"bf16": gemm, "fp8": gemm}},
                                  "attention_fwd_efficiency": {"hopper": fwd},
                                  "attention_bwd_efficiency": {"hopper": bwd}})


def _measured(truth: Calibration, seqs=(8192, 32768)) -> list[Measurement]:
    """What a Llama3-8B sweep on 16 H100 would measure if the truth were `truth` (the model's own shape)."""
    out = []
    for seq in seqs:
        for layout in H100_LAYOUTS:
            m = Measurement("llama3-8b", "h100", 16, seq, layout, tokens_per_sec_per_gpu=1.0, source="synthetic")
            out.append(Measurement(**{**m.__dict__, "tokens_per_sec_per_gpu": predict_tokens(m, truth)}))
    return out


def test_nelder_mead_finds_a_bowl_minimum():
    x, value, _ = nelder_mead(lambda v: (v[0] - 1) ** 2 + 2 * (v[1] + 0.5) ** 2, [0.0, 0.0])
    assert value < 1e-4 and x[0] == pytest.approx(1, abs=0.02) and x[1] == pytest.approx(-0.5, abs=0.02)


def test_fit_recovers_the_constants_that_made_the_measurements():
    truth = _truth()
    ms = _measured(truth)
    start = calibration()
    assert log_loss(ms, start) > 0.1
    cal, summary = fit(ms, parameters_for(["hopper"]))
    assert summary["loss_after"] < 0.01 < summary["loss_before"]
    gemm = FAMILY_PARAMETERS["hopper"][0]
    assert gemm.name == "gemm_efficiency.hopper" and summary["fitted"][0] == gemm.name
    assert gemm.value(cal) == pytest.approx(0.5, rel=0.05)
    # BF16 measurements rescale the family: FP8 keeps the packaged ratio to BF16, it is not overwritten
    packaged = start.gemm_efficiency["hopper"]
    assert cal.gemm_efficiency["hopper"]["bf16"] == gemm.value(cal)
    assert cal.gemm_efficiency["hopper"]["fp8"] == pytest.approx(gemm.value(cal) * packaged["fp8"] / packaged["bf16"])


def test_a_parameter_of_one_precision_class_moves_that_class_alone():
    fp8 = Parameter("gemm_efficiency", "hopper", 0.2, 0.85, precision="fp8")
    assert fp8.name == "gemm_efficiency.hopper.fp8"
    start = calibration()
    cal = with_values(start, [fp8], [0.33])
    assert fp8.value(cal) == 0.33 == cal.gemm_efficiency["hopper"]["fp8"]
    assert cal.gemm_efficiency["hopper"]["bf16"] == start.gemm_efficiency["hopper"]["bf16"]
    assert cal.gemm_efficiency["blackwell"] == start.gemm_efficiency["blackwell"]


def _write_table(path, ms: list[Measurement]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS)
        writer.writeheader()
        for m in ms:
            writer.writerow({"model": m.model, "gpu": m.gpu, "num_gpus": m.num_gpus, "seq_len": m.seq_len,
                             **m.layout.params(LAYOUT_COLUMNS), "status": "ok",
                             "tokens_per_sec_per_gpu": m.tokens_per_sec_per_gpu, "tflops_per_gpu": "",
                             "peak_memory_gib": 50.0})


def test_calibrate_command_learns_from_tables_and_estimate_uses_the_file(tmp_path, capsys):
    truth = _truth()
    tables = []
    for seq in (8192, 32768):  # a replay table holds one situation each
        table = tmp_path / f"llama-{seq}.csv"
        _write_table(table, _measured(truth, (seq,)))
        tables += ["--table", str(table)]
    out = tmp_path / "cal.json"
    assert main(["calibrate", *tables, "--no-published", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "held-out error" in text and "hopper" in text
    doc = json.loads(out.read_text())
    assert doc["format"] == "moe-autotune calibration" and doc["summary"]["held_out"] == 5
    before, after = doc["summary"]["held_out_mape_before"], doc["summary"]["held_out_mape_after"]
    assert after["tokens_per_sec_per_gpu"] < before["tokens_per_sec_per_gpu"] / 3
    # estimate with the file predicts what the "measurements" said
    argv = ["estimate", "--model", "llama3-8b", "--gpu", "h100", "--num-gpus", "16", "--seq-len", "32768",
            "--tp", "2", "--cp", "2", "--gbs", "64", "--precision", "bf16", "--json"]
    assert main(argv) == 0
    packaged = json.loads(capsys.readouterr().out)["tokens_per_sec_per_gpu"]
    assert main(argv + ["--calibration", str(out)]) == 0
    learnt = json.loads(capsys.readouterr().out)["tokens_per_sec_per_gpu"]
    want = predict_tokens(Measurement("llama3-8b", "h100", 16, 32768, H100_LAYOUTS[3]), truth)
    assert abs(math.log(learnt / want)) < abs(math.log(packaged / want))
    assert main(["space", "--model", "llama3-8b", "--gpu", "h100", "--num-gpus", "16", "--seq-len", "32768",
                 "--top", "2", "--json", "--calibration", str(out), "--max-grids", "20"]) == 0
    assert json.loads(capsys.readouterr().out)["top"]


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not JSON"),
    ('{"gemm_efficiency": {"hopper": {"bf16": -1}}}', "must be a positive number"),
    ('{"warp_drive": 2}', "unknown constant 'warp_drive'"),
    ('{"ep_exposed": true}', "constant ep_exposed"),
    ('{"ep_exposed": NaN}', "must be a positive number"),
    ('{"ep_exposed": {"hopper": 0.5}}', "constant ep_exposed"),
    ('{"gemm_efficiency": {"ampere": {"bf16": 0.5}}}', "'ampere'"),
    ('[0.5]', "mapping"),
    ('{"format": "moe-autotune calibration", "version": "one", "constants": {}}', "field version"),
    ('{"format": "moe-autotune calibration", "constants": {"routed_passes": -2}}', "constant routed_passes"),
])
def test_a_bad_calibration_file_is_one_line_exit_2(tmp_path, content, needle, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    rc = main(["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "1", "--seq-len", "256",
               "--calibration", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error:") and needle in err[0]
    with pytest.raises(SpecError, match=needle):
        load_calibration(bad)


def test_calibrate_needs_measurements(tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "c.json")]) == 2
    assert "give at least one --study" in capsys.readouterr().err
    empty = tmp_path / "empty.csv"
    _write_table(empty, [])
    assert main(["calibrate", "--table", str(empty), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no measured rows" in err
    with pytest.raises(SpecError, match="no measured trial"):
        from orchestrator.outputs.calibrate import calibrate
        calibrate([])


def test_sweep_spec_takes_a_calibration(tmp_path):
    from orchestrator.search.prior import make_prior
    from orchestrator.spec.schema import parse_spec

    cal_file = tmp_path / "cal.json"
    cal_file.write_text(json.dumps({"cpu_overhead_per_layer_s": 0.5}))
    spec = parse_spec({"model": "tiny-moe", "gpu": "cpu", "seq_len": 256, "gpus_per_node": 4, "gbs": 8,
                       "backend": "analytic", "calibration": str(cal_file)})
    slow = make_prior(spec).predict(Layout(gbs=8, precision="fp32")).tokens_per_sec_per_gpu
    plain = make_prior(spec.model_copy(update={"calibration": None})).predict(
        Layout(gbs=8, precision="fp32")).tokens_per_sec_per_gpu
    assert slow < plain
    with pytest.raises(SpecError, match="calibration"):
        parse_spec({"calibration": str(tmp_path / "missing.json")})


def test_measured_study_trials_are_data(tmp_path):
    """A study's measured trials (not analytic ones) become measurements, with the proxy model's overrides."""
    from orchestrator.outputs.calibrate import measurement_from_result

    result = {"status": "ok", "model": "tiny-moe", "gpu": "cpu", "num_gpus": 4, "seq_len": 256,
              "layout": Layout(gbs=8, precision="fp32").to_dict(), "tokens_per_sec_per_gpu": 900.0,
              "peak_memory_gib": 0.8, "extra": {"model_overrides": {"num_layers": 2, "hidden_size": None}}}
    m = measurement_from_result(result, "study s trial 0", "local")
    assert m.tokens() == 900.0 and m.spec().num_layers == 2
    assert measurement_from_result(result, "x", "analytic") is None
    assert measurement_from_result({**result, "status": "oom"}, "x", "local") is None


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(600)
def test_replay_sweep_records_its_calibration_and_its_trials_teach_the_next(tmp_path, capsys):
    """A sweep with `calibration:` logs the file on its MLflow parent run; its measured trials (replay rows here;
    analytic ones would not count) are data for `calibrate --study` and `--experiment`."""
    from pathlib import Path

    from mlflow import MlflowClient

    from orchestrator.sweep import run_sweep
    from tests.sweep_helpers import make_spec

    table = Path(__file__).parents[1] / "data" / "replay_small.csv"
    start = tmp_path / "start.json"
    start.write_text(json.dumps({"cpu_overhead_per_layer_s": 0.02}))
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    spec = make_spec(tmp_path, "replayed", seq_len=128, backend="replay", replay_table=str(table), fixed={},
                     budget={"n_trials": 8}, storage=storage, tracking_uri=tracking, calibration=str(start))
    out = run_sweep(spec, show_progress=False)
    assert out.exit_code == 0
    client = MlflowClient(tracking)
    parent = client.get_run(out.study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.params["calibration"].startswith("start.json sha256:")
    assert "calibration/start.json" in {a.path for a in client.list_artifacts(parent.info.run_id, "calibration")}
    capsys.readouterr()
    learnt = tmp_path / "learnt.json"
    assert main(["calibrate", "--study", "replayed", "--storage", storage, "--out", str(learnt)]) == 0
    doc = json.loads(learnt.read_text())
    assert doc["summary"]["families"] == ["cpu"] and doc["summary"]["measurements"] >= 5
    assert main(["calibrate", "--experiment", "replayed", "--tracking-uri", tracking, "--holdout", "0",
                 "--out", str(tmp_path / "from-mlflow.json")]) == 0
    assert json.loads((tmp_path / "from-mlflow.json").read_text())["summary"]["measurements"] == \
        doc["summary"]["measurements"]


def test_a_calibration_file_records_its_software_and_another_stack_warns_in_one_line(tmp_path, capsys):
    from search_spaces.calibration.calibration_file import CALIBRATION_PATH
    from search_spaces.calibration.fit import calibration_document
    from search_spaces.catalog.software import installed_stack, measured_stack, warn_if_other_stack

    ran = [Measurement("llama3-8b", "h100", 16, 8192, Layout(), tokens_per_sec_per_gpu=1.0,
                       software=(("torch", "2.9.0"), ("megatron-core", "0.16.0"), ("transformer-engine", "2.9")))] * 2
    stack = measured_stack(ran)
    assert stack == {"torch": "2.9.0", "megatron-core": "0.16.0", "transformer-engine": "2.9"}
    doc = calibration_document(calibration(), [], {}, software=stack)
    assert doc.constants["software"] == stack
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc.model_dump()))
    here = installed_stack()
    assert load_calibration(path).software["torch"] == "2.9.0"
    err = capsys.readouterr().err
    if here.get("torch") and here["torch"] != "2.9.0":  # this environment differs: one warning line, not an error
        assert err.count("\n") == 1 and err.startswith("warning: ") and "torch 2.9.0 -> " in err
    # the same stack, or one that names none of the same packages, says nothing
    assert warn_if_other_stack(path, stack, current=stack) is None
    assert warn_if_other_stack(path, {"container": "NeMo 26.08"}, current=here) is None
    assert warn_if_other_stack(path, {"torch": "1.0"}, current={"torch": "2.0"}).startswith("warning: ")
    capsys.readouterr()
    # the packaged file records what its published rows ran, and loads without a warning
    packaged = json.loads(CALIBRATION_PATH.read_text())
    assert packaged.get("software")
    load_calibration(CALIBRATION_PATH)
    assert capsys.readouterr().err == ""
