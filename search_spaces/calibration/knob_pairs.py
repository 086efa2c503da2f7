"""Published same-layout A/B pairs: one knob switched, everything else held (reference/knob_effects.csv).

Each row names the model, GPU, world size and length, layout A in full ("field=value" words, lists with ';'; MoE
pairs name their routing: forced_balance for benchmark runs, capacity:F for token-drop ones),
layout B as the fields that change, the published metric of both (TF/s/GPU, tokens/s/GPU or step time), a
declared half (fit / held) and its source (repository, commit, file and what was compared). `ratio` is B's
throughput over A's, whatever the metric (a step time is inverted). The cost model's prediction of the same
ratio is `predicted_ratio`; bench/knob_effects.py prints both, bench/fit_calibration.py fits on the fit half.
How much a published ratio moves with no knob switched: `patch_release_changes`, the same layouts measured in a
Megatron-Bridge release and its patch release (`noise_band`: a quantile of them).
Pure Python.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from search_spaces.calibration.calibration_file import Calibration
from search_spaces.calibration.fit import Measurement, predict_tokens
from search_spaces.layouts.layout import Layout

PATH = Path(__file__).parent / "reference" / "knob_effects.csv"
# metrics whose larger value is faster; a step time is the inverse
THROUGHPUT_METRICS = ("tflops", "tokens_per_sec")
KNOBS = ("dispatcher", "cuda_graphs", "precision", "recompute", "cp_comm_type", "ep_overlap", "routing",
         "optimizer_offload")
HALVES = ("fit", "held")


@dataclass(frozen=True)
class KnobPair:
    """One published A/B pair: `a` and `b` are the two layouts of one job."""
    name: str
    knob: str
    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    a: Layout
    b: Layout
    metric: str
    value_a: float
    value_b: float
    half: str
    source: str
    assumed: str = ""

    @property
    def ratio(self) -> float:
        """Published throughput of B over A."""
        if self.metric in THROUGHPUT_METRICS:
            return self.value_b / self.value_a
        return self.value_a / self.value_b

    def measurement(self, layout: Layout) -> Measurement:
        return Measurement(self.model, self.gpu, self.num_gpus, self.seq_len, layout, tflops_per_gpu=1.0,
                           source=self.name)

    @property
    def changed(self) -> str:
        """The fields B changes, as 'field: a -> b'."""
        da, db = self.a.params(), self.b.params()
        return ", ".join(f"{k}: {da[k]} -> {db[k]}" for k in da if da[k] != db[k])


def _layout_words(text: str) -> dict:
    out = {}
    for word in text.split():
        key, value = word.split("=", 1)
        out[key] = value.replace(";", ",")
    return out


def load_knob_pairs(path: Path = PATH) -> list[KnobPair]:
    """Every pair of the file, in file order, each layout validated (Layout raises on a bad field)."""
    pairs = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            a = Layout.from_params(_layout_words(r["layout_a"]))
            b = Layout.from_params(_layout_words(r["layout_b"]), base=a)
            if r["knob"] not in KNOBS or r["half"] not in HALVES:
                raise ValueError(f"{path}: pair {r['pair']}: knob {r['knob']!r} or half {r['half']!r} unknown")
            pairs.append(KnobPair(r["pair"], r["knob"], r["model"], r["gpu"], int(r["num_gpus"]),
                                  int(r["seq_len"]), a, b, r["metric"], float(r["value_a"]), float(r["value_b"]),
                                  r["half"], r["source"], r.get("assumed") or ""))
    return pairs


SUMMARY = Path(__file__).parent / "reference" / "megatron_bridge_performance_summary.csv"
# the summary's columns that are not the job and its layout: what a run is labelled with and what it measured
NOT_THE_RUN = ("release", "ga", "tokens_per_sec_per_gpu", "tflops_per_gpu", "source")


def patch_release_changes(path: Path = SUMMARY) -> list[float]:
    """|log(TF/s ratio)| of every layout the performance summary lists in a release and in its patch release
    (26.04 and 26.04.01, ...): two separate runs of the same job, layout and (nearly) the same software -- what
    one published A/B comparison moves with no knob switched."""
    by_run: dict[tuple, dict[str, float]] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            try:
                tflops = float(r["tflops_per_gpu"].split()[0])
            except (ValueError, IndexError):
                continue
            run = tuple(v for k, v in r.items() if k not in NOT_THE_RUN)
            by_run.setdefault(run, {})[r["release"]] = tflops
    return sorted(abs(math.log(runs[rel] / runs[rel[:-3]])) for runs in by_run.values() for rel in runs
                  if rel.endswith(".01") and rel[:-3] in runs)


def noise_band(quantile: float, path: Path = SUMMARY) -> float:
    """The `quantile` of patch_release_changes, as a ratio's distance from 1: a published A/B ratio within it is
    not told apart from no change at that level."""
    changes = patch_release_changes(path)
    return math.exp(changes[min(len(changes) - 1, int(quantile * len(changes)))]) - 1


def predicted_ratio(pair: KnobPair, cal: Calibration) -> float | None:
    """The cost model's tokens/s of B over A (None when a rule refuses either layout)."""
    a = predict_tokens(pair.measurement(pair.a), cal)
    b = predict_tokens(pair.measurement(pair.b), cal)
    return b / a if a and b else None


__all__ = ["KnobPair", "load_knob_pairs", "noise_band", "patch_release_changes", "predicted_ratio"]
