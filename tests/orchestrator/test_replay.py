"""Replay backend (issue 8): a sweep over a recorded table finds its best row, reproducibly, inside the table.

tests/data/replay_small.csv is made-up data (cost-model predictions of tiny-moe on 4 CPU ranks times a
seeded random factor; three rows recorded as oom, one as error), as its `note` column says.
"""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pytest

from search_spaces.errors import SpecError

from orchestrator.dispatch.base import TrialRequest
from orchestrator.dispatch.replay import ReplayBackend, load_table
from orchestrator.records import queries
from orchestrator.search.calibrated import CalibratedSearch
from orchestrator.search.prior import make_prior
from orchestrator.spec.schema import parse_spec
from orchestrator.storage import studies

TABLE = Path(__file__).parents[1] / "data" / "replay_small.csv"
BUDGET = 20  # of the table's 40 rows
DRIVER_BUDGET = 12  # of the 40 rows: the calibrated sweep (3 rules of thumb first) found the best by trial 9-11 here


# this module's sweep: the replay backend answering from TABLE (sweep_spec: tests/conftest.py)
REPLAY = {"seq_len": 128, "backend": "replay", "replay_table": str(TABLE), "seed": 3, "budget": {"n_trials": BUDGET},
          "tracking_uri": "none", "fixed": {}}


def _table_best_key() -> str:
    return load_table(TABLE).best().layout.key()


# ---- the table ---------------------------------------------------------------------------------------

def test_load_table_reads_every_row_and_the_best():
    table = load_table(TABLE)
    assert (table.model, table.gpu, table.num_gpus, table.seq_len) == ("tiny-moe", "cpu", 4, 128)
    with TABLE.open() as fh:
        raw = list(csv.DictReader(fh))
    assert len(table.rows) == len(raw)
    best_raw = max((r for r in raw if r["status"] == "ok"), key=lambda r: float(r["tokens_per_sec_per_gpu"]))
    assert table.best().tokens_per_sec_per_gpu == pytest.approx(float(best_raw["tokens_per_sec_per_gpu"]))
    statuses = {row.status for row in table.rows.values()}
    assert statuses == {"ok", "oom", "error"}


def _rewrite(tmp_path: Path, change) -> Path:
    with TABLE.open() as fh:
        rows = list(csv.DictReader(fh))
    columns = list(rows[0])
    columns, rows = change(columns, rows)
    out = tmp_path / "table.csv"
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return out


@pytest.mark.parametrize("change, message", [
    (lambda c, r: (c + ["colour"], [{**x, "colour": "red"} for x in r]), "unknown column 'colour'"),
    (lambda c, r: ([x for x in c if x != "tp"], r), "missing column 'tp'"),
    (lambda c, r: (c, [{**r[0], "status": "great"}] + r[1:]), "line 2: status 'great'"),
    (lambda c, r: (c, [{**r[0], "tp": "two"}] + r[1:]), "line 2: layout field tp must be an integer"),
    (lambda c, r: (c, r[:1] + [{**r[1], "seq_len": "256"}]), "one situation per table"),
    (lambda c, r: (c, []), "has no measured rows"),
])
def test_bad_table_is_one_clear_spec_error(tmp_path, change, message):
    path = _rewrite(tmp_path, change)
    with pytest.raises(SpecError, match=message):
        load_table(path)


def test_missing_table_and_wrong_situation(tmp_path, sweep_spec):
    with pytest.raises(SpecError, match="does not exist"):
        load_table(tmp_path / "nope.csv")
    spec = parse_spec(sweep_spec("replay", REPLAY)).model_copy(update={"seq_len": 4096})
    with pytest.raises(SpecError, match="records seq_len 128, but the sweep has seq_len 4096"):
        make_prior(spec)


def test_backend_answers_from_the_row_and_refuses_other_layouts(tmp_path, sweep_spec):
    table = load_table(TABLE)
    backend = ReplayBackend(table)
    row = next(r for r in table.rows.values() if r.status == "ok")

    def request(layout):
        return TrialRequest(layout=layout, model="tiny-moe", seq_len=128, gpu="cpu", num_gpus=4, nodes=1,
                            gpus_per_node=4, steps=2, warmup=1, timeout_s=10, workdir=tmp_path)

    result = backend.submit(request(row.layout)).result()
    assert (result.status, result.tokens_per_sec_per_gpu) == ("ok", row.tokens_per_sec_per_gpu)
    outside = row.layout.replace(mbs=8, gbs=64)
    assert outside.key() not in table.rows
    assert backend.submit(request(outside)).result().status == "invalid"
    prior = make_prior(parse_spec(sweep_spec("replay", REPLAY)))
    assert not prior.predict(outside).feasible
    assert prior.predict(row.layout).legal


