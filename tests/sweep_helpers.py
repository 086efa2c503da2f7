"""Test helpers for the sweep tests."""

from __future__ import annotations

from orchestrator.sweep import Prior


def prior_for(spec) -> Prior:
    """The prior a sweep of `spec` uses (one place to swap in a stand-in if search_spaces breaks)."""
    return Prior(spec)
