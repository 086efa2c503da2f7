"""One contract for every search and every backend, parametrised over their tables (as Optuna parametrises its
sampler tests over all samplers): a search or backend added to `SEARCH_KINDS` / `BACKENDS` is tested here at once.

A search: proposes only layouts of the sweep's space, never one twice, stops when exhausted or at the budget,
and the same seed gives the same sweep. A backend: every finished trial has a known status and records the
backend's own name, the leaderboard's best is a measured layout that fits, and the study agrees with MLflow.
"""

from __future__ import annotations

import typing
from pathlib import Path

import optuna
import pytest
import typer

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout
from search_spaces.layouts.rules import check

from orchestrator.commands.cli import app, main
from orchestrator.dispatch import BACKENDS, canonical_backend
from orchestrator.records import queries
from orchestrator.search.prior import Prior
from orchestrator.search.samplers import SweepSampler
from orchestrator.search.searches import MAKERS, make_sampler
from orchestrator.search.space import SweepSpace
from orchestrator.search.table import SEARCH_KINDS
from orchestrator.spec.schema import SweepSpec, parse_spec
from orchestrator.storage import studies
from orchestrator.sweep import run_sweep
from tests.sweep_helpers import FAKE_TRAINER

STATUSES = {"ok", "oom", "error", "timeout", "invalid", "infeasible", "interrupted", "unschedulable", "pruned"}


def _sweep(spec):
    out = run_sweep(spec, show_progress=False)
    return out, studies.load_study(spec.storage, spec.name)


def _keys(study) -> list[str]:
    return [t.user_attrs["layout_key"] for t in queries.finished_trials(study) if "layout_key" in t.user_attrs]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("search", list(SEARCH_KINDS))
def test_every_search_keeps_the_contract(sweep_spec, search):
    spec = parse_spec(sweep_spec(f"conf-{search}", seed=11, search=search))
    out, study = _sweep(spec)
    measured = queries.measured_trials(study)
    assert 1 <= out.n_measured == len(measured) <= spec.budget.n_trials
    keys = [t.user_attrs["layout_key"] for t in measured]
    assert len(keys) == len(set(keys)), f"{search} ran a layout twice"
    for t in queries.finished_trials(study):
        assert t.user_attrs["status"] in STATUSES
    # what ran is a legal layout of the sweep's situation (the screen told the illegal ones infeasible)
    model, gpu = load_model(spec.model), load_gpu(spec.gpu)
    for t in measured:
        layout = Layout.from_dict(t.user_attrs["layout"])
        assert not check(model, gpu, spec.num_gpus, spec.seq_len, layout), layout.key()
    assert main(["check", spec.name, "--storage", spec.storage]) == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("search", list(SEARCH_KINDS))
def test_every_search_is_reproducible_from_its_seed(tmp_path, sweep_spec, search):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = _sweep(parse_spec(sweep_spec("again", root=tmp_path / "a", seed=11, search=search)))[1]
    second = _sweep(parse_spec(sweep_spec("again", root=tmp_path / "b", seed=11, search=search)))[1]
    assert _keys(first) == _keys(second)


def _backend_spec(sweep_spec, tmp_path, backend: str) -> SweepSpec:
    """The contract sweep of `backend`: for the replay backend a table recorded first, for one that runs a trainer
    the fake trainer (sweep_spec: tests/conftest.py)."""
    extra = {}
    if backend == "replay":  # a recorded table: the analytic backend's sweep, as `status --csv` writes it
        (tmp_path / "record").mkdir()
        source = parse_spec(sweep_spec("record", root=tmp_path / "record", seed=11, budget={"n_trials": 10},
                                       search="grid"))
        run_sweep(source, show_progress=False)
        table = tmp_path / "table.csv"
        assert main(["status", source.name, "--storage", source.storage, "--csv", str(table)]) == 0
        extra = {"replay_table": str(table), "search": "grid"}
    elif not BACKENDS[backend].what_if:  # a real trainer process per trial; this one returns at once
        extra = {**FAKE_TRAINER, "gpus_per_node": 2, "seq_len": 128, "budget": {"n_trials": 3}}
    return parse_spec(sweep_spec(f"conf-{backend}", seed=11, **{**extra, "backend": backend}))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", [pytest.param(name, marks=[] if kind.what_if else [pytest.mark.slow])
                                     for name, kind in BACKENDS.items()])
def test_every_backend_keeps_the_contract(tmp_path, sweep_spec, backend, monkeypatch):
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    spec = _backend_spec(sweep_spec, tmp_path, backend)
    out, study = _sweep(spec)
    measured = queries.measured_trials(study)
    assert out.n_measured == len(measured) >= 1
    for t in measured:
        assert t.user_attrs["status"] in STATUSES
        assert t.user_attrs["backend"] == backend, "a trial records the backend's own name"
    best = queries.best_fitting_trial(study)
    assert best is not None and best.user_attrs["status"] == "ok" and queries.fits(best)
    assert main(["check", spec.name, "--storage", spec.storage]) == 0


def test_backend_names_and_aliases_come_from_the_table():
    for name, kind in BACKENDS.items():
        assert canonical_backend(name) == name
        for alias in kind.aliases:
            assert canonical_backend(alias) == name
    assert canonical_backend("local") == "ray"  # the Ray backend's former name still reads
    with pytest.raises(SpecError, match="allowed: " + ", ".join(BACKENDS)):
        canonical_backend("slurm-direct")


@pytest.mark.parametrize("search", list(SEARCH_KINDS))
def test_every_search_makes_a_sampler_with_the_loops_hooks(sweep_spec, search):
    spec = parse_spec(sweep_spec(f"hooks-{search}", seed=11, search=search))
    prior = Prior(spec)
    sampler = make_sampler(search, SweepSpace.from_prior(prior), prior, spec.seed)
    assert isinstance(sampler, optuna.samplers.BaseSampler) and isinstance(sampler, SweepSampler)
    assert sampler.memory_margin >= 1.0 and sampler.exhausted is False


def test_the_name_table_and_the_sweeps_makers_agree():
    """orchestrator.search.table names the searches (the spec reads it without the sweep); the sweep makes them."""
    assert set(MAKERS) == set(SEARCH_KINDS)
    with pytest.raises(SpecError, match="unknown search 'nonesuch'"):
        make_sampler("nonesuch", None, None, None)  # type: ignore[arg-type]


def test_the_spec_the_cli_and_the_readme_name_the_tables_choices():
    for field, table in (("backend", BACKENDS), ("search", SEARCH_KINDS)):
        assert typing.get_args(SweepSpec.model_fields[field].annotation) == tuple(table)
        with pytest.raises(SpecError, match=" or ".join(f"'{n}'" for n in list(table)[-2:])):
            parse_spec({field: "nonesuch"})
    options = {p.name: p.help for p in typer.main.get_command(app).commands["sweep"].params}
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for option, table in (("backend", BACKENDS), ("search", SEARCH_KINDS)):
        for name, kind in table.items():
            assert f"{name} ({kind.doc}" in options[option], name
            assert f"`{name}`" in readme, name
    assert parse_spec({"backend": "local"}).backend == "ray"  # an alias is accepted and recorded by its name
