"""Making the cost model fast changed no figure.

- `space --json` and `estimate --json` print, to the last digit, what they printed before the cost model was
  memoised (tests/data/speed_identity.json, written by tests/data/capture_speed_identity.py at the commit it
  records). Recaptured once on purpose, at fb66a92, where `space` began to judge the feature rules on each grid:
  its legal and rejection counts and its estimated counts moved, and one top (a faster DeepSeek-V3 layout the old
  table never tried); every estimate, every other top and every fitting count is the first capture's;
- a memoised term is keyed by the layout fields it declares it reads: an undeclared read would hand one layout
  another's value. Every one-field neighbour of a set of layouts is estimated warm (their values shared through
  the memo tables), then each again from scratch: the two agree.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost import memo
from search_spaces.cost.costmodel import estimate
from search_spaces.layouts.layout import DIMENSIONS, Layout
from search_spaces.layouts.space import dimensions

DATA_DIR = Path(__file__).parents[1] / "data"
PINNED = json.loads((DATA_DIR / "speed_identity.json").read_text())


def _capture_module():
    spec = importlib.util.spec_from_file_location("capture_speed_identity", DATA_DIR / "capture_speed_identity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CAPTURE = _capture_module()


def test_the_pinned_figures_name_their_commit():
    assert len(PINNED["commit"]) == 40 and not PINNED["search_spaces_modified"]
    assert len(PINNED["space"]) == len(CAPTURE.SPACE_CASES) and len(PINNED["estimate"]) == len(CAPTURE.ESTIMATE_CASES)


# keys `estimate --json` gained after the capture (not figures of the cost model): every other key is pinned
ADDED_SINCE_CAPTURE = {"software",  # the software release the constants describe
                       # issue 56: the figures are labelled predicted, MFU names its peak, and the memory is
                       # grouped (the breakdown's own figures, pinned in `breakdown`)
                       "figures", "mfu_vs_dense_peak_tflops_per_gpu", "memory_per_gpu_gib"}


@pytest.mark.parametrize("case", PINNED["estimate"], ids=lambda c: " ".join(c["argv"][1:8:2]))
def test_estimate_prints_the_pinned_figures(case):
    row = CAPTURE.estimate_row(case["argv"])
    assert row["rc"] == case["rc"]
    assert set(row["output"]) - set(case["output"]) <= ADDED_SINCE_CAPTURE
    assert {k: row["output"][k] for k in case["output"] if k != "neighbours"} == \
        {k: v for k, v in case["output"].items() if k != "neighbours"}
    _same_neighbour_figures(row["output"]["neighbours"], case["output"]["neighbours"])


def _same_neighbour_figures(now: list[dict], pinned: list[dict]) -> None:
    """Since issue 56 a knob's neighbours are the sizes the space's legal grids have (layouts/neighbours.py
    proposed_sizes) and a knob the space proposes one other value of is listed: a neighbour the capture listed and
    no longer lists was refused there by a rule, and every neighbour both list has the figures pinned."""
    by_value = {(n["knob"], n["value"]): n for n in now}
    pinned_by_value = {(n["knob"], n["value"]): n for n in pinned}
    for key, n in pinned_by_value.items():
        if key in by_value:
            assert by_value[key] == n, key
        else:
            assert not n["legal"] and n["violations"], key
    assert len(set(by_value) & set(pinned_by_value)) >= len(pinned) // 2  # most still there: the check proves a lot


# the spaces of a billion combinations and more, ranked over 1,200 grids, take seconds each: the full suite's (the
# smaller ones take the same code paths in the fast lane)
BIG = {"deepseek-v3 h100 1024 131072", "deepseek-v3 h200 256 32768", "qwen3-next-80b-a3b h100 128 65536",
       "qwen3-235b-a22b gb300 1024 262144"}


def _space_case(case: dict):
    name = " ".join(case["argv"][1:8:2])
    return pytest.param(case, id=name, marks=[pytest.mark.slow] if name in BIG else [])


@pytest.mark.parametrize("case", [_space_case(c) for c in PINNED["space"]])
def test_space_prints_the_pinned_figures(case):
    row = CAPTURE.space_row(case["argv"])
    assert row["rc"] == case["rc"]
    assert {k: row["output"][k] for k in case["output"]} == case["output"]


# ---- warm memo tables give what a cold start gives ---------------------------------------------------------------
SITUATIONS = [("deepseek-v3", "h100", 256, 131072, dict(tp=2, cp=16, ep=32, pp=8, vpp=4, gbs=128)),
              ("qwen3-next-80b-a3b", "b200", 64, 65536, dict(tp=2, cp=4, ep=16, pp=2, gbs=64)),
              ("gpt-oss-120b", "gb200", 128, 32768, dict(tp=2, cp=2, ep=8, pp=4, vpp=3, mbs=2, gbs=256)),
              ("llama3-70b", "h200", 64, 16384, dict(tp=4, cp=2, pp=4, vpp=5, gbs=64)),
              ("tiny-mla-moe", "cpu", 8, 1024, dict(cp=2, ep=2, pp=2, gbs=8))]


# the opt-in dimensions (held at their defaults unless a space frees them): their values are neighbours too, so a
# term that reads one without declaring it fails here
OPT_IN = tuple(d.name for d in DIMENSIONS if d.opt_in)


def _neighbours(model, gpu, num_gpus, seq_len, base: Layout) -> list[Layout]:
    """`base` and every layout one field away from it, each field over the values the space gives it (the opt-in
    ones freed)."""
    values = dimensions(model, gpu, num_gpus, seq_len, free=OPT_IN).values
    out = [base]
    for dim in DIMENSIONS:
        for value in values.get(dim.name, []):
            try:
                out.append(base.replace(**{dim.name: value}))
            except Exception:  # noqa: BLE001 -- a batch MBS does not divide
                continue
    if "activation_offload_fraction" in values:  # a part of the offload groups: only with an offload
        for modules in values.get("activation_offload", [])[1:]:
            out.append(base.replace(activation_offload=modules, activation_offload_fraction=0.5))
    for recompute in ("full", "moe_act,layernorm", "core_attn"):
        for method, layers in (("uniform", 1), ("block", 2), ("uniform", 3)):
            try:
                out.append(base.replace(recompute=recompute, recompute_method=method, recompute_num_layers=layers))
            except Exception:  # noqa: BLE001 -- a combination the Layout refuses
                continue
    return list(dict.fromkeys(out))


@pytest.mark.parametrize("situation", SITUATIONS, ids=[s[0] for s in SITUATIONS])
def test_warm_estimates_equal_estimates_from_scratch(situation):
    name, gpu_name, num_gpus, seq_len, fields = situation
    model, gpu = load_model(name), load_gpu(gpu_name)
    layouts = _neighbours(model, gpu, num_gpus, seq_len, Layout(**fields))
    layouts += [n for lay in layouts[1:8] for n in _neighbours(model, gpu, num_gpus, seq_len, lay)]
    layouts = list(dict.fromkeys(layouts))
    memo.clear_all()
    warm = [(estimate(model, gpu, num_gpus, seq_len, lay, with_time=False).to_dict(),
             estimate(model, gpu, num_gpus, seq_len, lay).to_dict()) for lay in layouts]
    legal = sum(1 for mem, _ in warm if mem["legal"])
    assert legal >= 20, f"only {legal} of {len(layouts)} neighbours are legal: the check would prove little"
    for lay, (mem, full) in zip(layouts, warm):
        memo.clear_all()
        assert estimate(model, gpu, num_gpus, seq_len, lay, with_time=False).to_dict() == mem, lay.key()
        memo.clear_all()
        assert estimate(model, gpu, num_gpus, seq_len, lay).to_dict() == full, lay.key()
