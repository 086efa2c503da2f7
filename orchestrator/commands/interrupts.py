"""Ctrl-C and SIGTERM (scancel, kill) unwind a sweep as KeyboardInterrupt, so that running trials are recorded
as interrupted and the sweep can be resumed.

Python runs a signal's handler between two bytecodes of the main thread, and that may be inside a garbage
collector's callback or a `__del__` (SQLAlchemy's and MLflow's objects have them). An exception raised there
cannot propagate: Python prints "Exception ignored in ..." with a traceback and the interrupt is lost. The hook
below catches exactly that case, prints nothing, and has the same signal sent again a moment later (from a thread:
a signal raised inside the hook would run its handler inside the hook), so that the interrupt lands in the
sweep's own code. Once a stop is asked for, SQLAlchemy's log of the cursor the signal cut off is muted
(below), and so is a later finalizer's error: the interrupt can leave an object half cleaned up (CI saw SQLAlchemy's
next `InstanceState._cleanup` fail `assert key is not None` after a SIGTERM had landed inside one). Python ignores
such an error in any case; it is logged at debug level, not printed with a traceback the user cannot act on.

Once the command has returned, a stop no longer unwinds anything: orchestrator/commands/exiting.py."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from orchestrator.commands.exiting import STOPS

log = logging.getLogger(__name__)
_last_signal: list[int] = []  # the signal the handler last raised for (re-delivered when it was swallowed)
REDELIVERY_DELAY_S = 0.01  # long enough to leave the finalizer, short against a user's patience


def _raise(signum, frame) -> None:  # noqa: ARG001
    _last_signal[:] = [signum]
    # the interrupt may land inside a SQLAlchemy fetch: SQLAlchemy then logs "Error closing cursor" with the
    # KeyboardInterrupt's traceback while it unwinds. From here on the process is stopping, and a cursor the
    # signal cut off is expected; an error that matters is still raised, not only logged.
    logging.getLogger("sqlalchemy").setLevel(logging.CRITICAL)
    raise KeyboardInterrupt(f"signal {signum}")


def _redeliver_swallowed(unraisable) -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _last_signal:
        threading.Thread(target=_send_again, args=(os.getpid(), _last_signal[0]), daemon=True).start()
        return
    if _last_signal:  # stopping: a finalizer of an object the interrupt cut off
        log.debug("after the stop, a finalizer failed (%s): %s", getattr(unraisable.object, "__qualname__", None)
                  or type(unraisable.object).__name__, repr(unraisable.exc_value))
        return
    _previous_hook(unraisable)


def _send_again(pid: int, signum: int) -> None:
    time.sleep(REDELIVERY_DELAY_S)
    os.kill(pid, signum)


_previous_hook = sys.unraisablehook


def unwind_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread, never lost in a finalizer."""
    global _previous_hook
    for signum in STOPS:
        signal.signal(signum, _raise)
    if sys.unraisablehook is not _redeliver_swallowed:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _redeliver_swallowed
