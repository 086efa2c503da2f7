"""Why a space holds no answer, in one line: the rule(s) that emptied it, or the memory nothing fits in.

The space is enumerated level by level (search_spaces/layouts/space.py, rules.LEVELS: pipe, tp, cp, ep, mbs, then the
features), and each combination is counted against the first rule that refuses it. The counts alone mislead: the
outer levels are checked first, so their rules count the most whatever the cause. When nothing is legal, the rules of
the deepest level that refused anything refused *every* combination the other levels let through: those are the
rules that emptied the space (250 GPUs: `global_batch`, the batch that no data-parallel size of 250 divides), and the
line names them first, with why each exists, then every count.
"""

from __future__ import annotations

from search_spaces.layouts.rules import LEVELS, REGISTRY
from search_spaces.layouts.space import Exploration

_DEPTH: dict[str | None, int] = {**{level: i for i, level in enumerate(LEVELS)}, None: len(LEVELS)}  # features: last
_RULES = {r.name: r for r in REGISTRY}


def binding_rules(rejected_by_rule: dict[str, int]) -> list[str]:
    """Of a space with no legal layout, the rules that refused every combination the other levels let through
    (those of the deepest level that refused any), most refusals first."""
    counted = {rule: n for rule, n in rejected_by_rule.items() if n > 0}
    if not counted:
        return []
    depth = {rule: _DEPTH[_RULES[rule].level] if rule in _RULES else len(LEVELS) for rule in counted}
    deepest = max(depth.values())
    return sorted((r for r in counted if depth[r] == deepest), key=lambda r: -counted[r])


def why_empty(found: Exploration, where: str, memory_gib: float, max_grids: int | None = None) -> str | None:
    """The one line that says why `found` lists no layout (None when it lists one): no legal layout (naming the
    rules that emptied the space), none that fits `memory_gib` per GPU, or none found within the search's limits
    (`--budget`, `--max-grids`). `where`: the situation, in words."""
    if found.top:
        return None
    if found.legal_count == 0:
        return _no_legal(found, where)
    estimated = f"among the layouts of the first {found.grids_ranked:,} of {found.grids:,} parallel grids"
    if found.cut_short:
        return (f"no layout of {where} found to fit {estimated}: --budget ran out first (raise --budget; "
                f"{found.legal_count:,} layouts are legal)")
    if max_grids is not None and found.grids_ranked >= max_grids and found.grids > max_grids:
        return (f"no layout of {where} found to fit {estimated} (raise --max-grids; {found.legal_count:,} layouts "
                "are legal)")
    return (f"nothing fits in memory: none of the {found.legal_count:,} legal layouts of {where} fits the "
            f"{memory_gib:g} GiB per GPU (memory binds; try more GPUs, a shorter sequence, or free "
            "recompute/offload/precision)")


def _no_legal(found: Exploration, where: str) -> str:
    binding = binding_rules(found.rejected_by_rule)
    named = "; ".join(f"{rule} ({_RULES[rule].why})" if rule in _RULES else rule for rule in binding)
    counts = ", ".join(f"{rule} {n:,}" for rule, n in sorted(found.rejected_by_rule.items(), key=lambda kv: -kv[1]))
    return (f"no legal layout of {where}: every layout the other rules allow breaks {named or 'a rule'}; "
            f"rejected per rule (first rule broken) of {found.total:,} combinations: {counts or 'none'}")
