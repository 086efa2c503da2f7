"""What `estimate` and `space` show of packed documents (`--lengths FILE`): the useful-token and attention shares,
and for `space` the best layout for full-length documents beside the best for the user's, with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from search_spaces.errors import SpecError

PACKING_HELP = "how samples are built: full (default: one document per sequence) or packed (needs --lengths)"
LENGTHS_HELP = "a document-length histogram (`moe-autotune lengths`): documents packed into each sequence (THD)"

# the step-time components a reason names (the ones packing moves)
REASON_COMPONENTS = ("attention", "cp_comm", "recompute", "gemm", "tp_comm", "pipeline_bubble", "ep_comm")


def load_packing(packing: Optional[str], lengths: Optional[Path], seq_len: int):
    """The histogram the flags name (None: full-length documents; --lengths alone means packed); bad input is one
    SpecError line."""
    from search_spaces.cost.packing import PACKINGS, load_histogram

    if packing is not None and packing not in PACKINGS:
        raise SpecError(f"--packing must be one of {', '.join(PACKINGS)}, got {packing!r}")
    if lengths is None:
        if packing == "packed":
            raise SpecError("--packing packed needs --lengths FILE (a document-length histogram)")
        return None
    if packing == "full":
        raise SpecError("--packing full reads no --lengths (full-length documents); drop one of them")
    hist = load_histogram(lengths)
    hist.check_fits(seq_len)
    return hist


def print_packing(report: dict[str, Any]) -> None:
    from rich.table import Table

    from orchestrator.userio import console

    d = report["distribution"]
    table = Table(title="packed documents (THD; predicted packing)", show_header=False)
    table.add_row("documents", f"mean {d['mean_tokens']:,.0f} tokens, median {d['median_tokens']:,}, p90 "
                               f"{d['p90_tokens']:,}, longest {d['longest_tokens']:,}")
    table.add_row("per sequence", f"{report['documents_per_sequence']:.1f} documents, each padded to a multiple of "
                                  f"{report['pad_multiple']}")
    table.add_row("useful tokens", f"{report['useful_token_share']:.1%} (padding {report['padding_share']:.1%}: "
                                   f"computed, not counted in tokens/s)")
    table.add_row("attention", f"{report['attention_vs_full_length']:.1%} of a full-length sequence's; "
                               f"{report.get('attention_share_of_step', 0.0):.1%} of the step")
    console().print(table)


def compare_full(spec, gpu_spec, num_gpus: int, seq_len: int, packed_result, explore_kwargs: dict,
                 hist) -> dict[str, Any] | None:
    """The best layout for full-length documents beside the best for the packed ones, and why they differ: the
    full-length best estimated on the packed documents, component by component."""
    from search_spaces.cost.costmodel import estimate
    from search_spaces.layouts.layout import Layout
    from search_spaces.layouts.space import explore

    full = explore(spec, gpu_spec, num_gpus, seq_len, **explore_kwargs)
    if not full.top or not packed_result.top:
        return None
    full_best = Layout.from_dict(full.top[0]["layout"])
    packed_best = Layout.from_dict(packed_result.top[0]["layout"])
    cal = explore_kwargs.get("cal")
    a = estimate(spec, gpu_spec, num_gpus, seq_len, full_best, cal=cal, packing=hist)
    b = estimate(spec, gpu_spec, num_gpus, seq_len, packed_best, cal=cal, packing=hist)
    # explore's best layouts are legal, and estimated here with their time and packed documents
    assert a.time is not None and b.time is not None and b.packing is not None
    ca, cb = a.time.components(), b.time.components()
    moved = sorted(REASON_COMPONENTS, key=lambda k: -abs(ca.get(k, 0.0) - cb.get(k, 0.0)))[:3]
    return {"full_length_best": full.top[0]["key"], "packed_best": packed_result.top[0]["key"],
            "full_length_best_cp": full_best.cp, "packed_best_cp": packed_best.cp,
            "full_length_best_tokens_full": full.top[0]["prediction"]["tokens_per_sec_per_gpu"],
            "full_length_best_tokens_packed": a.tokens_per_sec_per_gpu,
            "packed_best_tokens_packed": b.tokens_per_sec_per_gpu,
            "attention_vs_full_length": b.packing["attention_vs_full_length"],
            "reason": {k: {"full_length_best_s": ca.get(k, 0.0), "packed_best_s": cb.get(k, 0.0)} for k in moved}}


def print_comparison(cmp: dict[str, Any]) -> None:
    from orchestrator.userio import console

    out = console()
    out.print(f"best for full-length documents: {cmp['full_length_best']} "
              f"({cmp['full_length_best_tokens_full']:,.1f} tokens/s/GPU on them, "
              f"{cmp['full_length_best_tokens_packed']:,.1f} on your documents)")
    if cmp["full_length_best"] == cmp["packed_best"]:
        out.print(f"best for your documents: the same layout ({cmp['packed_best_tokens_packed']:,.1f} tokens/s/GPU, "
                  f"predicted): attention per sequence is {cmp['attention_vs_full_length']:.1%} of a full-length "
                  "sequence's; no other layout is predicted faster on them")
        return
    out.print(f"best for your documents:        {cmp['packed_best']} "
              f"({cmp['packed_best_tokens_packed']:,.1f} tokens/s/GPU)")
    why = "; ".join(f"{k} {v['full_length_best_s']:.2f} s -> {v['packed_best_s']:.2f} s"
                    for k, v in cmp["reason"].items() if v["full_length_best_s"] != v["packed_best_s"]) \
        or "no component of the step moves"
    out.print(f"why (predicted, per step, both on your documents): attention per sequence is "
              f"{cmp['attention_vs_full_length']:.1%} of a full-length sequence's, so {cp_change(cmp)}: {why}")


def cp_change(cmp: dict[str, Any]) -> str:
    """How CP differs between the full-length best and the packed best, never "CP 16 -> 16"."""
    before, after = cmp["full_length_best_cp"], cmp["packed_best_cp"]
    return f"CP {before} -> {after}" if before != after else f"CP stays {before}"


def study_comparison(spec: dict[str, Any], num_gpus: int) -> str:
    """For the report of a sweep over packed documents: the cost model's best layout for full-length documents
    beside its best for the sweep's own (in the sweep's space: its fixed and free dimensions, its batch), and why;
    empty for full-length sweeps, a note when the histogram cannot be read any more."""
    from search_spaces.layouts.space import explore

    packing = spec.get("packing") or {}
    if packing.get("mode") != "packed":
        return ""
    seq_len = int(spec["seq_len"])
    overrides = spec.get("model_overrides") or {}
    kwargs: dict[str, Any] = dict(fixed=spec.get("fixed") or None, gbs=spec.get("gbs"), top=1,
                                  free=spec.get("free") or ())
    try:  # the histogram moved, or a spec an older version stored: the page says so, and is written
        hist = load_packing("packed", Path(packing["lengths"]), seq_len)
        model, gpu = load_situation(spec["model"], spec["gpu"], num_gpus, seq_len, overrides.get("num_layers"),
                                overrides.get("hidden_size"))
        packed = explore(model, gpu, num_gpus, seq_len, **kwargs, packing=hist)
    except SpecError as exc:
        return f"Packed documents: no comparison with full-length documents ({exc})."
    cmp = compare_full(model, gpu, num_gpus, seq_len, packed, kwargs, hist)
    if cmp is None:
        return "Packed documents: nothing in this sweep's space is predicted to fit, packed or full-length."
    same = cmp["full_length_best"] == cmp["packed_best"]
    why = "; ".join(f"{k} {v['full_length_best_s']:.3g} s -> {v['packed_best_s']:.3g} s"
                    for k, v in cmp["reason"].items() if v["full_length_best_s"] != v["packed_best_s"]) \
        or "no component of the step moves"
    return (f"Packed documents ({hist.describe()['mean_tokens']:,.0f} tokens on average; attention "
            f"{cmp['attention_vs_full_length']:.1%} of a full-length sequence's): the cost model's best layout for "
            f"full-length documents is {cmp['full_length_best']} ({cmp['full_length_best_tokens_full']:,.0f} "
            f"tokens/s/GPU on them, {cmp['full_length_best_tokens_packed']:,.0f} on these documents); "
            + ("it is also the best for these documents." if same else
               f"for these documents {cmp['packed_best']} ({cmp['packed_best_tokens_packed']:,.0f} tokens/s/GPU; "
               f"{cp_change(cmp)}; per step: {why})."))


def load_situation(model: str, gpu: str, num_gpus: int, seq_len: int, num_layers: Optional[int],
                   hidden_size: Optional[int]):
    """The catalog model (with its overrides) and the GPU, the sizes checked: every entry point's one range."""
    from search_spaces.catalog.hardware import load_gpu
    from search_spaces.catalog.models import load_model
    from search_spaces.inputs import MAX_GPUS, MAX_SEQ_LEN, check_size

    check_size(num_gpus, "--num-gpus", MAX_GPUS)  # one range for every entry point (search_spaces/inputs.py)
    check_size(seq_len, "--seq-len", MAX_SEQ_LEN)
    spec = load_model(model)
    if num_layers or hidden_size:
        spec = spec.with_overrides(num_layers=num_layers, hidden_size=hidden_size)
    return spec, load_gpu(gpu)
