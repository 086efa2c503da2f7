"""Work split over forked processes (search_spaces/layouts/forked.py) gives what one process gives, in order, and a part
whose child dies is computed again in the parent."""

from __future__ import annotations

import os
import signal
import warnings

import pytest

from search_spaces.layouts import forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")


@pytest.fixture
def cores(monkeypatch):
    """Fork whatever this machine's cores and the suite's threads (the pytest-xdist worker's) would say: the
    children here only compute and write to a pipe."""
    monkeypatch.setattr(forked, "available_workers", lambda: 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python's warning about fork() beside threads
        yield


def _square_with_pid(part: list[int]) -> tuple[list[int], int]:
    return [n * n for n in part], os.getpid()


def test_parts_come_back_in_order_from_other_processes(cores):
    parts = [[1, 2], [3], [4, 5, 6]]
    results = forked.map_forked(_square_with_pid, parts)
    assert [r[0] for r in results] == [[1, 4], [9], [16, 25, 36]]
    pids = [r[1] for r in results]
    assert pids[0] == os.getpid() and len(set(pids)) == 3  # the first part here, each other in its own child


def test_a_part_whose_child_dies_is_computed_here(cores):
    parent = os.getpid()

    def dies_in_a_child(part: str) -> tuple[str, int]:
        if part == "killed" and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        if part == "raises" and os.getpid() != parent:
            raise RuntimeError("only in the child")
        return part.upper(), os.getpid()

    results = forked.map_forked(dies_in_a_child, ["first", "killed", "raises", "fine"])
    assert [r[0] for r in results] == ["FIRST", "KILLED", "RAISES", "FINE"]
    assert results[1][1] == results[2][1] == parent and results[3][1] != parent


def test_a_fork_the_system_refuses_computes_the_part_here(cores, monkeypatch):
    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")  # a process limit (ulimit -u)

    monkeypatch.setattr(forked.os, "fork", refused)
    results = forked.map_forked(_square_with_pid, [[1], [2], [3]])
    assert results == [([1], os.getpid()), ([4], os.getpid()), ([9], os.getpid())]


def test_an_error_in_the_parents_part_ends_the_children(cores, tmp_path):
    def fails_here(part: int) -> int:
        if part == 0:
            while len(list(tmp_path.iterdir())) < 2:  # both children have started
                os.sched_yield()
            raise ValueError("the parent's part")
        (tmp_path / str(os.getpid())).touch()
        signal.pause()  # never finishes on its own
        return part

    with pytest.raises(ValueError, match="the parent's part"):
        forked.map_forked(fails_here, [0, 1, 2])
    for pid in (int(f.name) for f in tmp_path.iterdir()):
        with pytest.raises(ChildProcessError):  # killed and reaped
            os.waitpid(pid, os.WNOHANG)


def test_one_worker_or_one_part_runs_here(monkeypatch):
    monkeypatch.setattr(forked, "available_workers", lambda: 1)
    assert [r[1] for r in forked.map_forked(_square_with_pid, [[1], [2]])] == [os.getpid()] * 2
    monkeypatch.setattr(forked, "available_workers", lambda: 4)
    assert forked.map_forked(_square_with_pid, [[3]]) == [([9], os.getpid())]


def test_no_fork_beside_other_threads(monkeypatch):
    monkeypatch.setattr(forked, "_threads", lambda: 2)
    assert forked.available_workers() == 1
    monkeypatch.setattr(forked, "_threads", lambda: 1)
    monkeypatch.setattr(forked.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert forked.available_workers() == 2


def test_threads_counts_this_one():
    assert forked._threads() >= 1


# ---- Ahead: one piece of work begun now in a child, its result taken later -------------------------------------
def test_ahead_computes_in_a_child_and_gives_its_result(cores):
    ahead = forked.Ahead(lambda: ([n * n for n in range(4)], os.getpid()))
    squares, pid = ahead.result()
    assert squares == [0, 1, 4, 9] and pid != os.getpid()


def test_ahead_whose_child_dies_computes_here(cores):
    parent = os.getpid()

    def dies_in_a_child() -> int:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid()

    assert forked.Ahead(dies_in_a_child).result() == parent


def test_ahead_without_a_second_core_computes_when_asked(monkeypatch):
    monkeypatch.setattr(forked, "available_workers", lambda: 1)
    calls = []
    ahead = forked.Ahead(lambda: calls.append(os.getpid()) or "done")
    assert calls == []  # nothing computed until the result is taken
    assert ahead.result() == "done" and calls == [os.getpid()]


def test_an_ahead_never_taken_is_stopped_and_reaped(cores, tmp_path):
    def never_finishes() -> None:
        (tmp_path / str(os.getpid())).touch()
        signal.pause()

    ahead = forked.Ahead(never_finishes)
    while not list(tmp_path.iterdir()):  # the child has started
        os.sched_yield()
    ahead.stop()
    (pid,) = (int(f.name) for f in tmp_path.iterdir())
    with pytest.raises(ChildProcessError):  # killed and reaped
        os.waitpid(pid, os.WNOHANG)
    ahead.stop()  # a second stop does nothing
