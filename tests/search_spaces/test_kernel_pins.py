"""Hopper's GEMM terms read from the kernel tables (search_spaces/calibration/kernel_pins.py): each pinned term
makes the model's figure for its own kernel match the table's median, never above the GPU's peak, and the pin does
not depend on where it starts or on the constants the end-to-end rows fit."""

import pytest

from search_spaces.calibration.calibration_file import Calibration, calibration
from search_spaces.calibration.kernel_pins import MIN_DENSE_TOKENS, PEAK_SHARE_CEILING, PINS, median_ratio, pinned


@pytest.mark.parametrize("pin", PINS, ids=lambda p: p.name)
def test_each_pinned_term_matches_its_kernels_median_or_sits_at_the_peak(pin):
    cal, _ = pinned(calibration())
    value, ratio = pin.value(cal), median_ratio(pin, cal)
    assert 0 < value <= PEAK_SHARE_CEILING
    assert abs(ratio - 1) < 1e-3 or (value == PEAK_SHARE_CEILING and ratio < 1), (value, ratio)


def test_each_pin_reads_its_own_table_and_leaves_lone_small_matmuls_out():
    for pin in PINS:
        found = pin.entries()
        assert found and {(e.gpu, e.precision, e.shape["kind"]) for e in found} == {
            (pin.gpu, pin.table_precision, pin.kind)}
        if pin.kind == "dense":
            assert min(int(e.shape["m"]) for e in found) >= MIN_DENSE_TOKENS


def test_the_pins_do_not_depend_on_the_start_nor_on_the_constants_the_rows_fit():
    packaged, _ = pinned(calibration())
    defaults, _ = pinned(Calibration())
    moved, _ = pinned(calibration().updated({"ep_exposed": 0.9, "routed_passes": 5.0, "elementwise_passes": 3.0,
                                             "gemm_efficiency": {"blackwell": {"bf16": 0.3, "fp8": 0.3}}}))
    for pin in PINS:
        assert pin.value(packaged) == pytest.approx(pin.value(defaults), rel=1e-3) == \
            pytest.approx(pin.value(moved), rel=1e-3), pin.name


def test_the_grouped_term_is_a_share_of_the_pinned_fp8_dense_rate():
    """A slower FP8 dense term (set before the grouped pin) leaves the grouped GEMM's absolute rate where its
    table puts it: the grouped share rises (up to the ceiling) rather than the grouped figure falling."""
    cal, summaries = pinned(calibration())
    assert [s["term"] for s in summaries] == [p.name for p in PINS]
    grouped = PINS[-1]
    assert grouped.constant == "grouped_gemm_efficiency" and PINS[1].precision == "fp8"
    slower = cal.updated(PINS[1].constants(PINS[1].value(cal) * 0.8))
    assert median_ratio(grouped, slower) < median_ratio(grouped, cal)