# ---- searching the table ------------------------------------------------------------------------------

def _calibrated_sweep(sweep_spec, tmp_path: Path, seed: int) -> list[str]:
    """CalibratedSearch proposing, the replay backend measuring: the proposed keys in order."""
    spec = parse_spec(sweep_spec("replay", REPLAY, seed=seed))
    prior = make_prior(spec)
    search = CalibratedSearch.from_prior(prior, seed=seed)
    backend = ReplayBackend(prior.table)
    proposed: list[str] = []
    for _ in range(BUDGET):
        layout = search.propose(proposed)
        if layout is None:
            break
        proposed.append(layout.key())
        req = TrialRequest(layout=layout, model=spec.model, seq_len=spec.seq_len, gpu=spec.gpu,
                           num_gpus=spec.num_gpus, nodes=1, gpus_per_node=4, steps=2, warmup=1, timeout_s=10,
                           workdir=tmp_path)
        result = backend.submit(req).result()
        search.observe(layout, result.status, result.tokens_per_sec_per_gpu, result.peak_memory_gib)
    return proposed


def test_calibrated_search_finds_the_best_row_reproducibly(tmp_path, sweep_spec):
    table_keys = set(load_table(TABLE).rows)
    first = _calibrated_sweep(sweep_spec, tmp_path, seed=5)
    assert set(first) <= table_keys
    assert len(set(first)) == len(first)
    assert _table_best_key() in first
    assert _calibrated_sweep(sweep_spec, tmp_path, seed=5) == first


def _driver_sweep(sweep_spec, seed: int, name: str) -> tuple[list[str], object]:
    """A sweep through orchestrator.sweep (make_prior/make_backend pick the replay prior and backend)."""
    from orchestrator.sweep import run_sweep

    spec = parse_spec(sweep_spec(name, REPLAY, seed=seed, budget={"n_trials": DRIVER_BUDGET}))
    outcome = run_sweep(spec, show_progress=False)
    ran = sorted(queries.measured_trials(outcome.study), key=lambda t: t.number)
    return [t.user_attrs["layout_key"] for t in ran], outcome


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_driver_replay_sweep_finds_the_best_row_in_the_table_reproducibly(sweep_spec):
    table = load_table(TABLE)
    keys, outcome = _driver_sweep(sweep_spec, 11, "replay-a")
    again, _ = _driver_sweep(sweep_spec, 11, "replay-b")
    assert keys and set(keys) <= set(table.rows)
    assert len(keys) <= DRIVER_BUDGET
    assert _table_best_key() in keys
    assert again == keys
    # whatever it found is the table's measurement of that layout
    best = outcome.best
    assert best is not None
    assert best.values[0] == pytest.approx(table.rows[best.user_attrs["layout_key"]].tokens_per_sec_per_gpu)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_replay_sweep_finds_the_best_row(tmp_path):
    from orchestrator.commands.cli import main

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("name: cli-replay\nmodel: tiny-moe\ngpu: cpu\ngpus_per_node: 4\nseq_len: 128\ngbs: 8\n"
                         f"budget: {{n_trials: {BUDGET}}}\ntracking_uri: none\nworkdir: {tmp_path}/runs\n")
    table = tmp_path / "table.csv"
    shutil.copy(TABLE, table)
    runs = []
    for name in ("cli-a", "cli-b"):
        storage = f"sqlite:///{tmp_path}/{name}.db"
        code = main(["sweep", str(spec_file), "--backend", "replay", "--replay-table", str(table), "--seed", "7",
                     "--storage", storage, "--study-name", name, "--quiet"])
        assert code == 0
        study = studies.load_study(storage, name)
        runs.append([t.user_attrs["layout_key"] for t in sorted(queries.measured_trials(study),
                                                                 key=lambda t: t.number)])
        assert set(runs[-1]) <= set(load_table(table).rows)
        assert queries.best_fitting_trial(study).user_attrs["layout_key"] == _table_best_key()
    assert runs[0] == runs[1]


