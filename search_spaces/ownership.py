"""Who owns a trial's processes: every process a trial starts carries its mark, and none outlives what started it.

- `MOE_AUTOTUNE_TRIAL=<study>/<number>`, in the environment of every process of a trial (the launcher, its ranks):
  what finds them (`grep -l MOE_AUTOTUNE_TRIAL=sweep/3 /proc/*/environ`, psutil's `Process.environ()`).
- `MOE_AUTOTUNE_LAUNCH=<id>`: one node's launch of it (one attempt; a retried trial's second attempt has another id):
  once that node's launcher has ended, the backend kills whatever still carries the id
  (orchestrator/dispatch/trainer_process.py).
- Linux's parent-death signal (`PR_SET_PDEATHSIG`, SIGKILL): the launcher dies with the Ray worker that started it
  (asked for in the child before exec), and each rank with its launcher (the trainer asks for it on itself first
  thing: torchrun starts each rank in a session of its own, out of reach of a kill of the launcher's group, so a
  `kill -9` of torchrun used to leave its ranks running, GPU memory held, beside the next trials).

Pure Python (ctypes and /proc): the trainer and the orchestrator both use it; nothing here imports torch or Ray.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Callable

TRIAL_ENV = "MOE_AUTOTUNE_TRIAL"
LAUNCH_ENV = "MOE_AUTOTUNE_LAUNCH"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun in each rank it starts


def parent_death_request() -> Callable[[], bool] | None:
    """A call that asks the kernel to SIGKILL the calling process when its parent dies (True once asked); None where
    that cannot be asked for (not Linux's libc). Looked up before a fork: the child only calls it (no dlopen there)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def request() -> bool:
        return prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0

    return request


def launch_of(pid: int) -> str | None:
    """The launch id in process `pid`'s environment (None: none, gone, or not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return None
    prefix = f"{LAUNCH_ENV}=".encode()
    return next((e[len(prefix):].decode(errors="replace") for e in entries if e.startswith(prefix)), None)


def die_with_launcher() -> None:
    """Called by a trainer rank before anything else: a rank that torchrun started for a trial is SIGKILLed when its
    launcher dies. A launcher that died before the request took effect (the rank already an orphan, its parent now
    init or a subreaper, which carry no launch id) ends the rank here. Nothing for a run by hand (no launch id) or
    without torchrun (`launcher: python`: the trainer is the launcher, and the backend asked for the signal in it)."""
    launch = os.environ.get(LAUNCH_ENV)
    if not launch or _TORCHRUN_ENV not in os.environ:
        return
    request = parent_death_request()
    if request is None or not request():
        return
    if launch_of(os.getppid()) != launch:
        os.kill(os.getpid(), signal.SIGKILL)
