"""Validation by source (bench/leave_one_out.py): each fold leaves out a whole publisher (GPU, family), and what
no kept row can move is not taken from the packaged fit -- the left-out source must not leak into its own refit
through the constants only it measures."""

import pytest

from search_spaces.calibration.calibration_file import Calibration, calibration
from search_spaces.calibration.reference import MODELZOO, NEMO, ORIGINS, long_context_moe_rows, published_rows

from bench.fit_calibration import KERNEL_RELEASE_FACTOR
from bench.leave_one_out import FAMILY_FITTED, PARAMETERS, _moved_by, fold_start, folds, run_fold

ROWS = published_rows() + long_context_moe_rows()


def _fold(name):
    return next(f for f in folds() if f.name == name)


def test_every_source_and_gpu_is_left_out_once_and_leaves_rows_to_fit():
    names = [f.name for f in folds()]
    assert set(ORIGINS) <= set(names) and {"h100", "b200", "gb200", "b300", "gb300", "blackwell"} <= set(names)
    for fold in folds():
        out = [m for m in ROWS if fold.leaves_out(m)]
        assert out and len(out) < len(ROWS), fold.name


def test_a_gpu_family_left_out_starts_from_the_defaults_not_from_the_packaged_fit():
    kept = [m for m in ROWS if not _fold("h100").leaves_out(m)]
    start, packaged, defaults = fold_start(kept, cold=False), calibration(), Calibration()
    for key in FAMILY_FITTED:
        assert getattr(start, key)["hopper"] == getattr(defaults, key)["hopper"] != getattr(packaged, key)["hopper"]
        assert getattr(start, key)["blackwell"] == getattr(packaged, key)["blackwell"]
    assert not any(_moved_by(p, kept) for p in PARAMETERS if p.constant in FAMILY_FITTED and p.family == "hopper")


def test_a_release_left_out_gets_its_kernels_factor_not_its_rows_and_ultra_is_remeasured():
    kept = [m for m in ROWS if not _fold(NEMO).leaves_out(m)]
    start = fold_start(kept, cold=False)
    packaged = calibration().attention_release_factor
    assert set(packaged) == set(KERNEL_RELEASE_FACTOR) and start.attention_release_factor == KERNEL_RELEASE_FACTOR
    assert start.attention_release_factor != packaged  # the packaged factors were fitted on those rows
    # a fold that keeps a release's rows starts from the packaged (fitted) factor
    assert fold_start(ROWS, cold=False).attention_release_factor == packaged
    assert not any(_moved_by(p, kept) for p in PARAMETERS if p.constant == "attention_release_factor")
    # without the Blackwell Ultra rows no pair of twins is left: the Ultra rate is 1, not the packaged measurement
    no_ultra = [m for m in ROWS if m.gpu not in ("b300", "gb300")]
    assert set(fold_start(no_ultra, cold=False).sustained_rate.values()) == {1.0}


@pytest.mark.slow
def test_a_fold_predicts_only_the_rows_it_left_out():
    rows, long_rows = published_rows(), long_context_moe_rows()
    result = run_fold(_fold(MODELZOO), rows, long_rows, max_evals=40)  # a short refit: what it predicts, not how well
    assert result["errors"] and all(m.origin == MODELZOO for m, _ in result["errors"])
    assert len(result["errors"]) + result["refused"] == sum(m.origin == MODELZOO for m in rows + long_rows)
    assert 0 < result["evaluations"] <= 40 + len(PARAMETERS) + 1


def test_every_fitted_constant_is_listed_with_its_bounds_in_calibration_md():
    from pathlib import Path

    from bench.fit_calibration import STATE_STEP

    text = (Path(__file__).resolve().parents[2] / "search_spaces" / "CALIBRATION.md").read_text()
    for p in PARAMETERS + [STATE_STEP]:
        name = p.name if not (p.every_precision and p.family) else f"{p.constant}.{p.family}"
        assert f"| `{name}`" in text, name
