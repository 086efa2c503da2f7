"""The two end-to-end fits side by side (bench/fit_calibration.py's variants, bench/variant_comparison.py): the
table-pinned variant fits fewer constants to the rows, keeps the kernel tables' terms in every fold (no row set
them), and the comparison applies the validation by source as stated."""

from search_spaces.calibration.calibration_file import Calibration, calibration
from search_spaces.calibration.kernel_pins import PINNED_NAMES, PINS, pinned
from search_spaces.calibration.reference import long_context_moe_rows, published_rows

from bench.estimator_accuracy import fitted_constants
from bench.fit_calibration import ALL_FITTED, PRODUCT, TABLE_PINNED, VARIANTS, start
from bench.leave_one_out import fold_start, folds
from bench.variant_comparison import holds, lines, markdown, side_by_side

ROWS = published_rows() + long_context_moe_rows()


def test_the_pinned_variant_fits_fewer_constants_and_none_of_the_tables_terms():
    names = [p.name for p in TABLE_PINNED.parameters]
    assert not set(names) & set(PINNED_NAMES)
    assert set(PINNED_NAMES) <= {p.name for p in ALL_FITTED.parameters}
    assert fitted_constants(TABLE_PINNED)["count"] == fitted_constants(ALL_FITTED)["count"] - len(PINS)
    assert PRODUCT in VARIANTS.values() and fitted_constants()["count"] == len(PRODUCT.parameters) + 1


def test_the_pinned_start_and_every_fold_keep_the_tables_terms_even_without_hopper_rows():
    table, _ = pinned(Calibration())
    no_hopper = [m for m in ROWS if not next(f for f in folds() if f.name == "h100").leaves_out(m)]
    for cal in (start(variant=TABLE_PINNED), fold_start(no_hopper, cold=False, variant=TABLE_PINNED),
                fold_start(ROWS, cold=True, variant=TABLE_PINNED)):
        for pin in PINS:
            assert abs(pin.value(cal) - pin.value(table)) < 1e-3 * pin.value(table), pin.name
    # the all-fitted variant's start is the packaged fit's, unpinned
    assert start(variant=ALL_FITTED).gemm_efficiency["hopper"] == calibration().gemm_efficiency["hopper"]


class _V:
    def __init__(self, key):
        self.key, self.title = key, f"variant {key}"


def test_the_comparison_lays_every_figure_beside_the_other_and_applies_the_source_limits():
    a = {"mean leave-one-source-out %": 11.9, "worst source fold %": 16.1, "constants fitted to end-to-end rows": 17}
    b = {"mean leave-one-source-out %": 12.3, "worst source fold %": 15.0, "constants fitted to end-to-end rows": 14,
         "only b": 1.0}
    table = side_by_side([(_V("a"), a), (_V("b"), b)])
    assert table["holds"] == {"a": True, "b": False}  # 16.1 is within 0.1 of 16: the same; 12.3 is above 12
    assert holds({"constants fitted to end-to-end rows": 3}) is None  # no folds: nothing to decide on
    rows = {r["figure"]: r for r in table["rows"]}
    assert rows["constants fitted to end-to-end rows"] == {"figure": "constants fitted to end-to-end rows", "a": 17,
                                                          "b": 14}
    assert rows["only b"]["a"] is None
    text = "\n".join(lines(table) + markdown(table))
    assert "| constants fitted to end-to-end rows | 17 | 14 |" in text and "variant b" in text
