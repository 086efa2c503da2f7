"""Work split over forked processes: a pure function of its part, each part's result back in order.

`space` ranks a thousand grids, each independently of the others; on a machine with more than one core the parts
run at once in forked children (they inherit the warm memo tables and every object by copy, so nothing but the
results is pickled). The answer is the one a single process gives: the parts are merged in their order, and a part
whose child fails for any reason (a signal, memory, an error) is computed again here.

Forking is skipped where it is not safe or not worth it: no os.fork (Windows), another thread alive (a child of a
threaded process can deadlock on a lock a thread held), one core, or one part.

`Ahead` begins one piece of work in a forked child now and takes its result later: a sweep explores the space
while it loads its libraries (Optuna, MLflow: seconds on one core that the exploration's children share).
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar, cast

Part = TypeVar("Part")
Result = TypeVar("Result")

# at most this many processes at once (the parent is one): a few cores hold the gain, more copy memory for nothing
MAX_WORKERS = 4


def can_fork() -> bool:
    """Is forking safe here: os.fork exists and no other thread is alive (a child of a threaded process can
    deadlock on a lock a thread held)?"""
    return hasattr(os, "fork") and _threads() == 1


def available_workers() -> int:
    """How many processes may share the work here (1: run it in this process)."""
    if not can_fork():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def _threads() -> int:
    """This process's threads, a C library's own pools included (they hold locks too): Python's count where the
    system does not list them."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def map_forked(work: Callable[[Part], Result], parts: Sequence[Part]) -> list[Result]:
    """[work(part) for part in parts], the first part in this process and each other in a forked child; the
    cyclic garbage collector paused meanwhile (_gc_paused)."""
    with _gc_paused():
        return _map_forked(work, parts)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off: the work allocates hundreds of thousands of short-lived dicts and tuples
    (freed by their counts, none in a cycle), and each collection they set off would scan every object the process
    holds (a sweep's stores, a command's libraries) for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _map_forked(work: Callable[[Part], Result], parts: Sequence[Part]) -> list[Result]:
    if len(parts) < 2 or available_workers() < 2:
        return [work(part) for part in parts]
    children: list[tuple[int, int] | None] = []
    rest: list[Any] = []  # each child's result (unpickled: untyped) or _FAILED
    try:
        for part in parts[1:]:
            children.append(_start(work, part))
        first = work(parts[0])
        for child in children:
            rest.append(_FAILED if child is None else _collect(child))
    except BaseException:
        for child in children[len(rest):]:  # interrupted here: the children not yet collected are ended
            if child is not None:
                _stop(*child)
        raise
    return [first, *(work(part) if result is _FAILED else result for part, result in zip(parts[1:], rest))]


_FAILED = object()


class Ahead(Generic[Result]):
    """`work()` begun in a forked child when made, its result taken by result(); computed in this process instead
    where forking is skipped (available_workers) or the child fails. A child whose result is never taken is
    stopped by stop(), by the garbage collector or at exit; killed with its parent, it ends when it finds no
    reader for its result."""

    def __init__(self, work: Callable[[], Result]):
        self._work = work
        self._child = _start(lambda _: work(), None) if available_workers() > 1 else None
        self._reap = weakref.finalize(self, _stop, *self._child) if self._child else None

    def result(self) -> Result:
        child, self._child = self._child, None
        if child is None:
            return self._work()
        assert self._reap is not None
        self._reap.detach()
        try:
            got = _collect(child)
        except BaseException:  # interrupted while waiting: the child is ended, not left computing
            _stop(*child)
            raise
        return self._work() if got is _FAILED else cast(Result, got)  # unpickled: what work() returned

    def stop(self) -> None:
        """End the child if its result was not taken (nothing happens otherwise)."""
        if self._reap is not None:
            self._reap()
        self._child = None


def _start(work: Callable[[Part], Result], part: Part) -> tuple[int, int] | None:
    """(the child's pid, the pipe its result comes through); None where no child could start (a process or file
    limit): the part is then computed here."""
    try:
        reader, writer = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(reader)
        os.close(writer)
        return None
    if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers or buffers
        status = 1
        try:
            os.close(reader)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the child; the parent says what happened
            payload = pickle.dumps(work(part), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(writer, "wb") as out:
                out.write(payload)
            status = 0
        finally:
            os._exit(status)
    os.close(writer)
    return pid, reader


def _collect(child: tuple[int, int]) -> object:
    """The child's result, or _FAILED where it sent none whole."""
    pid, reader = child
    chunks = []
    with os.fdopen(reader, "rb") as pipe:
        while chunk := pipe.read(1 << 20):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if status != 0 or not chunks:
        return _FAILED
    try:
        return pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 -- a truncated result: computed again in this process
        return _FAILED


def _stop(pid: int, reader: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):  # already gone, or reaped by _collect
        pass
    try:
        os.close(reader)
    except OSError:  # closed by _collect before it was interrupted
        pass


__all__ = ["MAX_WORKERS", "Ahead", "available_workers", "can_fork", "map_forked"]
