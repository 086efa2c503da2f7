"""`moe-autotune estimate` (one layout through the cost model) and `moe-autotune space` (the whole space).

Thin: parse flags, call search_spaces, print a rich table or one JSON object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from search_spaces.cost.breakdown import COMPUTE_PARTS, memory_sections
from search_spaces.errors import SpecError

from orchestrator.commands.layout_options import with_layout_options
from orchestrator.commands.model import config_reading, print_reading
from orchestrator.outputs.explain_view import EXPLAIN_HELP, explain_rows, print_explain
from orchestrator.outputs.packing_view import (
    LENGTHS_HELP,
    PACKING_HELP,
    compare_full,
    load_packing,
    load_situation,
    print_comparison,
    print_packing,
)
from orchestrator.userio import console, echo, json_line

CALIBRATION_HELP = "a calibration file written by `moe-autotune calibrate` (default: the packaged constants)"
FREE_HELP = ("an opt-in dimension to vary too (repeatable or comma-separated): routing, or a memory lever "
             "(activation_offload, expert_stash, optimizer_states, fp8_param_gather; `levers` for all of them)")
SOFTWARE_HELP = ("the NeMo / Megatron-Bridge container release you run, e.g. 25.11: compute at the speed that release "
                 "reached on this GPU in published rows (default: the newest published release)")


def register(app: typer.Typer) -> None:
    app.command("estimate")(with_layout_options(estimate))
    app.command("space")(space)


def estimate(
    model: str = typer.Option(..., help="catalog name or path of a Hugging Face config.json"),
    gpu: str = typer.Option(..., help="h100 | h200 | b200 | b300 | gb200 | gb300 | cpu"),
    num_gpus: int = typer.Option(..., "--num-gpus"),
    seq_len: int = typer.Option(..., "--seq-len"),
    num_layers: Optional[int] = typer.Option(None, "--num-layers", help="override the model's layer count"),
    hidden_size: Optional[int] = typer.Option(None, "--hidden-size", help="override the model's width"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help=CALIBRATION_HELP),
    software: Optional[str] = typer.Option(None, "--software", help=SOFTWARE_HELP),
    packing: Optional[str] = typer.Option(None, "--packing", help=PACKING_HELP),
    lengths: Optional[Path] = typer.Option(None, "--lengths", help=LENGTHS_HELP),
    explain: bool = typer.Option(False, "--explain", help=EXPLAIN_HELP),
    layout_flags: dict | None = None,
) -> int:
    """Predict legality, peak memory per GPU and throughput of one layout (unset layout flags: their defaults;
    --gbs: MBS x DP), with the step-time breakdown (compute and its GEMM/attention/element-wise parts, recompute,
    TP/CP/EP/PP/DP communication, dispatcher and launch overhead, pipeline bubble, optimizer and offload) and, per
    knob, what switching it to its neighbours would change (JSON key "neighbours"); --explain: each term against
    the kernel tables (JSON key "explain")."""
    # not calibration.py: the fit is not needed here
    from search_spaces.calibration.calibration_file import load_calibration
    from search_spaces.catalog.maturity import at_software, software_label
    from search_spaces.cost.costmodel import estimate as run_estimate
    from search_spaces.layouts.neighbours import neighbours

    spec, gpu_spec = load_situation(model, gpu, num_gpus, seq_len, num_layers, hidden_size)
    reading = config_reading(model, spec)
    layout = _layout_of_flags(layout_flags or {}, num_gpus)
    hist = load_packing(packing, lengths, seq_len)
    cal = at_software(load_calibration(calibration), software, [gpu_spec.name])
    est = run_estimate(spec, gpu_spec, num_gpus, seq_len, layout, cal=cal, packing=hist)
    near = neighbours(spec, gpu_spec, num_gpus, seq_len, layout, est, cal, hist) if est.legal else []
    why = explain_rows(est, spec, gpu_spec, num_gpus, seq_len, layout, cal, hist) if explain else []
    if as_json:
        extra = {"explain": [row.to_dict() for row in why]} if explain else {}
        echo(json_line({**est.to_dict(), **_estimate_labels(est, gpu_spec), "neighbours": near,
                        "software": software_label(cal, gpu_spec.name), **_model_reading(reading), **extra},
                       "estimate --json"))
    else:
        if reading:
            print_reading(reading)
        _print_estimate(est, gpu_spec)
        console().print(f"software assumed: {software_label(cal, gpu_spec.name)}")
        for note in _memory_notes(est, spec, gpu_spec, layout):
            console().print(note)
        if est.packing is not None and est.legal:
            print_packing(est.packing)
        if near:
            _print_neighbours(near)
        if why:
            print_explain(why)
    if not est.legal:
        reasons = "; ".join(f"{v.rule}: {v.reason}" for v in est.violations)
        typer.echo(f"error: illegal layout: {reasons}", err=True)
        raise typer.Exit(2)
    return 0


def _memory_notes(est, spec, gpu_spec, layout) -> list[str]:
    """What the figures rest on beyond the fitted range, and the host-memory refusal, in words (text output)."""
    from search_spaces.cost.routing import extrapolation_note

    notes = [f"does not fit the host: {est.host_memory_refusal}"] if est.host_memory_refusal else []
    note = extrapolation_note(spec, layout, gpu_spec.is_cpu) if est.legal else None
    return notes + ([f"note: {note}"] if note else [])


def _layout_of_flags(flags: dict, num_gpus: int):
    """The layout the flags name, its batch applied together with MBS (a Layout checks GBS % MBS when built,
    so neither may be applied alone); no --gbs: MBS x DP."""
    from search_spaces.layouts.layout import BY_NAME, Layout

    if flags.get("gbs") is None:
        sizes = Layout.from_params({k: v for k, v in flags.items() if k not in ("mbs", "gbs")})
        mbs = BY_NAME["mbs"].decode(flags.get("mbs", BY_NAME["mbs"].default))
        flags = {**flags, "gbs": mbs * max(sizes.dp(num_gpus), 1)}
    return Layout.from_params(flags)


PREDICTED = "predicted"  # what every figure of `estimate` and `space` is: the cost model's, never measured


def precision_class(precision: str) -> str:
    """The datasheet's name of the dense peak an MFU at `precision` is relative to: FP8 for every fp8 recipe
    (their peaks are one), MXFP8, BF16, FP32."""
    if precision == "mxfp8":
        return "MXFP8"
    return "FP8" if precision.startswith("fp8") else precision.upper()


def _estimate_labels(est, gpu_spec) -> dict[str, Any]:
    """What `estimate --json` says beside the cost model's object: that its figures are predicted, the dense peak
    its MFU is relative to, and the memory in groups that do not overlap (`memory_per_gpu_gib`: peak_components
    sum to `peak`; per_microbatch and host_offloaded are other figures, not parts of it)."""
    precision = str(est.layout.get("precision", ""))
    memory: dict[str, Any] = {}
    if est.memory is not None:
        memory = {"pipeline_rank": est.memory.counts.pipeline_rank, "peak": est.peak_memory_gib,
                  **memory_sections(est.memory)}
    return {"figures": PREDICTED,
            "mfu_vs_dense_peak_tflops_per_gpu": {precision: gpu_spec.peak(precision)}
            if gpu_spec.supports(precision) else {},
            "memory_per_gpu_gib": memory}


def _table(title: str, **kwargs: Any):
    """A rich table whose title stays on one line (a table narrower than its title would wrap it): what a table
    is of, its units and that its figures are predicted are read in the title."""
    from rich.table import Table  # tables only for the text output (--json needs none)

    return Table(title=title, min_width=len(title) + 4, **kwargs)


def _print_estimate(est, gpu_spec) -> None:
    from rich.table import Table

    out = console()
    title = f"{est.model} on {est.num_gpus} x {est.gpu}, {est.seq_len} tokens"
    if not est.legal:
        table = Table(title=f"{title}: illegal layout")
        table.add_column("rule")
        table.add_column("reason")
        for v in est.violations:
            table.add_row(v.rule, v.reason)
        out.print(table)
        return
    precision = str(est.layout["precision"])
    summary = _table(f"{title}, {precision}: {PREDICTED} by the cost model")
    summary.add_column("figure (unit)")
    summary.add_column(PREDICTED, overflow="fold")
    capacity = f"{est.peak_memory_gib:.1f} of {est.memory_capacity_gib:g} GiB per GPU"
    summary.add_row("fits", f"{'yes' if est.fits else 'NO'} ({capacity})")
    summary.add_row("tokens/s/GPU", f"{est.tokens_per_sec_per_gpu:,.1f}")
    summary.add_row("model TFLOP/s/GPU", _num(est.tflops_per_gpu))
    summary.add_row(f"MFU vs {precision_class(precision)} dense peak ({gpu_spec.peak(precision):,.1f} TFLOP/s/GPU)",
                    f"{est.mfu:.1%}")
    summary.add_row("step time (s)", f"{est.step_time_s:.3f}")
    summary.add_row("pipeline layout", est.pipeline_layout)
    out.print(summary)
    _print_memory(out, est)
    tim = _table(f"time per step (s, {PREDICTED})")
    tim.add_column("component")
    tim.add_column("seconds", justify="right")
    for k, v in est.time.components().items():
        tim.add_row(f"  {k}" if k in COMPUTE_PARTS else k, f"{v:.4f}")
    tim.add_section()
    tim.add_row("step (the sum; compute's parts once)", f"{est.time.step:.4f}")
    out.print(tim)


def _print_memory(out, est) -> None:
    """The peak's components with their sum (the peak), then, apart, the figures that are not parts of it: one
    microbatch's activations (inside the peak's `activations`) and what is kept in the host's pinned memory."""
    counts = est.memory.counts
    groups = memory_sections(est.memory)
    peak = _table(f"peak memory per GPU (GiB, {PREDICTED})")
    peak.add_column("component")
    peak.add_column("GiB", justify="right")
    for k, v in groups["peak_components"].items():
        peak.add_row(k, _num(v))
    peak.add_section()
    peak.add_row("peak (the sum of the rows above)", _num(est.peak_memory_gib))
    out.print(peak)
    out.print(f"pipeline rank {counts.pipeline_rank} (the most loaded); parameters on it: "
              f"{counts.params_on_rank:,.0f} (dense {counts.dense_params_on_rank:,.0f}, experts "
              f"{counts.expert_params_on_rank:,.0f}); microbatches in flight per chunk: "
              f"{counts.inflight_microbatches:.2f}")
    other = _table(f"not in the peak (GiB, {PREDICTED})")
    other.add_column("kind")
    other.add_column("figure")
    other.add_column("GiB", justify="right")
    per_mb = groups["per_microbatch"]
    other.add_row("per microbatch (in the peak's activations)", "activations_per_microbatch",
                  _num(per_mb["activations_per_microbatch"]))
    other.add_row("per microbatch (the output head's share)", "embedding_logits", _num(per_mb["embedding_logits"]))
    other.add_section()
    for k, v in groups["host_offloaded"].items():
        other.add_row("host (CPU-offloaded, pinned memory)", k, _num(v))
    out.print(other)


