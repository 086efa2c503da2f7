"""What switching each knob of a layout to its neighbours would change: the "why" a user asks before spending GPU
time on a layout (`moe-autotune estimate` prints it, and `--json` carries it under "neighbours").

A knob is a searched dimension (layout.SEARCH_DIMENSIONS, hierarchical_cp with cp_comm_type); its neighbours are the
values beside the layout's among those the space proposes (space.dimensions; a parallel size only where some legal
grid of the space has it, `proposed_sizes`: the next smaller and next larger sizes of TP, CP, EP, ETP, PP, VPP, MBS,
the adjacent recompute choices, every other precision, dispatcher, CP type, graph scope set, offload). The layout's
own value is never a neighbour. Everything else, the global batch included, stays; a neighbour the rules refuse with
the rest of the layout as it is is listed with the rule.
"""

from __future__ import annotations

from typing import Any

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.catalog.hardware import GPUSpec
from search_spaces.catalog.models import ModelSpec
from search_spaces.cost.costmodel import Estimate, estimate
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import BY_NAME, SEARCH_DIMENSIONS, Layout

# knobs whose values are ordered (sizes, fractions, recompute from light to heavy): their neighbours are adjacent
ORDERED_KINDS = ("int", "float", "recompute")


def _values(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout) -> dict[str, list]:
    from search_spaces.layouts.space import dimensions, hierarchical_options
    dims = dimensions(model, gpu, num_gpus, seq_len, gbs=layout.gbs)
    values = dict(dims.values)
    values.update(proposed_sizes(model, gpu, num_gpus, seq_len, dims))
    values["cp_comm_type"] = [kind for kind in values["cp_comm_type"] if kind != "a2a+p2p"] + \
        [("a2a+p2p", sizes) for sizes in hierarchical_options([layout.cp])]
    return values


def proposed_sizes(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, dims: Any) -> dict[str, list]:
    """The values each parallel-grid field (TP, CP, EP, ETP, PP, VPP, MBS) takes in the space's legal grids
    (space.iter_grids), in the space's order: what a sweep proposes. A raw value no legal grid has is never a
    neighbour: EP 5 and 10 of 160 experts on 256 GPUs (no ETP*EP*PP of them divides the world), PP 8 of 126
    layers on 576 GPUs."""
    from search_spaces.layouts.space import GRID_FIELDS, iter_grids

    seen: dict[str, set] = {name: set() for name in GRID_FIELDS}
    for grid in iter_grids(model, gpu, num_gpus, seq_len, dims):
        for name in GRID_FIELDS:
            seen[name].add(grid[name])
    return {name: [v for v in dims.values[name] if v in seen[name]] for name in GRID_FIELDS}


def _current(layout: Layout, name: str) -> Any:
    if name == "cp_comm_type" and layout.cp_comm_type == "a2a+p2p":
        return ("a2a+p2p", tuple(layout.hierarchical_cp))
    return getattr(layout, name)


def neighbour_values(values: list, current: Any, ordered: bool) -> list:
    """The values beside `current` in `values` (ordered knobs; a size not in the list takes its numeric place)
    or all the others (choice knobs, and an ordered knob whose value is not in a list it cannot be placed in)."""
    if ordered and current not in values and isinstance(current, (int, float)):
        values = sorted(set(values) | {current})
    if not ordered or current not in values:
        return [v for v in values if v != current]
    i = values.index(current)
    return [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values) and values[j] != current]


def _switch(layout: Layout, name: str, value: Any) -> Layout:
    if name == "cp_comm_type":
        kind, sizes = value if isinstance(value, tuple) else (value, ())
        return layout.replace(cp_comm_type=kind, hierarchical_cp=sizes)
    changed = layout.replace(**{name: value})
    if name == "cp" and layout.cp_comm_type == "a2a+p2p":  # the old hierarchy no longer multiplies to CP
        changed = changed.replace(cp_comm_type="p2p", hierarchical_cp=())
    return changed


def _shown(name: str, value: Any) -> str:
    """A knob's value as the neighbours print it."""
    if name == "cp_comm_type" and isinstance(value, tuple):
        return f"a2a+p2p [{value[1][0]},{value[1][1]}]"
    return str(BY_NAME[name].encode(value))


def _entry(name: str, value: Any, est: Estimate, base: Estimate) -> dict[str, Any]:
    out = {"knob": name, "value": _shown(name, value), "legal": est.legal, "fits": est.fits,
           "violations": [v.to_dict() for v in est.violations]}
    if est.legal:
        (tokens, peak), (base_tokens, base_peak) = _figures(est), _figures(base)
        out.update(tokens_per_sec_per_gpu=tokens, peak_memory_gib=peak,
                   delta_tokens_pct=100 * (tokens / base_tokens - 1), delta_peak_gib=peak - base_peak)
    return out


def _figures(est: Estimate) -> tuple[float, float]:
    """Tokens/s per GPU and peak memory of a legal estimate with time (the base must be one too)."""
    if est.tokens_per_sec_per_gpu is None or est.peak_memory_gib is None:
        raise ValueError("neighbours need the base's and each legal neighbour's figures (a legal base)")
    return est.tokens_per_sec_per_gpu, est.peak_memory_gib


def neighbours(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_len: int, layout: Layout, base: Estimate,
               cal: Calibration | None = None, packing: Any = None) -> list[dict[str, Any]]:
    """For each knob of `layout`, each neighbour value: legal, fits, tokens/s and peak memory, and their deltas
    against `base` (the layout's own estimate; it must be legal). `packing`: the packed documents' histogram
    (search_spaces/cost/packing.py) the base was estimated with."""
    values = _values(model, gpu, num_gpus, seq_len, layout)
    out = []
    for name in SEARCH_DIMENSIONS:
        if name == "hierarchical_cp" or (name == "cp_comm_type" and layout.cp == 1):
            continue
        current = _current(layout, name)
        if not [v for v in values.get(name, []) if v != current]:  # the space proposes no other value
            continue
        ordered = BY_NAME[name].kind in ORDERED_KINDS
        for value in neighbour_values(values[name], current, ordered):
            if _shown(name, value) == _shown(name, current):  # one spelling of the layout's own value
                continue
            try:
                switched = _switch(layout, name, value)
            except SpecError:  # no layout at all (MBS 2 of a global batch of 1): no neighbour to show
                continue
            est = estimate(model, gpu, num_gpus, seq_len, switched, cal=cal, packing=packing)
            out.append(_entry(name, value, est, base))
    return out


__all__ = ["neighbours", "neighbour_values", "proposed_sizes"]