# ---- the calibration itself ------------------------------------------------------------------------------

def _toy(memory_limit: float = 10.0):
    """Layouts tp x pp; the model predicts tokens 100 for all and memory 8/tp (+1 at pp 1)."""
    from search_spaces.layouts.layout import Layout

    layouts = [Layout(tp=tp, pp=pp, gbs=8) for tp in (1, 2, 4) for pp in (1, 2, 4)]

    def predict(lay):
        return True, 100.0, 8.0 / lay.tp + (1.0 if lay.pp == 1 else 0.0)
    return layouts, predict


def test_calibration_learns_a_dimension_the_model_gets_wrong():
    layouts, predict = _toy()
    search = CalibratedSearch(layouts, predict, memory_limit_gib=10.0, seed=0)
    # truth: tp=4 runs at half the predicted speed; measure two tp=4 layouts and one tp=1 layout
    for lay in (layouts[6], layouts[7], layouts[0]):
        search.observe(lay, "ok", 50.0 if lay.tp == 4 else 100.0, 1.0)
    untried_tp4, untried_tp1 = layouts[8], layouts[2]
    assert search.predicted(untried_tp4) < 0.8 * search.predicted(untried_tp1)
    proposals = {search.propose({lay.key() for lay in (layouts[6], layouts[7], layouts[0])}).tp
                 for _ in range(10)}
    assert 4 not in proposals


def test_an_oom_raises_the_memory_correction_of_what_shares_its_values():
    layouts, predict = _toy()
    search = CalibratedSearch(layouts, predict, memory_limit_gib=8.5, seed=0)
    tp1_pp2 = layouts[1]  # predicted 8 GiB: fits the 8.5 GiB limit on paper
    search.observe(tp1_pp2, "oom", None, None)
    tried = {tp1_pp2.key()}
    for _ in range(10):
        lay = search.propose(tried)
        assert lay.tp != 1  # the other tp=1 layouts are predicted to need as much: not proposed


@pytest.mark.parametrize("stray, kept", [(0.0, (0.0, 0.0)), (0.15, (0.8, 1.0))])
def test_a_measured_layouts_own_residual_is_kept_as_far_as_layouts_stray_beyond_the_noise(stray, kept):
    """Once 5 layouts are measured the search learns how far a layout strays from its values' effects: measured at the
    prediction (within the noise), one layout's lucky run is the noise's and its belief stays at its values' effects;
    when rows stray +-15% (a replay table's interactions), a row's own figure is kept."""
    layouts, predict = _toy()
    search = CalibratedSearch(layouts, predict, memory_limit_gib=10.0, seed=0)
    measured = layouts[:6]
    for k, lay in enumerate(measured[:-1]):
        search.observe(lay, "ok", 100.0 * (1.0 + stray * (-1) ** k), 1.0)
    lucky = measured[-1]
    search.observe(lucky, "ok", 103.0, 1.0)  # 3%: one run noise above its prediction
    # the share of its residual (measured over its values' effects, log space) its belief keeps
    share = math.log(search.believed(lucky) / search.predicted(lucky)) / math.log(103.0 / search.predicted(lucky))
    assert kept[0] - 1e-9 <= share <= kept[1] + 1e-9


def test_the_next_trial_is_the_one_with_the_most_to_gain_not_a_sure_tie():
    """Every value of tp 1-2 and pp 1-2 measured at the prediction: tp=2, pp=2 can only tie the answer, while a layout
    with an unmeasured value (tp 4 or pp 4) could be faster; the search proposes those, every time."""
    layouts, predict = _toy()
    search = CalibratedSearch(layouts, predict, memory_limit_gib=10.0, seed=0)
    measured = [lay for lay in layouts if (lay.tp, lay.pp) in ((1, 1), (1, 2), (2, 1))]
    for lay in measured:
        search.observe(lay, "ok", 100.0, 1.0)
    tried = {lay.key() for lay in measured}
    for _ in range(20):
        proposed = search.propose(tried)
        assert 4 in (proposed.tp, proposed.pp)