def _print_neighbours(near: list[dict]) -> None:
    table = _table(f"switching one knob, {PREDICTED} (everything else, the batch included, as above)")
    columns = ("knob", "to", "tokens/s/GPU", "tokens/s change", "peak GiB/GPU", "peak change GiB", "note")
    for col in columns:
        table.add_column(col, justify="right" if col not in ("knob", "to", "note") else "left", overflow="fold")
    for n in near:
        if not n["legal"]:
            table.add_row(n["knob"], n["value"], "-", "-", "-", "-", f"illegal: {n['violations'][0]['rule']}")
            continue
        table.add_row(n["knob"], n["value"], f"{n['tokens_per_sec_per_gpu']:,.1f}", f"{n['delta_tokens_pct']:+.1f}%",
                      _num(n["peak_memory_gib"]), f"{n['delta_peak_gib']:+.2f}", "" if n["fits"] else "does not fit")
    console().print(table)


def space(
    model: str = typer.Option(..., help="catalog name or path of a Hugging Face config.json"),
    gpu: str = typer.Option(...),
    num_gpus: int = typer.Option(..., "--num-gpus"),
    seq_len: int = typer.Option(..., "--seq-len"),
    top: int = typer.Option(10, min=1, help="how many fitting layouts to list"),
    gbs: Optional[int] = typer.Option(None, help="global batch (default ~16M tokens per step)"),
    fix: list[str] = typer.Option([], "--fix", help="FIELD=VALUE, keep a layout field fixed (repeatable)"),
    free: list[str] = typer.Option([], "--free", help=FREE_HELP),
    budget: float = typer.Option(30.0, help="at most this many seconds estimating layouts: a safety net (the output "
                                 "says when it cut the ranking short, which then depends on the machine's speed)"),
    max_grids: int = typer.Option(1200, "--max-grids", help="parallel grids to estimate, in rule-of-thumb order"),
    num_layers: Optional[int] = typer.Option(None, "--num-layers"),
    hidden_size: Optional[int] = typer.Option(None, "--hidden-size"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help=CALIBRATION_HELP),
    software: Optional[str] = typer.Option(None, "--software", help=SOFTWARE_HELP),
    packing: Optional[str] = typer.Option(None, "--packing", help=PACKING_HELP),
    lengths: Optional[Path] = typer.Option(None, "--lengths", help=LENGTHS_HELP),
) -> int:
    """Enumerate the legal layouts, count rejections per rule, list the fastest that fit (with --lengths: ranked
    by real tokens/s of packed documents, beside the best for full-length documents and why they differ)."""
    from search_spaces.calibration.calibration_file import load_calibration
    from search_spaces.catalog.maturity import at_software, software_label
    from search_spaces.layouts.space import explore

    spec, gpu_spec = load_situation(model, gpu, num_gpus, seq_len, num_layers, hidden_size)
    reading = config_reading(model, spec)
    fixed = _fixed(fix)
    hist = load_packing(packing, lengths, seq_len)
    cal = at_software(load_calibration(calibration), software, [gpu_spec.name])
    kwargs = dict(fixed=fixed or None, gbs=gbs, top=top, budget_s=budget, max_grids=max_grids, cal=cal,
                  free=_freed(free))
    result = explore(spec, gpu_spec, num_gpus, seq_len, **kwargs, packing=hist)
    _refuse_empty(result, f"{spec.name} on {num_gpus} x {gpu_spec.name} at {seq_len} tokens (GBS {result.gbs})",
                  gpu_spec.memory_gib, max_grids)
    versus_full = compare_full(spec, gpu_spec, num_gpus, seq_len, result, kwargs, hist) if hist else None
    if as_json:
        extra: dict[str, Any] = {"packing": {"versus_full_length": versus_full}} if hist else {}
        extra["software"] = software_label(cal, gpu_spec.name)
        extra.update(_model_reading(reading))
        extra.update(figures=PREDICTED, mfu_vs_dense_peak_tflops_per_gpu={
            p: gpu_spec.peak(p) for p in _top_precisions(result)})
        echo(json_line({**result.to_dict(), **extra}, "space --json"))
        return 0
    if reading:
        print_reading(reading)
    out = console()
    _print_space_header(out, spec, gpu_spec, num_gpus, seq_len, result, fixed)
    out.print(f"software assumed: {software_label(cal, gpu_spec.name)}")
    if result.cut_short:
        out.print(f"cut short: --budget {budget:g} s ran out after ranking {result.grids_ranked:,} parallel grids "
                  f"(of at most --max-grids {max_grids:,}): this ranking depends on the machine's speed; "
                  f"raise --budget")
    _print_space_tables(out, result, top)
    if versus_full:
        print_comparison(versus_full)
    return 0


