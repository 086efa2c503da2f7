"""Test-only fault injection: MOE_AUTOTUNE_FAULT = oom@K | raise@K | hang@K | crash@K | slow@K:SECONDS.

K is the 0-based step, warm-up steps included. oom raises a real torch.OutOfMemoryError inside the step
(reported as status oom), raise a RuntimeError (status error, failure class error), hang sleeps forever, crash
SIGKILLs the process, slow sleeps SECONDS in every step >= K. MOE_AUTOTUNE_FAULT_RANK=R limits the fault to
global rank R (default: every rank).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

ENV = "MOE_AUTOTUNE_FAULT"
RANK_ENV = "MOE_AUTOTUNE_FAULT_RANK"
KINDS = ("oom", "raise", "hang", "crash", "slow")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    seconds: float = 0.0
    rank: int | None = None

    def fire(self, step: int, rank: int) -> None:
        """Call inside each training step (forward pass of the first microbatch)."""
        if self.rank is not None and rank != self.rank:
            return
        if self.kind == "slow" and step >= self.step:
            time.sleep(self.seconds)
        if step != self.step:
            return
        if self.kind == "oom":
            import torch

            raise torch.OutOfMemoryError(f"injected by {ENV}={self.kind}@{self.step} on rank {rank}")
        if self.kind == "raise":
            raise RuntimeError(f"injected by {ENV}={self.kind}@{self.step} on rank {rank}")
        if self.kind == "hang":
            while True:
                time.sleep(3600)
        if self.kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)


def parse(text: str | None, rank_text: str | None = None) -> Fault | None:
    if not text:
        return None
    kind, sep, rest = text.partition("@")
    step_text, _, seconds_text = rest.partition(":")
    if not sep or kind not in KINDS or not step_text.isdigit() or (kind == "slow") != bool(seconds_text):
        raise ValueError(f"{ENV}={text!r}: expected oom@K, raise@K, hang@K, crash@K or slow@K:SECONDS")
    return Fault(kind, int(step_text), float(seconds_text or 0), int(rank_text) if rank_text else None)


def from_env() -> Fault | None:
    return parse(os.environ.get(ENV), os.environ.get(RANK_ENV))
