"""The trainer's layout-coverage matrix: which layouts the real CPU trainer is proven to run, and what each proves.

Every pair of parallel dimensions the rules allow on tiny-moe (TP, CP, EP, ETP, PP, VPP, DP; sequence parallelism
wherever TP > 1, as Megatron-Core requires for MoE), the seed recipes' triples scaled down to four ranks
(CP×PP×EP, CP×PP×VPP, TP×CP×EP), the pairs that touch what each other layer family changes (MLA, gated
delta-net, sliding window with sinks: CP and TP for its attention, EP and PP for its MoE layers) and packed
documents on the CP cells. tests/trainers/test_layout_matrix.py runs them all (four ranks, one set of processes:
trainers/cells.py) and checks, for each cell: status ok, the loss falls, what Megatron applied equals the layout;
where the layout differs from another only by TP and CP (which keep the initialisation), the two losses are equal.
docs/trainer.md shows this table (docs/gen_pages.py renders it from `MATRIX`).

Pure Python (no torch): the docs build and the tests read it.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from search_spaces.layouts.layout import PARALLEL_SIZES, Layout

RANKS = 4
# Per model: sequence length (tiny-moe 64; the families 128: two delta-net chunks, four 32-token windows, so CP
# chunks cross both), one microbatch of one sequence, four microbatches a step (two per DP rank at DP 2)
SEQ_LEN = {"tiny-moe": 64, "tiny-mla-moe": 128, "tiny-qwen3-next": 128, "tiny-gpt-oss": 128}
BATCH = {"mbs": 1, "gbs": 4}
INIT_KEEPING = ("tp", "cp")  # split the same full-size weights (CPU initialisation), so the model is the same
# Documents of three lengths (how many of each) packed into each sequence (THD); each is padded to a multiple of
# 2*CP (and TP)
PACKED_LENGTHS, PACKED_COUNTS = [5, 13, 30], [3, 2, 1]


@dataclass(frozen=True)
class Cell:
    """One layout of the matrix on RANKS ranks."""

    name: str
    """Unique: the dimensions above 1, e.g. `cp2_pp2`."""
    model: str
    """A catalog model (tiny-*)."""
    dims: tuple[tuple[str, int], ...]
    """The parallel sizes (and `vpp`) that differ from 1; DP is what the ranks leave."""
    covers: str
    """What the cell is there for: the pair, triple or family feature it proves."""
    packed: bool = False
    """Documents packed into each sequence (THD, PACKED_LENGTHS), not one document per sequence."""

    @property
    def seq_len(self) -> int:
        return SEQ_LEN[self.model]

    def layout(self) -> Layout:
        return Layout.from_params({**{k: str(v) for k, v in BATCH.items()}, "precision": "fp32",
                                   **{k: str(v) for k, v in self.dims}})

    @property
    def dp(self) -> int:
        return self.layout().dp(RANKS)

    def reference(self) -> Cell | None:
        """The same layout with TP and CP folded into DP: the same model, data and initialisation, so the same
        loss (None where the cell has neither, and for packed documents, which are padded by CP and TP)."""
        kept = tuple((k, v) for k, v in self.dims if k not in INIT_KEEPING)
        if kept == self.dims or self.packed:  # packing pads each document to 2*CP (and TP): other data, other loss
            return None
        return Cell(_name(self.model, kept, self.packed), self.model, kept, f"reference of {self.name}", self.packed)

    def flags(self) -> list[str]:
        flags = ["--model", self.model, "--seq-len", str(self.seq_len)]
        for key, value in (*BATCH.items(), *self.dims):
            flags += [f"--{key}", str(value)]
        return flags


_FAMILIES = {"tiny-mla-moe": "MLA (latent attention, a dense first layer, a shared expert)",
             "tiny-qwen3-next": "gated delta-net layers between gated full attention, a gated shared expert",
             "tiny-gpt-oss": "sliding-window layers, attention sinks, linear biases"}


def _family_prefix(model: str) -> str:
    return "" if model == "tiny-moe" else model.removeprefix("tiny-").replace("-", "_") + "_"


def _name(model: str, dims: tuple[tuple[str, int], ...], packed: bool) -> str:
    """The family, the sizes above 1 (`dp4` where there are none), `_packed`: e.g. `gpt_oss_cp2_pp2`."""
    sizes = "_".join(f"{k}{v}" for k, v in dims) or f"dp{RANKS}"
    return _family_prefix(model) + sizes + ("_packed" if packed else "")


def _cell(model: str, covers: str, dims: dict[str, int], packed: bool = False) -> Cell:
    items = tuple(sorted(dims.items(), key=lambda kv: PARALLEL_SIZES.index(kv[0])))
    return Cell(_name(model, items, packed), model, items, covers, packed)


def _pairs() -> list[Cell]:
    """tiny-moe on four ranks: each pair of dimensions at size 2 (DP takes the ranks left; VPP needs PP)."""
    m, cells = "tiny-moe", []
    sizes = [k for k in PARALLEL_SIZES if k != "vpp"]
    for a, b in itertools.combinations(sizes, 2):
        cells.append(_cell(m, f"{a.upper()} × {b.upper()}", {a: 2, b: 2}))
    for a in sizes:  # with DP 2 (EP and ETP: over DP 4)
        cells.append(_cell(m, f"{a.upper()} × DP", {a: 2}))
    for a in (k for k in sizes if k != "pp"):  # every other size beside PP 2 with its VPP 2
        cells.append(_cell(m, f"{a.upper()} × VPP (PP 2)", {a: 2, "pp": 2, "vpp": 2}))
    cells.append(_cell(m, "PP × VPP × DP", dict(pp=2, vpp=2)))
    return cells


def _triples() -> list[Cell]:
    """The seed recipes' triples (DeepSeek-V3 and Qwen3-235B at 128K-256K are CP × PP × EP), scaled down."""
    m = "tiny-moe"
    return [_cell(m, "CP × PP × EP (EP folded over CP)", dict(cp=2, pp=2, ep=2)),
            _cell(m, "TP × CP × EP", dict(tp=2, cp=2, ep=2)),
            _cell(m, "TP × CP × ETP", dict(tp=2, cp=2, etp=2))]


