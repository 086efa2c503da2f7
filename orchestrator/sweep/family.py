"""A length family in one sweep: `seq_len: [32768, 65536, 131072]` runs one sub-sweep per length, shortest first.

Each length is a study of its own (`<name>-<seq_len>`, the situation differs) in the family's MLflow
experiment. A length starts from the previous length's best layouts scaled by the rules of thumb (the
sequence per CP rank kept: CP grows with the length, DP gives way), then its own rules of thumb. The family
table is how the long-context recipes are published: per length the best layout, tokens/s, TF/s, peak
memory, and the TF/s trend against the shortest length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna

from search_spaces.layouts.layout import Layout, distinct

from orchestrator.records import NUMBER_COLUMNS, StudyRecord, TrialRecord, queries
from orchestrator.search.prior import make_prior
from orchestrator.spec.schema import SweepSpec
from orchestrator.storage import studies
from orchestrator.sweep.loop import SweepOutcome, run_sweep

CARRIED = 3  # best layouts of a length that seed the next one


@dataclass
class FamilyOutcome:
    outcomes: dict[int, SweepOutcome] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return max((o.exit_code for o in self.outcomes.values()), default=1)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return family_rows([o.study for o in self.outcomes.values()])


def run_family(spec: SweepSpec, resume: bool = False, show_progress: bool = True,
               run_tags: dict[str, str] | None = None) -> FamilyOutcome:
    """Every length of spec.lengths in order; a sub-study that exists is resumed with --resume."""
    family = FamilyOutcome()
    carried: list[Layout] = []
    previous: int | None = None
    for length in spec.lengths or [spec.seq_len]:
        sub = spec.at_length(length)
        prior = make_prior(sub)
        prior.carried = [scale_to_length(lay, previous, length, sub.num_gpus, prior.gbs) for lay in carried]
        exists = resume and _exists(sub)
        family.outcomes[length] = run_sweep(sub, resume=exists, prior=prior, show_progress=show_progress,
                                            run_tags=run_tags)
        carried = best_layouts(family.outcomes[length].study, CARRIED)
        previous = length
    return family


def scale_to_length(layout: Layout, old: int | None, new: int, num_gpus: int, gbs: int) -> Layout:
    """The rule of thumb across lengths: keep the sequence per CP rank (CP scales with the length, DP gives
    way); CP stops where TP*CP*PP fills the cluster."""
    cp = layout.cp
    if old:
        ratio = new / old
        while ratio >= 2 and layout.tp * cp * 2 * layout.pp <= num_gpus:
            cp, ratio = cp * 2, ratio / 2
    return layout.replace(cp=cp, gbs=gbs)


def best_layouts(study: optuna.Study, count: int) -> list[Layout]:
    ranked = sorted(((r.objective, r.layout) for r in queries.finished_records(study)
                     if r.fits_ok and r.layout and r.objective is not None), key=lambda pair: -pair[0])
    return distinct(layout for _, layout in ranked)[:count]


def family_rows(members: list[optuna.Study]) -> list[dict[str, Any]]:
    """Per length: the best layout that fits and its figures, and TF/s against the shortest length."""
    rows: list[dict[str, Any]] = []
    for study in sorted(members, key=lambda s: int(StudyRecord.of(s).seq_len or 0)):
        found = queries.best_fitting_trial(study)
        best = TrialRecord.of(found) if found else None
        rows.append({"seq_len": StudyRecord.of(study).seq_len, "study": study.study_name,
                     "layout": best.layout_key if best else None, "fidelity": best.fidelity if best else None,
                     **{k: best.measured(k) if best else None for k in NUMBER_COLUMNS}})
    first = next((r["tflops_per_gpu"] for r in rows if r["tflops_per_gpu"]), None)
    for r in rows:
        r["tflops_vs_shortest"] = r["tflops_per_gpu"] / first if first and r["tflops_per_gpu"] else None
    return rows


def _exists(spec: SweepSpec) -> bool:
    storage = studies.open_storage(spec.storage)
    return spec.name in {s.study_name for s in studies.stored_studies(storage)}
