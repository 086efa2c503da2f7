"""Placement of the model's pieces on pipeline stages (PP x VPP virtual stages).

Units (`Unit`): the embedding (E), a decoder layer (t), an MTP layer (m), the final norm, output layer and
loss (L); the letters are Megatron's pipeline_model_parallel_layout alphabet.
Three placements, tried in Megatron's order:
1. even: decoder layers divide over PP*VPP and there is no MTP: E on the first stage, L (and nothing else) on
   the last, not counted as layers (Megatron's default).
2. counted: (no MTP) layers + 2 divide over PP*VPP: the embedding and the loss each count as a layer
   (account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split), e.g. Qwen3-235B 94 layers
   on PP4 x VPP12.
3. explicit: a balanced pipeline_model_parallel_layout string (e.g. DeepSeek-V3's `Et*3|(tt|)*29m|L`),
   every virtual stage non-empty.
Virtual stage v lives on pipeline rank v % PP (interleaved schedule), as in Megatron.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

from search_spaces.catalog.models import ModelSpec


class Unit(NamedTuple):
    """One piece of the model on a pipeline stage.

    `layer` numbers decoder and MTP layers in one sequence (MTP layer j is layer num_layers + j), the index
    the model's per-layer questions (`layer_is_moe`, `attention_kind`) take; -1 for E and L.
    """
    kind: str  # "E" embedding | "t" decoder layer | "m" MTP layer | "L" final norm, output layer and loss
    layer: int = -1

    @property
    def is_layer(self) -> bool:
        """A transformer layer (decoder or MTP), the pieces that hold attention and an MLP/MoE."""
        return self.kind in ("t", "m")

    @property
    def is_mtp(self) -> bool:
        return self.kind == "m"

    def __str__(self) -> str:
        return self.kind if self.layer < 0 else f"{self.kind}{self.layer}"


EMBEDDING = Unit("E")
LOSS = Unit("L")


def model_units(num_layers: int, mtp_layers: int) -> list[Unit]:
    """Every piece of the model in pipeline order."""
    return ([EMBEDDING] + [Unit("t", i) for i in range(num_layers)]
            + [Unit("m", num_layers + j) for j in range(mtp_layers)] + [LOSS])


@dataclass(frozen=True)
class Placement:
    pp: int
    vpp: int
    method: str  # even | counted | explicit
    stages: tuple[tuple[Unit, ...], ...]  # per virtual stage, in pipeline order

    def rank_stages(self, rank: int) -> list[tuple[Unit, ...]]:
        """The VPP model chunks held by pipeline rank `rank`."""
        return [self.stages[c * self.pp + rank] for c in range(self.vpp)]

    def rank_units(self, rank: int) -> tuple[Unit, ...]:
        """Every unit pipeline rank `rank` holds, chunk after chunk (one tuple per rank, kept: the cost model's
        memoised terms know a rank's units by this object)."""
        kept = self.__dict__.setdefault("_rank_units", {})  # not a field: frozen, compared by its stages
        if rank not in kept:
            kept[rank] = tuple(u for stage in self.rank_stages(rank) for u in stage)
        return kept[rank]

    def layout_string(self) -> str:
        """Megatron's pipeline_model_parallel_layout syntax (E, t, m, L; '|' between virtual stages)."""
        return self._layout_string

    @cached_property
    def _layout_string(self) -> str:
        return "|".join("".join(u.kind for u in stage) for stage in self.stages)


def _split(units: list[Unit], stages: int) -> list[tuple[Unit, ...]]:
    """Contiguous split into `stages` parts of (nearly) equal unit counts."""
    n = len(units)
    base, extra = divmod(n, stages)
    sizes = [base + (1 if i < extra else 0) for i in range(stages)]
    out, pos = [], 0
    for size in sizes:
        out.append(tuple(units[pos:pos + size]))
        pos += size
    return out


# Weights for balancing an explicit layout: the embedding is a lookup, an MTP block and the loss each carry
# a vocabulary-sized projection (Bridge's DeepSeek-V3 layout gives m and L a stage of their own).
_WEIGHT = {"E": 0.5, "t": 1.0, "m": 2.0, "L": 2.0}


def _balanced_split(units: list[Unit], stages: int) -> list[tuple[Unit, ...]]:
    """Contiguous split into exactly `stages` non-empty parts minimising the heaviest part (dynamic program)."""
    n = len(units)
    prefix = [0.0]
    for u in units:
        prefix.append(prefix[-1] + _WEIGHT[u.kind])
    inf = float("inf")
    # best[k][i]: heaviest part when the first i units fill k stages; cut[k][i]: where the k-th stage starts
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        row = best[k - 1]
        for i in range(k, n - (stages - k) + 1):
            best[k][i], cut[k][i] = _best_cut(row, prefix, k - 1, i)
    parts, i = [], n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        parts.append(tuple(units[j:i]))
        i = j
    return parts[::-1]


def _best_cut(row: list[float], prefix: list[float], lo: int, i: int) -> tuple[float, int]:
    """The first j in [lo, i) minimising max(row[j], prefix[i] - prefix[j]), and that minimum. row (the heaviest
    part of the first j units in k-1 stages) never falls as j grows and the last part's weight always falls, so the
    minimum sits where they cross: a binary search for the first j whose row reaches the last part, then the
    better of it and the one before (the earlier on a tie, as a scan from lo finds). O(log n), not O(n): `estimate`
    walks these splits for every PP x VPP of the space (issue 33's 0.5 s)."""
    a, b = lo, i  # the first j in [lo, i) with row[j] >= prefix[i] - prefix[j]; i when there is none
    while a < b:
        mid = (a + b) // 2
        if row[mid] >= prefix[i] - prefix[mid]:
            b = mid
        else:
            a = mid + 1
    if a == lo:
        return max(row[lo], prefix[i] - prefix[lo]), lo
    before = prefix[i] - prefix[a - 1]  # row[a - 1] is below it
    if a == i or before <= row[a]:
        return before, a - 1
    return row[a], a


@lru_cache(maxsize=4096)
def _placement(num_layers: int, mtp: int, pp: int, vpp: int) -> Placement | None:
    stages = pp * vpp
    units = model_units(num_layers, mtp)
    if mtp == 0 and num_layers % stages == 0:
        per = num_layers // stages
        layers = units[1:-1]
        parts = [tuple(layers[i * per:(i + 1) * per]) for i in range(stages)]
        parts[0] = (EMBEDDING,) + parts[0]
        parts[-1] = parts[-1] + (LOSS,)
        return Placement(pp, vpp, "even", tuple(parts))
    if len(units) < stages:
        return None
    if len(units) % stages == 0 and mtp == 0:
        return Placement(pp, vpp, "counted", tuple(_split(units, stages)))
    return Placement(pp, vpp, "explicit", tuple(_balanced_split(units, stages)))


def placement(model: ModelSpec, pp: int, vpp: int) -> Placement | None:
    """How the model sits on PP x VPP stages; None when there are fewer pieces than virtual stages."""
    return _placement(model.num_layers, model.mtp_layers, pp, vpp)


# Megatron-Core's fields that place layers on pipeline stages, at their defaults (an even split).
SPLIT_DEFAULTS = {"pipeline_model_parallel_layout": None, "account_for_embedding_in_pipeline_split": False,
                  "account_for_loss_in_pipeline_split": False}


def megatron_split_fields(model: ModelSpec, pp: int, vpp: int) -> dict[str, Any]:
    """The layer placement the cost model assumes, in Megatron-Core's TransformerConfig terms (every field of
    SPLIT_DEFAULTS, set): an even split, the embedding and loss counted as layers, or an explicit
    pipeline_model_parallel_layout. The trainer and every export read it."""
    place = placement(model, pp, vpp)
    fields: dict[str, Any] = dict(SPLIT_DEFAULTS)
    if place is not None and place.method == "counted":
        fields.update(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    elif place is not None and place.method == "explicit":
        fields["pipeline_model_parallel_layout"] = place.layout_string()
    return fields
