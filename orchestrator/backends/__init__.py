"""Backends turn a TrialRequest into a TrialResult: local (real trainer via Ray), analytic (cost model)."""

from __future__ import annotations

from orchestrator.backends.base import Backend, TrialRequest

__all__ = ["Backend", "TrialRequest", "make_backend"]


def make_backend(spec, prior) -> Backend:
    if spec.backend == "analytic":
        from orchestrator.backends.analytic import AnalyticBackend
        return AnalyticBackend(prior)
    if spec.backend == "local":
        from orchestrator.backends.local import LocalRayBackend
        return LocalRayBackend(spec)
    from search_spaces.errors import SpecError
    raise SpecError(f"backend {spec.backend!r} is not available yet; allowed: local, analytic")
