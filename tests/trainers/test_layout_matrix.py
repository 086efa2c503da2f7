"""The layout-coverage matrix (trainers/coverage.py): the real CPU trainer runs every cell, and each does what it
should: status ok, the loss falls, Megatron applied exactly the layout, and a layout that differs from its
reference only by TP and CP (which keep the initialisation) reproduces the reference's loss.

All cells run on four ranks in one set of processes (trainers/cells.py: the start-up of each rank once, not once a
cell); a shared-process cell equals the same layout run alone by the command a user types.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.layouts import rules
from search_spaces.layouts.layout import PARALLEL_SIZES
from search_spaces.result import TrialResult

from tests.trainer_helpers import REPO, assert_ok, run_trainer
from trainers import config as trainer_config
from trainers import coverage

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("layout_matrix")]

CELLS = coverage.with_references()
# The command issue 53 reported crashing (CP 2 x PP 2, one sequence a step), in the shared run as well
ISSUE_COMMAND = ["--model", "tiny-moe", "--seq-len", "64", "--warmup", "1", "--steps", "2", "--cp", "2", "--pp", "2"]
STEPS = ["--warmup", "1", "--steps", "2"]
# Layouts drawn from the sweep's own space (trainers/coverage.py `drawn`): a seed of one's own finds others
DRAWN_SEED = int(os.environ.get("MOE_AUTOTUNE_LAYOUT_SEED", "53"))
DRAWN = coverage.drawn(DRAWN_SEED, per_model=3)


def run_cells(folder, entries: list[tuple[str, list[str]]], ranks: int = coverage.RANKS,
              timeout: float = 1500) -> tuple[dict[str, TrialResult], subprocess.CompletedProcess]:
    """Run (name, trainer flags) entries as one trainers.cells job on `ranks` ranks; each result by name."""
    folder.mkdir(parents=True, exist_ok=True)
    cells = [{"name": name, "argv": [*flags, "--result", str(folder / f"{name}.json")]} for name, flags in entries]
    (folder / "cells.json").write_text(json.dumps(cells, indent=1))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(ranks), "-m", "trainers.cells", str(folder / "cells.json")]
    proc = subprocess.run(argv, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = {name: TrialResult.read(folder / f"{name}.json") for name, _ in entries
               if (folder / f"{name}.json").exists()}
    return results, proc


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    folder = tmp_path_factory.mktemp("layout-matrix")
    lengths = folder / "lengths.json"
    lengths.write_text(json.dumps({"format": "moe-autotune document lengths v1", "lengths": coverage.PACKED_LENGTHS,
                                   "counts": coverage.PACKED_COUNTS}))
    entries = [(c.name, [*c.flags(), *STEPS, *(["--lengths", str(lengths)] if c.packed else [])]) for c in CELLS]
    drawn = [(name, ["--model", model, "--seq-len", str(coverage.SEQ_LEN[model]), *layout.to_flags(), *STEPS])
             for name, model, layout in DRAWN]
    # the drawn layouts last: the first failure ends a shared run, and the matrix's cells each have a test
    results, proc = run_cells(folder, [*entries, ("issue_command", ISSUE_COMMAND), *drawn])
    return results, proc


def test_every_cell_is_legal_and_unique():
    gpu = load_gpu("cpu")
    assert len({c.name for c in CELLS}) == len(CELLS)
    for cell in CELLS:
        assert rules.check(load_model(cell.model), gpu, coverage.RANKS, cell.seq_len, cell.layout()) == [], cell.name


def test_the_matrix_covers_every_pair_of_parallel_dimensions():
    pairs = {frozenset(k for k, _ in c.dims) | ({"dp"} if c.dp > 1 else set())
             for c in coverage.MATRIX if c.model == "tiny-moe" and not c.packed}
    dims = ("tp", "cp", "ep", "etp", "pp", "dp")
    for i, a in enumerate(dims):
        for b in dims[i + 1:]:
            assert any({a, b} <= p for p in pairs), (a, b)
    for a in ("tp", "cp", "ep", "etp", "dp"):  # VPP (with its PP) beside every other dimension
        assert any({a, "pp", "vpp"} <= p for p in pairs), a


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("cell", CELLS, ids=[c.name for c in CELLS])
def test_each_cell_trains_with_the_layout_applied(matrix, cell):
    results, proc = matrix
    assert cell.name in results, f"no result for {cell.name}:\n{proc.stdout[-4000:]}"
    result = results[cell.name]
    assert result.status == "ok", result.error
    assert result.loss_finite and result.loss[-1] < result.loss[0], result.loss
    for key, value in coverage.applied_expectation(cell).items():
        assert result.applied[key] == value, key
    if cell.layout().cp > 1 or cell.packed:
        assert result.applied["core_attention"] == ["ContextParallelDotProductAttention"]
    if cell.packed:
        assert 0 < result.extra["packing"]["useful_token_share"] < 1
    reference = cell.reference()
    if reference is not None:
        assert result.loss == pytest.approx(results[reference.name].loss, rel=2e-4), reference.name


@pytest.mark.timeout(1800)
def test_the_reported_command_trains_and_matches_its_shared_run(matrix, tmp_path):
    """Issue 53's command, as a user types it (its own torchrun): it trains, applies CP 2 x PP 2, and gives the
    loss its shared-process run gave (so the matrix's shared processes change nothing)."""
    results, _ = matrix
    alone, proc = run_trainer(tmp_path, 4, *ISSUE_COMMAND[2:], fast=False)
    assert_ok(alone, proc)
    assert (alone.applied["cp"], alone.applied["pp"]) == (2, 2)
    assert alone.loss[-1] < alone.loss[0]
    assert alone.loss == pytest.approx(results["issue_command"].loss, rel=1e-6)
    assert "shared_process" not in alone.extra and results["issue_command"].extra["shared_process"] is True


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name, model, layout", DRAWN, ids=[d[0] for d in DRAWN])
def test_layouts_drawn_from_the_space_run_or_are_refused_for_a_declared_reason(matrix, name, model, layout):
    """A layout the rules call legal runs in the trainer, or the trainer refuses it for one of its declared
    capability gaps (trainers/config.py), before any process group work; anything else is a bug in one of them."""
    results, proc = matrix
    assert name in results, f"no result for {name} ({layout.key()}), seed {DRAWN_SEED}:\n{proc.stdout[-4000:]}"
    result = results[name]
    gaps = trainer_config.capability_gaps(load_model(model), layout)
    if result.status == "invalid":
        assert gaps and result.error == "; ".join(gaps), result.error
        return
    assert result.status == "ok", f"{layout.key()} (seed {DRAWN_SEED}): {result.error}"
    assert not gaps and result.loss_finite
    expect = {k: getattr(layout, k) for k in PARALLEL_SIZES}
    assert {k: result.applied[k] for k in expect} == expect
    assert result.applied["recompute"]["granularity"] == layout.recompute_granularity


def test_the_shared_run_ended_cleanly(matrix):
    _, proc = matrix
    assert proc.returncode == 0, proc.stdout[-6000:]
