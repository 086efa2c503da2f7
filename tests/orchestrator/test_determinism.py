"""A seeded sweep proposes the same layouts on any machine (issue 34): what the cost model ranks is decided by
counts, never by the clock.

The ranking runs under a clock that races ahead -- every reading a minute after the one before, as on a machine
thousands of times slower -- and must propose exactly what it proposes under the real clock. Only `space`'s
--budget (a user's safety net in seconds) may stop the ranking early, and then its output says so.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
import warnings
from typing import Iterator

import pytest

from search_spaces.layouts import forked, space
from search_spaces.layouts.space import explore

from orchestrator.commands.cli import main
from orchestrator.search.prior import Prior
from orchestrator.spec.schema import parse_spec

# a space far larger than Prior.SMALL_SPACE: the prior ranks it through explore(); small enough to rank quickly
SPEC = {"model": "qwen3-30b-a3b", "gpu": "h200", "nodes": 8, "gpus_per_node": 8, "seq_len": 32768,
        "backend": "analytic", "seed": 0}
SITUATION = ("qwen3-30b-a3b", "h200", 64, 32768)


@contextlib.contextmanager
def racing_clock(monkeypatch: pytest.MonkeyPatch, step_s: float = 60.0) -> Iterator[pytest.MonkeyPatch]:
    """time.perf_counter, monotonic and time advance by `step_s` at every reading."""
    now = [time.time()]

    def reading() -> float:
        now[0] += step_s
        return now[0]

    with monkeypatch.context() as patch:
        for name in ("perf_counter", "monotonic", "time"):
            patch.setattr(time, name, reading)
        yield patch  # a further patch of the clock goes through it: undone with the racing clock, in order


def _proposals(prior: Prior) -> tuple[list[str], list[str]]:
    """What the samplers start from: the seeds and the cost model's ranking."""
    return [lay.key() for lay in prior.seeds()], [lay.key() for lay in prior.ranked(limit=64)]


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_the_prior_proposes_the_same_layouts_under_a_racing_clock(monkeypatch):
    spec = parse_spec(SPEC)
    assert not Prior(spec).small_space  # the ranking goes through explore
    normal = _proposals(Prior(spec))
    with racing_clock(monkeypatch):
        raced = _proposals(Prior(spec))
    assert raced == normal
    assert len(normal[1]) == 64


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_explore_without_a_budget_ignores_the_clock(monkeypatch):
    normal = explore(*SITUATION, top=20)
    with racing_clock(monkeypatch):
        raced = explore(*SITUATION, top=20)
    assert raced.top == normal.top and raced.estimated == normal.estimated and not raced.cut_short
    assert raced.grids_ranked == normal.grids_ranked > 0


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_explore_gives_one_answer_however_many_processes_rank_it(monkeypatch):
    """The ranking is split over the machine's cores (search_spaces/layouts/forked.py): a machine with more or fewer of
    them ranks the same grids, finds the same layouts and lists them in the same order."""
    def answer(found) -> dict:
        return {k: v for k, v in found.to_dict().items() if k != "seconds"}

    alone = answer(explore(*SITUATION, top=20, workers=1))
    assert alone["grids_ranked"] > 3 * space.RANK_BLOCK  # every worker gets grids
    monkeypatch.setattr(forked, "available_workers", lambda: 3)  # fork even beside the suite's threads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python's warning about fork() beside threads
        for workers in (2, 3):
            assert answer(explore(*SITUATION, top=20, workers=workers)) == alone


def test_a_budget_cuts_the_split_ranking_at_one_grid(monkeypatch):
    """Where --budget stops the ranking early, every worker's grids before the first one stopped are ranked and
    none after: `grids_ranked` is a prefix of the ranking order, as in one process."""
    monkeypatch.setattr(forked, "available_workers", lambda: 2)
    with racing_clock(monkeypatch, step_s=0.0) as clock, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # a clock that stands still, then jumps past the budget after some readings
        readings = [0]

        def late() -> float:
            readings[0] += 1
            return 0.0 if readings[0] < 40 else 1e6

        # through the racing clock's own patch: on the test's, its undo at teardown would restore the racing
        # clock (what it replaced) and leave it standing for every later test of this worker
        clock.setattr(time, "perf_counter", late)
        cut = explore(*SITUATION, top=20, budget_s=30, workers=2)
    assert cut.cut_short and 0 < cut.grids_ranked
    whole = explore(*SITUATION, top=20, workers=1, max_grids=cut.grids_ranked)
    assert (cut.estimated, cut.fitting_count, cut.top) == (whole.estimated, whole.fitting_count, whole.top)


def _space(*extra: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["space", "--model", SITUATION[0], "--gpu", SITUATION[1], "--num-gpus", str(SITUATION[2]),
                   "--seq-len", str(SITUATION[3]), *extra])
    return rc, out.getvalue()


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_space_says_when_its_budget_cut_the_ranking_short(monkeypatch):
    rc, text = _space("--json")
    whole = json.loads(text)
    assert rc == 0 and whole["cut_short"] is False and whole["grids_ranked"] > 0
    with racing_clock(monkeypatch, step_s=5.0):  # a few grids ranked before the budget's 30 s run out
        rc, text = _space("--json", "--budget", "30")
        cut = json.loads(text)
        assert rc == 0 and cut["cut_short"] is True and 0 < cut["grids_ranked"] < whole["grids_ranked"]
        rc, text = _space("--budget", "30")
        assert rc == 0 and "cut short" in text and "--budget 30 s" in text
    with racing_clock(monkeypatch):  # the budget runs out before any grid is ranked: no answer, and it says why
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc, text = _space("--json", "--budget", "30")
        lines = err.getvalue().strip().splitlines()
        assert rc == 2 and text == "" and len(lines) == 1 and "--budget ran out first" in lines[0], lines
    rc, text = _space()
    assert rc == 0 and "cut short" not in text


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
def test_a_prior_explored_ahead_in_a_child_ranks_what_it_ranks_in_process(monkeypatch):
    """`moe-autotune sweep` begins a large space's exploration in a forked child while it loads its libraries
    (Prior.explore_ahead): the ranking it takes from the child is the one the prior computes itself."""
    spec = parse_spec(SPEC)
    here = Prior(spec)
    assert not here.small_space
    monkeypatch.setattr(forked, "available_workers", lambda: 2)  # fork even beside the suite's threads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python's warning about fork() beside threads
        ahead = Prior(spec)
        child = ahead.explore_ahead()
        assert child is not None and child._child is not None  # begun in a child process
        assert ahead.ranked(limit=Prior.EXPLORED) == here.ranked(limit=Prior.EXPLORED)
    assert ahead.explore_ahead() is None  # explored: nothing to begin again
