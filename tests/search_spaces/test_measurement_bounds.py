"""Measurements that cannot be true (issue 21, class 4): wherever a measurement enters (a trainer's result, a
replay-table row, a calibration source, a result kept across a resume) it is judged by the one set of bounds in
search_spaces/validation.py. Generated inputs (NaN, inf, negative, huge, strings): each is either accepted and
within the bounds, or marked invalid with a reason; never the best; calibration never sees it; no traceback.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from search_spaces.calibration.fit import Measurement, measurement_problems, usable
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost.flops import flops_per_token
from search_spaces.layouts.layout import Layout
from search_spaces.result import TrialResult
from search_spaces.validation import CAPACITY_SLACK, CONSISTENCY_TOLERANCE, validate

from orchestrator.commands.cli import main
from orchestrator.dispatch.replay import LAYOUT_COLUMNS, TABLE_COLUMNS, load_table
from orchestrator.outputs.calibrate import from_table, judge_result

H100 = load_gpu("h100")
MODEL_NAME, SEQ, GPUS = "llama3-8b", 8192, 16
MODEL = load_model(MODEL_NAME)
LAYOUTS = [Layout(tp=t, cp=c, gbs=64, precision="bf16") for t, c in ((1, 1), (2, 1), (4, 1), (2, 2), (1, 4))]
# tokens/s per GPU at the H100's BF16 peak for this model and length: the physical ceiling
CEILING = H100.peak("bf16") * 1e12 / flops_per_token(MODEL, SEQ)
# max_examples comes from the Hypothesis profile (tests/conftest.py: 300 in the full suite, fewer in --fast)
PROPERTY = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# what a measurement may claim: real numbers of every size and sign, the non-finite ones, and what is not a number
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e3, 1e5),
                    st.integers(-10**30, 10**30), st.just(None), st.text(max_size=6), st.booleans())


def _within_bounds(result: TrialResult, layout: Layout) -> None:
    """The bounds, stated on their own: what an accepted result must satisfy."""
    def real(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    for name in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s"):
        value = getattr(result, name)
        assert value is None or (real(value) and value > 0), (name, value)
    assert result.peak_memory_gib is None or (real(result.peak_memory_gib)
                                              and 0 <= result.peak_memory_gib <= H100.memory_gib * (1 + CAPACITY_SLACK))
    peak = H100.peak(layout.precision)
    if result.tflops_per_gpu is not None:
        assert result.tflops_per_gpu <= peak
    if result.mfu is not None:
        assert result.mfu <= 1
    if result.tokens_per_sec_per_gpu is not None:
        assert result.tokens_per_sec_per_gpu <= CEILING * (1 + 1e-9)
        if result.step_time_s is not None:
            expected = layout.gbs * SEQ / result.step_time_s / GPUS
            assert abs(result.tokens_per_sec_per_gpu / expected - 1) <= CONSISTENCY_TOLERANCE


# ---- a measured result (the trainer's, or one re-read from the storage, the spool or MLflow) ---------------
@seed(21)
@PROPERTY
@given(layout=st.sampled_from(LAYOUTS), tokens=NUMBERS, tflops=NUMBERS, mfu=NUMBERS, step=NUMBERS,
       memory=NUMBERS, loss=st.lists(NUMBERS, max_size=3))
def test_a_measured_result_is_within_bounds_or_invalid_with_a_reason(layout, tokens, tflops, mfu, step, memory, loss):
    claimed = TrialResult(status="ok", tokens_per_sec_per_gpu=tokens, tflops_per_gpu=tflops, mfu=mfu,
                          step_time_s=step, peak_memory_gib=memory, loss=loss, layout=layout.to_dict())
    judged = validate(claimed, layout, H100, model=MODEL, seq_len=SEQ, num_gpus=GPUS)
    assert judged.status in ("ok", "invalid")
    if judged.status == "ok":
        _within_bounds(judged, layout)
        assert all(isinstance(x, (int, float)) and math.isfinite(x) for x in judged.loss)
    else:
        assert judged.error and judged.error.strip()
        # an invalid result carries numbers only (what the sweep records of it is a number or nothing)
        for name in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s", "peak_memory_gib"):
            value = getattr(judged, name)
            assert value is None or (isinstance(value, (int, float)) and math.isfinite(value))
    # calibration: the stored form of the same result is a data point only when it was accepted
    stored = {**claimed.to_dict(), "model": MODEL_NAME, "gpu": "h100", "num_gpus": GPUS, "seq_len": SEQ}
    measurement, why = judge_result(stored, "generated", "local")
    if judged.status == "invalid":
        assert measurement is None
    if measurement is not None:
        assert measurement_problems(measurement) == []
    elif claimed.tokens_per_sec_per_gpu:
        assert why  # an ok run that is not a data point says why


@pytest.mark.parametrize("change, needle", [
    ({"tokens_per_sec_per_gpu": CEILING * 1.5, "step_time_s": None}, "tokens/s per GPU needs"),
    ({"tflops_per_gpu": 2000.0}, "peak of a h100"),
    ({"mfu": 1.2, "tflops_per_gpu": None}, "MFU 1.20 is above 1"),
    ({"peak_memory_gib": -1.0}, "peak memory (GiB) -1.0 is negative"),
    ({"peak_memory_gib": 120.0}, "above the 79.6 GiB of a h100"),
    ({"step_time_s": 0.0}, "step time (s) 0.0 is not positive"),
    ({"step_time_s": 1.0}, "disagrees with a step of 1 s"),
    ({"tokens_per_sec_per_gpu": "fast"}, "tokens/s per GPU 'fast' is not a number"),
    ({"tflops_per_gpu": math.inf}, "TF/s per GPU inf is not finite"),
])
def test_each_bound_names_its_reason(change, needle):
    layout = LAYOUTS[0]
    tokens = CEILING * 0.4
    honest = dict(status="ok", tokens_per_sec_per_gpu=tokens, tflops_per_gpu=400.0, mfu=0.4,
                  step_time_s=layout.gbs * SEQ / tokens / GPUS, peak_memory_gib=60.0)
    assert validate(TrialResult(**honest), layout, H100, MODEL, SEQ, GPUS).status == "ok"
    judged = validate(TrialResult(**{**honest, **change}), layout, H100, MODEL, SEQ, GPUS)
    assert judged.status == "invalid" and needle in judged.error, judged.error


# ---- a replay table --------------------------------------------------------------------------------------
def _row(layout: Layout, status: str = "ok", tokens="", tflops="", memory=50.0) -> dict:
    return {"model": MODEL_NAME, "gpu": "h100", "num_gpus": GPUS, "seq_len": SEQ, **layout.params(LAYOUT_COLUMNS),
            "status": status, "tokens_per_sec_per_gpu": tokens, "tflops_per_gpu": tflops, "peak_memory_gib": memory}


def _write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


CELLS = st.one_of(NUMBERS.map(lambda x: "" if x is None else str(x)),
                  st.sampled_from(["nan", "NaN", "inf", "-inf", "1e308", "-0", "1e-300", "none", "-"]))


@seed(21)
@PROPERTY
@given(cells=st.lists(st.tuples(st.sampled_from(["ok", "ok", "oom"]), CELLS, CELLS, CELLS),
                      min_size=len(LAYOUTS), max_size=len(LAYOUTS)))
def test_replay_rows_are_within_bounds_or_invalid_and_never_best_or_calibrated(tmp_path_factory, cells):
    path = tmp_path_factory.mktemp("table") / "table.csv"
    _write(path, [_row(lay, status, tokens, tflops, memory)
                  for lay, (status, tokens, tflops, memory) in zip(LAYOUTS, cells)])
    table = load_table(path)  # never a traceback, never a whole-table refusal for a measurement
    assert len(table.rows) == len(LAYOUTS)
    for row, (status, *_) in zip(table.rows.values(), cells):
        if row.status == "ok":
            _within_bounds(row.result(), row.layout)
            assert row.tokens_per_sec_per_gpu is not None and row.reason is None
        elif status == "ok":
            assert row.status == "invalid" and row.reason, row
            assert row.result().error and row.reason in row.result().error
    best = table.best()
    assert best is None or best.status == "ok"
    skipped: list[str] = []
    measurements = from_table(str(path), skipped)
    assert {m.layout for m in measurements} == {r.layout for r in table.rows.values() if r.status == "ok"}
    assert usable(measurements)[1] == []  # calibration never sees a row that cannot be true
    assert len(skipped) == sum(1 for r in table.rows.values() if r.status == "invalid")


def _impossible_table(tmp_path: Path) -> Path:
    """Two honest rows and three that cannot be true, the impossible ones the fastest (as a lying run looks)."""
    honest = [_row(LAYOUTS[0], tokens=CEILING * 0.30), _row(LAYOUTS[1], tokens=CEILING * 0.35)]
    lies = [_row(LAYOUTS[2], tokens=CEILING * 3),  # tokens/s beyond the chip's BF16 peak (no TF/s column given)
            _row(LAYOUTS[3], tokens=CEILING * 0.8, memory=-4.0),  # negative memory
            _row(LAYOUTS[4], tokens=CEILING * 0.9, memory=400.0)]  # more memory than an H100 has
    return _write(tmp_path / "impossible.csv", honest + lies)


def test_an_impossible_replay_row_is_invalid_with_its_reason_and_never_the_best(tmp_path):
    table = load_table(_impossible_table(tmp_path))
    statuses = {row.layout: (row.status, row.reason) for row in table.rows.values()}
    assert statuses[LAYOUTS[2]][0] == "invalid" and "above the 989.4 TF/s bf16 peak" in statuses[LAYOUTS[2]][1]
    assert statuses[LAYOUTS[3]][0] == "invalid" and "negative" in statuses[LAYOUTS[3]][1]
    assert statuses[LAYOUTS[4]][0] == "invalid" and "above the 79.6 GiB" in statuses[LAYOUTS[4]][1]
    assert table.best().layout == LAYOUTS[1]


@pytest.mark.timeout(300)
def test_a_replay_sweep_records_impossible_rows_as_invalid_and_picks_an_honest_best(tmp_path):
    from orchestrator.records import queries
    from orchestrator.spec.schema import parse_spec
    from orchestrator.sweep import run_sweep

    spec = parse_spec({"name": "impossible", "model": MODEL_NAME, "gpu": "h100", "nodes": 2, "gpus_per_node": 8,
                       "seq_len": SEQ, "gbs": 64, "backend": "replay", "replay_table": str(_impossible_table(tmp_path)),
                       "fixed": {"precision": "bf16"}, "budget": {"n_trials": 5}, "seed": 1,
                       "storage": f"sqlite:///{tmp_path / 'optuna.db'}", "tracking_uri": "none",
                       "workdir": str(tmp_path / "runs")})
    outcome = run_sweep(spec, show_progress=False)
    ran = queries.measured_trials(outcome.study)
    invalid = [t for t in ran if t.user_attrs["status"] == "invalid"]
    assert invalid and all(t.user_attrs["reason"] for t in invalid)
    assert outcome.best is not None and outcome.best.user_attrs["status"] == "ok"
    assert outcome.best.values[0] <= CEILING
    assert not {t.number for t in invalid} & {t.number for t in outcome.pareto}


def test_calibrate_skips_impossible_rows_says_so_and_refuses_when_none_is_left(tmp_path, capsys, caplog):
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--table", str(_impossible_table(tmp_path)), "--no-published", "--holdout", "0",
                 "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "skipped 3 measurement(s) that cannot be true" in caplog.text  # a warning line on stderr
    assert "2 measurements" in captured.out
    only_lies = _write(tmp_path / "lies.csv", [_row(LAYOUTS[2], tokens=CEILING * 3),
                                               _row(LAYOUTS[3], tokens="nan")])
    assert main(["calibrate", "--table", str(only_lies), "--out", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no measurement left to calibrate on: all 2")
    assert not (tmp_path / "none.json").exists()


def test_a_measurement_handed_to_calibration_directly_is_judged_too():
    from orchestrator.outputs.calibrate import calibrate

    lie = Measurement(MODEL_NAME, "h100", GPUS, SEQ, LAYOUTS[0], tokens_per_sec_per_gpu=CEILING * 2, source="lie")
    assert "peak" in measurement_problems(lie)[0]
    with pytest.raises(Exception, match="no measurement left to calibrate on"):
        calibrate([lie])


def test_a_stored_result_that_cannot_be_true_is_no_data_point():
    stored = {"status": "ok", "model": MODEL_NAME, "gpu": "h100", "num_gpus": GPUS, "seq_len": SEQ,
              "layout": LAYOUTS[0].to_dict(), "tokens_per_sec_per_gpu": CEILING * 10, "peak_memory_gib": 40.0}
    measurement, why = judge_result(stored, "study s trial 3", "local")
    assert measurement is None and why.startswith("study s trial 3:") and "peak" in why
    measurement, why = judge_result({**stored, "tokens_per_sec_per_gpu": CEILING / 3}, "study s trial 4", "local")
    assert measurement is not None and why is None
