"""The software a calibration was measured with, and the one line that says when this environment runs another.

Kernels and containers move the figures (the seed: more so from 128K up), so a calibration file records the
versions its measurements ran (`Calibration.software`: torch, Megatron-Core, Transformer Engine, CUDA and NCCL as
the trainer reports them, or the name of a container for published rows); `load_calibration` compares them with
what is installed here and prints one warning line on stderr when they differ. Nothing imports torch to read a
version: the distributions' metadata (importlib.metadata) answer.
"""

from __future__ import annotations

import sys
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Iterable

# what a calibration records and a mismatch reports: name -> the distributions that carry it (the first installed
# one counts; CUDA and NCCL as the wheels PyTorch depends on)
SOFTWARE_PACKAGES = {"torch": ("torch",), "megatron-core": ("megatron-core",),
                     "transformer-engine": ("transformer-engine", "transformer_engine", "transformer-engine-cu12"),
                     "cuda": ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime"),
                     "nccl": ("nvidia-nccl-cu12", "nvidia-nccl-cu13")}
# a recorded entry that names a container rather than a package (published rows): kept, never compared
CONTAINER = "container"
_ALIASES = {alias: name for name, dists in SOFTWARE_PACKAGES.items() for alias in (name, *dists)}


def installed_stack() -> dict[str, str]:
    """The versions of SOFTWARE_PACKAGES installed here (those installed)."""
    found = {}
    for name, dists in SOFTWARE_PACKAGES.items():
        for dist in dists:
            try:
                found[name] = version(dist)
                break
            except PackageNotFoundError:
                continue
    return found


def normalised(recorded: dict[str, Any]) -> dict[str, str]:
    """A recorded stack under SOFTWARE_PACKAGES' names (a distribution's name becomes the package's); entries
    that are neither a known package nor a container are left out."""
    out = {}
    for key, value in recorded.items():
        name = _ALIASES.get(key, key)
        if name in SOFTWARE_PACKAGES or name == CONTAINER:
            out[name] = str(value)
    return out


def measured_stack(measurements: Iterable[Any]) -> dict[str, str]:
    """The software most of the measurements ran (per package, its most common version); each measurement's
    `software` is a tuple of (package, version) pairs."""
    counts: dict[str, Counter] = {}
    for m in measurements:
        for name, ver in normalised(dict(m.software)).items():
            counts.setdefault(name, Counter())[ver] += 1
    return {name: c.most_common(1)[0][0] for name, c in sorted(counts.items())}


def stack_mismatch(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """'package recorded -> current' for each package both stacks name with different versions."""
    return [f"{k} {recorded[k]} -> {current[k]}" for k in sorted(recorded)
            if k != CONTAINER and k in current and recorded[k] != current[k]]


def warn_if_other_stack(where: str, recorded: Any, current: dict[str, str] | None = None) -> str | None:
    """One line on stderr when a calibration (`where` names it) was measured with other software than this
    environment's; returns the line (None: the same stack, or nothing comparable recorded)."""
    if not isinstance(recorded, dict) or not recorded:
        return None
    diff = stack_mismatch(normalised(recorded), installed_stack() if current is None else current)
    if not diff:
        return None
    line = f"warning: {where} was measured with other software ({'; '.join(diff)}): its constants may not hold here"
    print(line, file=sys.stderr)
    return line


__all__ = ["SOFTWARE_PACKAGES", "installed_stack", "measured_stack", "normalised", "stack_mismatch",
           "warn_if_other_stack"]
