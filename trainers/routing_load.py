"""What the MoE router did in a run: the routing Megatron-Core's config put in effect, and the token copies each
EP rank's experts processed (the cost model's `expert_load`, search_spaces/cost/routing.py, measured).

`RoutedCopies` counts, per MoE layer on this rank and while `active` (one warm-up step), the tokens its router
received and the rows its experts processed (token copies, padding included); `expert_load` sums them up over
the ranks: the busiest EP rank over the EP group's mean (1 under forced balance up to sampling, exactly 1 when
every expert is padded to capacity) and the copies processed per routed token copy (1 dropless, about F under
capacity:F).
"""

from __future__ import annotations

import statistics
from functools import partial

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import BY_NAME


def routing_in_effect(config) -> str:
    """The layout's spelling of the routing Megatron-Core's built config holds (after its own validation)."""
    dim = BY_NAME["routing"]
    fields = {name: getattr(config, name, None) for name in dim.megatron_field_names()}
    try:
        return dim.from_megatron(fields)
    except SpecError:  # reported as found, so validation names what was in effect instead of a layout value
        return "unrecognised: " + ", ".join(f"{k}={v!r}" for k, v in fields.items())


def _leading(args) -> int:
    """Rows of a module's first input that are tokens: every dimension but the hidden one."""
    tensor = args[0]
    return tensor.numel() // tensor.shape[-1] if tensor.dim() > 1 else tensor.shape[0]


class RoutedCopies:
    """Per MoE layer of this rank (in module order): tokens into the router, rows into the experts."""

    def __init__(self, chunks):
        from megatron.core.transformer.moe.moe_layer import MoELayer

        layers = [m for c in chunks for m in c.modules() if isinstance(m, MoELayer)]
        self.tokens = [0] * len(layers)
        self.rows = [0] * len(layers)
        self.active = False
        self._handles = []
        for index, layer in enumerate(layers):
            self._handles.append(layer.router.register_forward_pre_hook(partial(self._count, self.tokens, index)))
            self._handles.append(layer.experts.register_forward_pre_hook(partial(self._count, self.rows, index)))

    # a pre-hook returns None: a value would replace the module's inputs
    def _count(self, counts: list, index: int, module, args) -> None:
        if self.active and args:
            counts[index] += _leading(args)

    def remove(self) -> dict:
        """Detach the hooks; what was counted."""
        for handle in self._handles:
            handle.remove()
        return {"tokens": self.tokens, "rows": self.rows}


def expert_load(gathered: list[dict], topk: int, etp: int) -> dict | None:
    """From every rank's counts and EP group: the busiest EP rank's rows over its group's mean (averaged over the
    layers and groups) and the rows processed per routed copy (each copy is processed by ETP ranks)."""
    groups: dict[tuple, list[dict]] = {}
    for g in gathered:
        if g.get("routed") and g["routed"]["rows"]:
            groups.setdefault(tuple(g["expert_group"]), []).append(g["routed"])
    if not groups:
        return None
    busiest, rows, copies = [], 0, 0
    for members in groups.values():
        for layer in range(len(members[0]["rows"])):
            counts = [m["rows"][layer] for m in members]
            if sum(counts):
                busiest.append(max(counts) / statistics.mean(counts))
        rows += sum(sum(m["rows"]) for m in members)
        copies += sum(sum(m["tokens"]) for m in members) * topk * etp
    return {"busiest_over_mean": round(statistics.mean(busiest), 4) if busiest else None,
            "rows_per_routed_copy": round(rows / copies, 4) if copies else None}
