"""The backend interface: a TrialRequest in, a TrialResult out (as a concurrent.futures.Future).

Backends know nothing of Optuna or MLflow. A new backend (replay, Slurm, ...) is one module with a class
implementing `submit` (and `close` when it holds resources).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from search_spaces.layouts.layout import Layout
from search_spaces.result import TrialResult

from orchestrator.dispatch.steps import StepFeed


@dataclass(frozen=True)
class TrialRequest:
    layout: Layout
    model: str
    seq_len: int
    gpu: str
    num_gpus: int
    nodes: int
    gpus_per_node: int
    steps: int
    warmup: int
    timeout_s: float
    workdir: Path
    num_layers: int | None = None
    hidden_size: int | None = None
    trial_number: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    lengths: str | None = None  # packed documents: the document-length histogram the trainer draws from
    # the rules the trainer applies itself (search_spaces/stopping.py; None: off): measured enough, will not fit
    stop_within: float | None = None
    min_measured: int = 3
    memory_limit_gib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layout"] = self.layout.to_dict()
        d["workdir"] = str(self.workdir)
        return d


class Backend(Protocol):
    name: str

    def submit(self, request: TrialRequest) -> "concurrent.futures.Future[TrialResult]":
        """Start the trial; the future resolves to its TrialResult (never raises for trial failures)."""

    def close(self) -> None:
        """Release what the backend holds (Ray, threads); running trials are stopped. Called again, nothing."""


def submit(backend: Backend, request: TrialRequest,
           feed: StepFeed | None) -> "concurrent.futures.Future[TrialResult]":
    """Start the trial on `backend`; one whose trials report their steps (`reports_steps`: LocalRayBackend) feeds
    them to `feed` and is stopped through it (orchestrator/dispatch/steps.py)."""
    if feed is not None and getattr(backend, "reports_steps", False):
        return backend.submit(request, feed)  # type: ignore[call-arg]
    return backend.submit(request)


def unplaceable(backend: Backend | None, nodes: int, gpus_per_node: int) -> str | None:
    """Why `backend` can never place a trial of `nodes` x `gpus_per_node` (a backend that places trials on a
    cluster has `unplaceable(nodes, gpus_per_node)`: LocalRayBackend), or None."""
    check = getattr(backend, "unplaceable", None)
    return check(nodes, gpus_per_node) if check is not None else None


def stop(backend: Backend) -> None:
    """Ask `backend` to stop its running trials now (one with `stop()`); `close` waits for them."""
    halt = getattr(backend, "stop", None)
    if halt is not None:
        halt()


def completed(result: TrialResult) -> "concurrent.futures.Future[TrialResult]":
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(result)
    return future


def stamp(result: TrialResult, request: TrialRequest) -> TrialResult:
    """Fill the context fields a trainer may have left empty."""
    result.layout = result.layout or request.layout.to_dict()
    result.model = result.model or request.model
    result.gpu = result.gpu or request.gpu
    result.num_gpus = result.num_gpus or request.num_gpus
    result.seq_len = result.seq_len or request.seq_len
    return result
