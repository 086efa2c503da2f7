"""The published document-length distributions in examples/ (bench/published_lengths.py builds them from the
figures its sources quote): the files are what the builder writes, and they hold the quoted figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from search_spaces.cost.packing import load_histogram
from search_spaces.layouts.space import explore

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("published_lengths", ROOT / "bench" / "published_lengths.py")
published_lengths = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(published_lengths)


def _share(hist, keep) -> float:
    return sum(c for d, c in zip(hist.lengths, hist.counts) if keep(d)) / hist.documents


@pytest.mark.parametrize("name", sorted(published_lengths.PUBLISHED))
def test_the_example_file_is_what_the_builder_writes(name):
    path = published_lengths.path_of(name)
    on_disk = json.loads(path.read_text())
    built = published_lengths.published(name)
    assert on_disk["lengths"] == list(built.lengths)
    assert on_disk["counts"] == pytest.approx(list(built.counts), rel=1e-6)
    assert load_histogram(path).summary["source"] == on_disk["source"]


def test_bytescale_holds_its_quoted_figures():
    """80% of the documents 4K or shorter, 1% at or above 128K carrying 44.3% of the tokens (the 1% is cut into
    128K pieces, so the documents below 128K are compared among themselves)."""
    hist = load_histogram(published_lengths.path_of("bytescale-128k"))
    below = [(d, c) for d, c in zip(hist.lengths, hist.counts) if d < published_lengths.SEQ_LEN]
    short = sum(c for d, c in below if d <= 4096) / sum(c for _, c in below)
    assert short == pytest.approx(0.80 / 0.99)
    tokens = sum(d * c for d, c in zip(hist.lengths, hist.counts))
    assert hist.lengths[-1] * hist.counts[-1] / tokens == pytest.approx(0.443)


def test_prolong_shortmix_holds_its_quoted_figures():
    hist = load_histogram(published_lengths.path_of("prolong-shortmix"))
    for above, share in ((4096, 0.109), (8192, 0.072), (16384, 0.032), (32768, 0.008)):
        assert _share(hist, lambda d, above=above: d > above) == pytest.approx(share), above
    assert hist.longest == 65536


@pytest.mark.slow  # two explorations of a 128-GPU space: ~15 s
def test_with_short_packed_documents_the_ranking_is_not_beaten_by_a_lower_cp_alone():
    """Grids are estimated in rule-of-thumb order, up to a count: with short packed documents the CP rule is sized
    by their attention, not by seq_len, so the free ranking reaches the low-CP grids that win. Sized by seq_len it
    ranked CP16 first (3,747 tokens/s/GPU) while CP4 alone reached 3,942."""
    hist = load_histogram(published_lengths.path_of("prolong-shortmix"))
    where = ("qwen3-235b-a22b", "gb200", 128, published_lengths.SEQ_LEN)
    free = explore(*where, top=1, packing=hist).top[0]
    low_cp = explore(*where, top=1, packing=hist, fixed={"cp": 4}).top[0]
    assert free["prediction"]["tokens_per_sec_per_gpu"] >= low_cp["prediction"]["tokens_per_sec_per_gpu"]
    assert free["layout"]["cp"] <= 4
