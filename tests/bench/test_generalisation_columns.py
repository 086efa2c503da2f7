"""Issue 57's generalisation columns (bench/estimator_accuracy.py): leave-one-generation-out and
leave-one-model-class-out are computed over the right held-out sets -- no held-out row is in its refit's rows, each
held-out set is non-empty, and each column reads its own fold's rows. Behaviour only: not the figures."""

import pytest

from search_spaces.calibration.reference import long_context_moe_rows, published_rows

from bench.estimator_accuracy import COLUMNS, fitted_constants, generalisation, generalisation_section
from bench.fit_calibration import PRODUCT, STATE_STEP
from bench.leave_one_out import FINE_GRAINED_WIDTH, MODEL_CLASS_RULE, folds, model_class

ROWS = published_rows() + long_context_moe_rows()


def _held_out_set(held: str):
    """Whether a row belongs to what a column holds out: a GPU generation (family) or a model class."""
    if held in ("hopper", "blackwell"):
        return lambda m: m.family == held
    return lambda m: model_class(m) == held


@pytest.mark.parametrize("column, held, fitted_on, fold_name", COLUMNS)
def test_each_column_refits_without_every_row_it_holds_out(column, held, fitted_on, fold_name):
    fold = next(f for f in folds() if f"{f.kind} {f.name}" == fold_name)
    belongs = _held_out_set(held)
    left_out = [m for m in ROWS if fold.leaves_out(m)]
    kept = [m for m in ROWS if not fold.leaves_out(m)]
    assert left_out and kept, fold_name
    assert all(belongs(m) for m in left_out), fold_name  # it predicts only the held-out set...
    assert not any(belongs(m) for m in kept), fold_name  # ...and its refit saw none of it (Hopper's = H100's rows)


def test_both_directions_of_each_column_and_the_generation_refits_are_fitted_on_the_other_generation():
    assert {(c, h) for c, h, _, _ in COLUMNS} == {("generation", "blackwell"), ("generation", "hopper"),
                                                 ("model class", "fine-grained"), ("model class", "coarse")}
    for held, other in (("blackwell", "hopper"), ("hopper", "blackwell")):
        fold = next(f for f in folds() if f"{f.kind} {f.name}" == next(c[3] for c in COLUMNS if c[1] == held))
        assert {m.family for m in ROWS if not fold.leaves_out(m)} == {other}


def test_the_model_classes_split_the_moe_rows_by_expert_width_and_keep_dense_rows_in_both_fits():
    classes = {m.model: model_class(m) for m in ROWS}
    assert classes["qwen3-30b-a3b"] == classes["deepseek-v3"] == "fine-grained"
    assert classes["gpt-oss-120b"] == "coarse" and classes["llama3-8b"] == "dense"
    for m in ROWS:
        spec = m.spec()
        if spec.num_experts:
            assert (model_class(m) == "fine-grained") == (spec.moe_ffn_hidden_size <= FINE_GRAINED_WIDTH
                                                          * spec.hidden_size)
    class_folds = [f for f in folds() if f.kind == "class"]
    assert {f.name for f in class_folds} == {"fine-grained", "coarse"}
    dense = [m for m in ROWS if model_class(m) == "dense"]
    assert dense and all(not f.leaves_out(m) for f in class_folds for m in dense)


def test_a_column_reads_only_its_own_folds_rows_mean_and_max_absolute_error():
    def row(fold, err):
        return {"fold": fold, "model": "m", "gpu": "h100", "seq_len": 4096, "error_pct": err}

    rows = [row("family blackwell", -10.0), row("family blackwell", 20.0), row("gpu h100", 5.0),
            row("gpu b200", 99.0), row("class fine-grained", -30.0), row("class coarse", 1.0)]
    cols = {c["held_out"]: c for c in generalisation(rows)["columns"]}
    assert (cols["blackwell"]["rows"], cols["blackwell"]["mean"], cols["blackwell"]["max"]) == (2, 15.0, 20.0)
    assert (cols["hopper"]["rows"], cols["hopper"]["max"]) == (1, 5.0)  # gpu b200's row is no column's
    assert cols["fine-grained"]["max"] == 30.0 and cols["fine-grained"]["worst"] == ["m h100 4K -30.0%"]
    text = "\n".join(generalisation_section(generalisation(rows)))
    assert "| leave-one-generation-out | blackwell |" in text and "| leave-one-model-class-out | coarse |" in text
    assert MODEL_CLASS_RULE in text and f"**{fitted_constants()['count']}**" in text


def test_the_fitted_constants_are_counted_from_the_fits_parameter_vector():
    fitted = fitted_constants()
    assert fitted["count"] == len(PRODUCT.parameters) + 1 == len(fitted["names"])
    assert fitted["names"][-1] == STATE_STEP.name and len(set(fitted["names"])) == fitted["count"]
