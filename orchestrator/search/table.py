"""The searches by name (`search:` in a spec, `sweep --search`), like Ray Tune's one table of searchers.

`SEARCH_KINDS` is the one table: the spec's `search` choices, the CLI help and the documentation's list derive
from it. A new search is one `SearchKind` below plus its maker in orchestrator/search/searches.py (the sampler
itself in orchestrator/search/samplers.py, with the loop's hooks, samplers.SweepSampler);
tests/orchestrator/test_conformance.py
runs it through the common contract at once, and fails if a name here has no maker there.

Names only: a spec names its search without loading the sweep, and nothing here imports it (the sweep imports
this table, never the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_SEARCH", "SEARCH_KINDS", "CHOICES_HELP", "SearchKind"]


@dataclass(frozen=True)
class SearchKind:
    name: str
    """The name a spec's `search:` and `sweep --search` take (and trials record as proposed_by)."""
    doc: str
    """What it proposes, in a few words (CLI help, documentation)."""


SEARCH_KINDS: dict[str, SearchKind] = {kind.name: kind for kind in (
    SearchKind("calibrated", "the cost model's ranking, corrected from every measurement (default)"),
    SearchKind("tpe", "Optuna's multivariate TPE over the dimensions"),
    SearchKind("random", "the legal layouts predicted to fit, in a seeded random order"),
    SearchKind("grid", "the legal layouts predicted to fit, in NeMo Auto-Configurator's loop order"),
)}
DEFAULT_SEARCH = next(iter(SEARCH_KINDS))


# `name (what it is) | ...`: the searches as help texts name them
CHOICES_HELP = " | ".join(f"{k.name} ({k.doc})" for k in SEARCH_KINDS.values())