def _model_reading(reading: dict | None) -> dict[str, Any]:
    """--json's "model_reading" key where --model is a config.json path: how it was read (`moe-autotune model
    --json`'s object, of the model as estimated: --num-layers/--hidden-size applied); none for a catalog name."""
    return {"model_reading": reading} if reading else {}


def _refuse_empty(result, where: str, memory_gib: float, max_grids: int) -> None:
    """A space that lists no layout is no answer: one line naming the rule(s) that emptied it, or the memory
    nothing fits in (search_spaces/layouts/emptiness.py), exit 2, never an empty table."""
    from search_spaces.layouts.emptiness import why_empty

    line = why_empty(result, where, memory_gib, max_grids)
    if line is not None:
        raise SpecError(line)


def _top_precisions(result) -> list[str]:
    """The precisions of the layouts `space` lists, in their order (their MFUs are relative to these peaks)."""
    return list(dict.fromkeys(str(row["layout"]["precision"]) for row in result.top))


def _print_space_header(out, spec, gpu_spec, num_gpus: int, seq_len: int, result, fixed: dict) -> None:
    """`space`'s first line: the space counted, and the precision it ranks (its default is the fastest the GPU
    runs, FP8 on GPUs: space.py's feature walk tries that precision first; `--fix precision=` another)."""
    from search_spaces.layouts.space import dimensions

    ranked = _top_precisions(result)
    if "precision" in fixed:
        precision = f"precision {', '.join(ranked)} (--fix)"
    else:
        choices = dimensions(spec, gpu_spec, num_gpus, seq_len, gbs=result.gbs).values["precision"]
        default, other = choices[-1], choices[0]
        where = "" if ranked == [default] else f"; {', '.join(ranked)} where a layout refuses it"
        precision = (f"precision {default}, space's default on {gpu_spec.name} (the fastest it runs{where}; "
                     f"--fix precision={other} ranks {precision_class(other)})")
    out.print(f"{spec.name} on {num_gpus} x {gpu_spec.name}, {seq_len} tokens, GBS {result.gbs}: "
              f"{result.total:,} combinations, {result.legal_count:,} legal "
              f"({result.grids:,} parallel grids), {result.estimated:,} estimated, "
              f"{result.fitting_count:,} {PREDICTED} to fit, {result.seconds:.1f} s; {precision}", soft_wrap=True)


