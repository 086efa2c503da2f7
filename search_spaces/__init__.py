"""Models, hardware, the layout space and the cost model. Pure Python: no torch, no orchestrator."""

from search_spaces.errors import SpecError
from search_spaces.layout import Layout

__all__ = ["Layout", "SpecError"]
