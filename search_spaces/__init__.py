"""Models, hardware, the layout space and the cost model. Pure Python: no torch, no orchestrator.

The parts live in subpackages: `catalog` (models, GPUs, software), `layouts` (the Layout, its dimensions and
rules, the space, the rules of thumb), `cost` (the cost model, one module per mechanism) and `calibration` (its
constants, the published rows, the fit); the records that cross stages (`result`, `errors`) and the input rules
(`inputs`, `bounded`) stay at the top.

This module is the stable way in: `from search_spaces import estimate, Layout, load_model` keeps working however
the modules move. Names are imported on first use (a name table, like Ray Tune's searcher table), so importing one
part does not load the others.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_NAMES: dict[str, str] = {
    # catalog
    "ModelSpec": "catalog.models", "load_model": "catalog.models", "MODEL_NAMES": "catalog.models",
    "GPUSpec": "catalog.hardware", "load_gpu": "catalog.hardware", "GPUS": "catalog.hardware",
    "GPU_NAMES": "catalog.hardware",
    # layouts
    "Layout": "layouts.layout", "Dimension": "layouts.dimensions", "dimensions_of": "layouts.dimensions",
    "Rule": "layouts.rules", "Violation": "layouts.rules", "check_rules": "layouts.rules",
    "RULE_REGISTRY": "layouts.rules", "seed_layouts": "layouts.heuristics", "explore": "layouts.space",
    "count_space": "layouts.space", "candidate_layouts": "layouts.space",
    # cost model
    "Estimate": "cost.costmodel", "estimate": "cost.costmodel", "MemoryBreakdown": "cost.breakdown",
    "StepTime": "cost.breakdown", "derive_proxy": "proxy", "compose": "proxy",
    # calibration
    "Calibration": "calibration.calibration_file", "load_calibration": "calibration.calibration_file",
    "Measurement": "calibration.fit",
    # records and errors
    "TrialResult": "result", "MoeAutotuneError": "errors", "SpecError": "errors",
}
# names whose attribute in their module is spelled differently
_ATTRIBUTE = {"check_rules": "check", "RULE_REGISTRY": "REGISTRY"}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'search_spaces' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"search_spaces.{_NAMES[name]}"), _ATTRIBUTE.get(name, name))
    globals()[name] = value  # once looked up, an ordinary module attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES])
