"""Backends turn a TrialRequest into a TrialResult. A backend is handed what it needs; it knows nothing of
Optuna or MLflow.

`BACKENDS` is the one table of backends by name (like Ray Tune's table of searchers): the spec's `backend`
choices, its aliases, the CLI help and the README's list derive from it. A new backend is one `BackendKind`
below plus its module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from search_spaces.errors import SpecError

from orchestrator.dispatch.base import Backend, TrialRequest, unplaceable
from orchestrator.errors import ClusterError

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "BackendKind", "TrialRequest", "canonical_backend",
           "CHOICES_HELP", "make_backend"]


@dataclass(frozen=True)
class BackendKind:
    name: str
    """The name a spec's `backend:` and `sweep --backend` take (and studies record)."""
    doc: str
    """What its trials are, in a few words (CLI help, README)."""
    make: Callable[[Any, Any], Backend]
    """(spec, prior) -> the backend; imports its module only when used (Ray only where trials run)."""
    what_if: bool = False
    """Its trials are predictions or recordings, not measurements of this cluster: rejected proposals outnumber
    its trials, so they are not tracked as MLflow runs by default, and it can size any cluster."""
    aliases: tuple[str, ...] = ()
    """Other names accepted for it (older spellings); studies recorded with them resume."""


def _ray(spec, prior) -> Backend:  # noqa: ARG001 -- the registry's common signature
    from orchestrator.dispatch.local import LocalRayBackend
    return LocalRayBackend(spec)


def _analytic(spec, prior) -> Backend:  # noqa: ARG001 -- the registry's common signature
    from orchestrator.dispatch.analytic import AnalyticBackend
    return AnalyticBackend(lambda layout: prior.predict(layout).data)  # the sweep's cached cost model


def _replay(spec, prior) -> Backend:  # noqa: ARG001 -- the registry's common signature
    from orchestrator.dispatch.replay import ReplayBackend
    return ReplayBackend.from_spec(spec)


BACKENDS: dict[str, BackendKind] = {kind.name: kind for kind in (
    BackendKind("ray", "the real trainer, one Ray task per trial (local Ray or a cluster)", _ray, aliases=("local",)),
    BackendKind("analytic", "the cost model as the measurement: what-if at any scale", _analytic, what_if=True),
    BackendKind("replay", "a recorded table (`status --csv`), to evaluate searches", _replay, what_if=True),
)}
DEFAULT_BACKEND = next(iter(BACKENDS))
_BY_ANY_NAME = {name: kind for kind in BACKENDS.values() for name in (kind.name, *kind.aliases)}


def canonical_backend(name: str) -> str:
    """The backend's own name for `name` (an alias is accepted), or a SpecError listing the choices."""
    kind = _BY_ANY_NAME.get(str(name).strip().lower())
    if kind is None:
        raise SpecError(f"unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
    return kind.name


# `name (what it is) | ...`: the backends as help texts name them
CHOICES_HELP = " | ".join(f"{k.name} ({k.doc}" + (f"; also {', '.join(k.aliases)}" if k.aliases else "") + ")"
                          for k in BACKENDS.values())


def make_backend(spec, prior) -> Backend:
    """The backend of `spec.backend`."""
    return BACKENDS[canonical_backend(spec.backend)].make(spec, prior)


def start(spec, prior) -> Backend:
    """The sweep's backend (Ray started for `ray`), refused when it cannot place even the smallest trial the sweep
    can ask for (a GPU spec on a Ray cluster without GPUs): one line naming what a trial asks for and what the
    cluster has, exit 2. Larger trials that it cannot place are refused one by one (the sweep loop)."""
    backend = make_backend(spec, prior)  # a local Ray cluster is checked before it starts (LocalRayBackend)
    reason = unplaceable(backend, *spec.smallest_trial)
    if reason:
        backend.close()
        raise ClusterError.no_trial(spec.name, reason)
    return backend
