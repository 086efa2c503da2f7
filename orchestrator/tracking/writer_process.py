"""A forked process that answers a stream of requests, in order, while its parent goes on.

The sweep uses one to make MLflow's records of finished trials on the second core
(orchestrator/tracking/write_behind.py, Tracker.write_behind): the parent sends each request and goes on; it reads
the answers when it needs them.

What the parent can count on:
- every request is answered, in order, or the writer is gone (`alive` False) and the requests it left unanswered
  are the parent's to handle (`unanswered`);
- the writer never outlives the parent: it is killed when the parent dies (Linux's PR_SET_PDEATHSIG), and a
  writer that cannot ask for that answers nothing and leaves at once;
- Ctrl-C and SIGTERM are the parent's: the writer ignores them and ends when the parent closes its requests;
- the parent never blocks on a writer that is itself blocked on an answer the parent has not read (requests and
  answers move together, under select).

A writer is forked only where that is safe (search_spaces.layouts.forked.can_fork: no other thread, whose locks
the child would inherit held); `start` returns None elsewhere. The child leaves with os._exit: it never runs the
parent's exit handlers, flushes its buffers or closes its connections (a SQLite connection the parent opened is
the parent's: orchestrator/storage/sqlite_tuning.py opens a new one for the child).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import struct
from collections import deque
from typing import Any, Callable

from search_spaces.layouts.forked import can_fork

_LENGTH = struct.Struct("!Q")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class WriterProcess:
    """The parent's end of a forked writer: `send` requests, `answers` back (each request's answer, in order)."""

    def __init__(self, pid: int, requests: int, answers: int):
        self.pid = pid
        self._requests, self._answers = requests, answers
        os.set_blocking(requests, False)
        os.set_blocking(answers, False)
        self._out = bytearray()  # framed requests not yet written to the pipe
        self._in = bytearray()  # answer bytes not yet a whole frame
        self._sent: deque[Any] = deque()  # requests not yet answered, oldest first
        # answers read and not yet returned: kept here, so a call stopped by a signal (Ctrl-C) loses none of them
        self._ready: list[tuple[Any, Any]] = []
        self.alive = True

    @classmethod
    def start(cls, serve: Callable[[Any], Any]) -> "WriterProcess | None":
        """Fork a writer that answers each request with `serve(request)`; None where forking is not safe or
        not possible (the caller then does the work itself)."""
        if not can_fork():
            return None
        parent = os.getpid()
        try:
            req_r, req_w = os.pipe()
            ans_r, ans_w = os.pipe()
        except OSError:
            return None
        try:
            pid = os.fork()
        except OSError:
            for fd in (req_r, req_w, ans_r, ans_w):
                os.close(fd)
            return None
        if pid == 0:
            status = 1
            try:
                os.close(req_w)
                os.close(ans_r)
                status = _serve(serve, parent, req_r, ans_w)
            finally:
                os._exit(status)
        os.close(req_r)
        os.close(ans_w)
        return cls(pid, req_w, ans_r)

    @property
    def unanswered(self) -> list[Any]:
        """The requests sent and not answered, oldest first."""
        return list(self._sent)

    def send(self, request: Any) -> list[tuple[Any, Any]]:
        """Queue `request`; the (request, answer) pairs that came back meanwhile."""
        payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        self._out += _LENGTH.pack(len(payload)) + payload
        self._sent.append(request)
        return self._pump(wait=False)

    def answers(self, wait: bool = False) -> list[tuple[Any, Any]]:
        """The (request, answer) pairs that came back; with `wait`, once every request is answered or the writer
        is gone."""
        return self._pump(wait)

    def close(self) -> list[tuple[Any, Any]]:
        """Wait for every answer, then end the writer (it leaves once its requests are closed)."""
        got = self._pump(wait=True)
        self._end()
        return got

    def kill(self) -> None:
        """End the writer now, answered or not (its unanswered requests stay in `unanswered`)."""
        if self.alive:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.alive = False
        self._end()

    def _end(self) -> None:
        for fd in (self._requests, self._answers):
            try:
                os.close(fd)
            except OSError:  # closed already
                pass
        self._requests = self._answers = -1
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped already
            pass
        self.alive = False

    def _pump(self, wait: bool) -> list[tuple[Any, Any]]:
        while self.alive and (self._out or (wait and self._sent)):
            writable = [self._requests] if self._out else []
            readable, can_write, _ = select.select([self._answers], writable, [], None if wait or self._out else 0)
            if can_write:
                try:
                    del self._out[:os.write(self._requests, self._out)]
                except BrokenPipeError:  # the writer is gone: what it answered is still read, the rest unanswered
                    self._out.clear()
                    wait = True
            if readable:
                self._read()
            elif not wait and not can_write:
                break
        if self.alive and not wait:
            ready, _, _ = select.select([self._answers], [], [], 0)
            if ready:
                self._read()
        got, self._ready = self._ready, []
        return got

    def _read(self) -> None:
        try:
            chunk = os.read(self._answers, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:  # the writer is gone
            self.alive = False
            return
        self._in += chunk
        while len(self._in) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self._in)
            if len(self._in) < _LENGTH.size + size:
                return
            answer = pickle.loads(bytes(self._in[_LENGTH.size:_LENGTH.size + size]))
            del self._in[:_LENGTH.size + size]
            self._ready.append((self._sent.popleft(), answer))


def _serve(serve: Callable[[Any], Any], parent: int, requests: int, answers: int) -> int:
    """The writer: answer each request in order until the parent closes them (0), or leave at once (1) where it
    could not be tied to its parent's life."""
    if not _die_with(parent):
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's: it closes our requests when it stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with os.fdopen(requests, "rb") as inbox, os.fdopen(answers, "wb") as outbox:
        while head := inbox.read(_LENGTH.size):
            (size,) = _LENGTH.unpack(head)
            answer = serve(pickle.loads(inbox.read(size)))
            payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
            outbox.write(_LENGTH.pack(len(payload)) + payload)
            outbox.flush()
    return 0


def _die_with(parent: int) -> bool:
    """Be killed when `parent` dies; False where that cannot be asked for, or it died already."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # not Linux
        return False
    return os.getppid() == parent  # it died before the request took effect


__all__ = ["WriterProcess"]
