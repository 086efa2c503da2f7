"""The explicit pipeline split (search_spaces/cost/pipeline.py `_balanced_split`) is the dynamic program's answer:
its binary search over each stage's start finds what a scan of every start finds, the earlier start on a tie (the
split is exported as Megatron-Core's pipeline_model_parallel_layout, so the choice among equal splits matters)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from search_spaces.cost.pipeline import _WEIGHT, Unit, _balanced_split, model_units


def _scanned_split(units: list[Unit], stages: int) -> list[tuple[Unit, ...]]:
    """The reference: every start of every stage scanned, the first best kept (O(stages x n^2))."""
    n, prefix = len(units), [0.0]
    for u in units:
        prefix.append(prefix[-1] + _WEIGHT[u.kind])
    best = [[float("inf")] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    parts, i = [], n
    for k in range(stages, 0, -1):
        parts.append(tuple(units[cut[k][i]:i]))
        i = cut[k][i]
    return parts[::-1]


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(st.sampled_from(sorted(_WEIGHT)), min_size=1, max_size=48), data=st.data())
def test_the_split_is_the_scanned_dynamic_programs(kinds, data):
    units = [Unit(kind, index) for index, kind in enumerate(kinds)]
    stages = data.draw(st.integers(1, len(units)))
    assert _balanced_split(units, stages) == _scanned_split(units, stages)


def test_the_split_of_real_models_is_the_scanned_one():
    """Layer counts of the catalog's models and their neighbours, with and without MTP, at every stage count."""
    for layers in (26, 27, 36, 48, 61, 62, 94):
        for mtp in (0, 1):
            units = model_units(layers, mtp)
            for stages in range(1, len(units) + 1, 3):
                assert _balanced_split(units, stages) == _scanned_split(units, stages), (layers, mtp, stages)