def _print_space_tables(out, result, top: int) -> None:
    """`space`'s two tables on `out`: the layouts each rule rejected, and the fastest `top` predicted to fit."""
    rej = _table("rejections per rule")
    rej.add_column("rule (the first a layout breaks)")
    rej.add_column("layouts (count)", justify="right")
    for rule, n in sorted(result.rejected_by_rule.items(), key=lambda x: -x[1]):
        rej.add_row(rule, f"{n:,}")
    out.print(rej)
    classes = {precision_class(p) for p in _top_precisions(result)}
    mfu = f"MFU vs {classes.pop()} dense peak" if len(classes) == 1 else "MFU vs its precision's dense peak"
    best = _table(f"top {top} by {PREDICTED} tokens/s/GPU ({PREDICTED} to fit)")
    for col in ("#", "layout", "tokens/s/GPU", "TFLOP/s/GPU", mfu, "peak GiB/GPU"):
        best.add_column(col, overflow="fold")
    for i, row in enumerate(result.top, 1):
        p = row["prediction"]
        best.add_row(str(i), row["key"], f"{p['tokens_per_sec_per_gpu']:,.1f}", f"{p['tflops_per_gpu']:,.1f}",
                     f"{p['mfu']:.1%}", f"{p['peak_memory_gib']:.1f}")
    out.print(best)


