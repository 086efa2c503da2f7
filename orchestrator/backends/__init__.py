"""Backends turn a TrialRequest into a TrialResult: local (real trainer via Ray), analytic (cost model),
replay (a recorded table)."""

from __future__ import annotations

from orchestrator.backends.base import Backend, TrialRequest

__all__ = ["Backend", "TrialRequest", "make_backend", "make_prior"]


def make_prior(spec):
    """The prior a sweep of `spec` uses: the cost model, cut down to the table for replay."""
    if spec.backend == "replay":
        from orchestrator.backends.replay import ReplayPrior
        return ReplayPrior(spec)
    from orchestrator.prior import Prior
    return Prior(spec)


def make_backend(spec, prior) -> Backend:
    if spec.backend == "analytic":
        from orchestrator.backends.analytic import AnalyticBackend
        return AnalyticBackend(prior)
    if spec.backend == "local":
        from orchestrator.backends.local import LocalRayBackend
        return LocalRayBackend(spec)
    if spec.backend == "replay":
        from orchestrator.backends.replay import ReplayBackend
        return ReplayBackend.from_spec(spec)
    from search_spaces.errors import SpecError
    raise SpecError(f"unknown backend {spec.backend!r}; allowed: local, analytic, replay")
