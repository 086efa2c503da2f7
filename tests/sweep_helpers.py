"""Test helpers for the sweep tests."""

from __future__ import annotations

from orchestrator.sweep import Prior


def real_space_available() -> bool:
    try:
        import search_spaces.costmodel  # noqa: F401
        import search_spaces.heuristics  # noqa: F401
        import search_spaces.space  # noqa: F401
        return True
    except ImportError:
        return False


def prior_for(spec) -> Prior:
    """The prior a sweep of `spec` uses (one place to swap in a stand-in if search_spaces breaks)."""
    return Prior(spec)