def _fixed(fix: list[str]) -> dict:
    """`--fix FIELD=VALUE` items as layout values (a SpecError names a bad field or value)."""
    from search_spaces.layouts.layout import BY_NAME

    fixed = {}
    for item in fix:
        if "=" not in item:
            raise SpecError(f"--fix wants FIELD=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in BY_NAME:
            raise SpecError(f"--fix: unknown layout field {key!r}; allowed: {', '.join(BY_NAME)}")
        fixed[key] = BY_NAME[key].decode(value)
    return fixed


def _freed(free: list[str]) -> tuple[str, ...]:
    """`--free` names (repeatable, or comma-separated; `levers` for every memory lever): opt-in dimensions."""
    from search_spaces.layouts.space import MEMORY_LEVERS, OPT_IN

    names: list[str] = []
    for item in free:
        for name in filter(None, (n.strip().replace("-", "_") for n in item.split(","))):
            names += MEMORY_LEVERS if name == "levers" else [name]
    unknown = [n for n in names if n not in OPT_IN]
    if unknown:
        raise SpecError(f"--free: {unknown[0]!r} is not an opt-in dimension; allowed: levers, {', '.join(OPT_IN)} "
                        "(the others vary already; --fix pins one)")
    return tuple(dict.fromkeys(names))


def _num(value: float) -> str:
    """Readable for both 80 GiB GPUs and the few MiB of a tiny CPU model."""
    return f"{value:,.3f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"