def _families() -> list[Cell]:
    """Per layer family: CP and TP for its attention, EP and PP for its MoE layers, and their crossings."""
    cells = []
    for model, what in _FAMILIES.items():
        # tiny-qwen3-next's 2 key heads cannot split over TP*CP = 4 (rule linear_heads_cp): TP and CP apart only
        if model != "tiny-qwen3-next":
            cells.append(_cell(model, f"{what}: TP × CP", dict(tp=2, cp=2)))
        cells += [_cell(model, f"{what}: CP × PP", dict(cp=2, pp=2)),
                  _cell(model, f"{what}: CP × EP", dict(cp=2, ep=2)),
                  _cell(model, f"{what}: EP × PP", dict(ep=2, pp=2)),
                  _cell(model, f"{what}: TP × EP", dict(tp=2, ep=2))]
    return cells


def _packed() -> list[Cell]:
    """Packed documents (THD) on the CP cells: each document's 2·CP chunks, attention inside documents only."""
    m = "tiny-moe"
    return [_cell(m, "packed documents: CP × PP", dict(cp=2, pp=2), packed=True),
            _cell(m, "packed documents: TP × CP", dict(tp=2, cp=2), packed=True),
            _cell(m, "packed documents: CP × EP", dict(cp=2, ep=2), packed=True),
            _cell(m, "packed documents: CP × DP", dict(cp=2), packed=True)]


MATRIX: tuple[Cell, ...] = (*_pairs(), *_triples(), *_families(), *_packed())


def with_references(cells: tuple[Cell, ...] = MATRIX) -> list[Cell]:
    """The cells and, after them, each reference layout that is not a cell itself."""
    names = {c.name for c in cells}
    extra: dict[str, Cell] = {}
    for cell in cells:
        ref = cell.reference()
        if ref is not None and ref.name not in names:
            extra.setdefault(ref.name, ref)
    return [*cells, *extra.values()]


def applied_expectation(cell: Cell) -> dict[str, int | bool]:
    """What Megatron must report applied for the cell (trainers/run.py `_applied`)."""
    layout = cell.layout()
    expect: dict[str, int | bool] = {k: getattr(layout, k) for k in PARALLEL_SIZES}
    expect["dp"] = layout.dp(RANKS)
    expect["sequence_parallel"] = layout.tp > 1
    return expect


def markdown_table(cells: tuple[Cell, ...] = MATRIX) -> str:
    """The matrix as the docs show it: each cell, what it covers and what its run proves."""
    rows = ["| cell | model | layout (4 ranks) | covers | proves |", "|---|---|---|---|---|"]
    for cell in cells:
        e = applied_expectation(cell)
        layout = " ".join(f"{k.upper()}{e[k]}" for k in (*PARALLEL_SIZES, "dp") if e[k] > 1)
        ref = cell.reference()
        proves = "ok, loss falls, applied = layout" + (", SP on" if e["sequence_parallel"] else "")
        if ref is not None:
            proves += f"; loss = `{ref.name}`'s"
        rows.append(f"| `{cell.name}` | {cell.model} | {layout}{' (packed)' if cell.packed else ''} | {cell.covers} "
                    f"| {proves} |")
    return "\n".join(rows)


def drawn(seed: int, per_model: int) -> list[tuple[str, str, Layout]]:
    """Layouts drawn from the sweep's own space (every legal layout of `candidate_layouts` on RANKS CPU ranks) for
    each tiny model: `per_model` distinct parallel grids, one layout of each (its batch, precision, recompute and
    dispatcher drawn too), reproducibly from `seed`. (name, model, layout) each."""
    from search_spaces.layouts.space import candidate_layouts

    out = []
    for model, seq_len in SEQ_LEN.items():
        by_grid: dict[tuple, list[Layout]] = {}
        for layout in candidate_layouts(model, "cpu", RANKS, seq_len):
            grid = tuple(getattr(layout, k) for k in PARALLEL_SIZES)
            by_grid.setdefault(grid, []).append(layout)
        rng = random.Random(f"{seed}:{model}")
        for index, grid in enumerate(rng.sample(sorted(by_grid), min(per_model, len(by_grid)))):
            out.append((f"drawn_{_family_prefix(model) or 'moe_'}{index}", model, rng.choice(by_grid[grid])))
    return out
