"""Backends turn a TrialRequest into a TrialResult: local (real trainer via Ray), analytic (cost model),
replay (a recorded table). A backend is handed what it needs; it knows nothing of Optuna or MLflow."""

from __future__ import annotations

from orchestrator.backends.base import Backend, TrialRequest

__all__ = ["Backend", "TrialRequest", "make_backend"]


def make_backend(spec, prior) -> Backend:
    """The backend of `spec.backend`; the analytic one measures with `prior.predict` (the sweep's cached
    cost model)."""
    if spec.backend == "analytic":
        from orchestrator.backends.analytic import AnalyticBackend
        return AnalyticBackend(lambda layout: prior.predict(layout).data)
    if spec.backend == "local":
        from orchestrator.backends.local import LocalRayBackend
        return LocalRayBackend(spec)
    if spec.backend == "replay":
        from orchestrator.backends.replay import ReplayBackend
        return ReplayBackend.from_spec(spec)
    from search_spaces.errors import SpecError
    raise SpecError(f"unknown backend {spec.backend!r}; allowed: local, analytic, replay")
