"""The reference pages of the documentation, derived from the code at build time (never copied by hand).

Each function returns one page's markdown from a declaration: the Typer app's click tree (`cli_reference`), the
spec's pydantic models (`spec_reference`), the Layout's dimensions (`dimensions_reference`), the legality rules'
registry (`rules_reference`), the model and GPU catalogs (`models_reference`, `gpus_reference`), the cost model's
modules (`cost_parts`) and the benchmark figures in bench/results.json (`accuracy_reference`). `pages()` is every
generated page by its path under docs/; docs/gen_pages.py (an mkdocs-gen-files script) writes them into the build,
and tests/project/test_docs.py calls these functions directly. Pure functions: they read, never write.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results.json"
GENERATED = ("This page is generated from the code at build time (`docs/refgen.py`); edit the source it names, "
             "not this page.")


# ---- markdown helpers ------------------------------------------------------------------------------------------

def cell(value: Any) -> str:
    """One table cell: on one line, with markdown's table and emphasis characters and HTML brackets escaped."""
    text = " ".join(str(value).split()) if value is not None else ""
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("*", "\\*"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(char, escaped)
    return text


def code(value: Any) -> str:
    """A value as inline code, safe inside a table cell."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    return f"`{text}`" if text else ""


def prose(text: str | None) -> str:
    """A help or doc string as a paragraph (click's `\\b` markers dropped, HTML brackets escaped)."""
    text = (text or "").replace("\b", "")
    return "\n".join(line.strip() for line in text.strip().splitlines()).replace("<", "&lt;").replace(">", "&gt;")


def table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def page(title: str, source: str, *parts: str) -> str:
    return "\n\n".join([f"# {title}", f"!!! note \"Generated\"\n    {GENERATED} Source: {source}.", *parts]) + "\n"


# ---- the CLI ----------------------------------------------------------------------------------------------------

def walk_commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command of a click tree (Typer's `typer.main.get_command(app)`), groups included, in order."""
    out = [(path, command)]
    for name, sub in (getattr(command, "commands", None) or {}).items():
        out += walk_commands(sub, (*path, name))
    return out


def flags(param: Any) -> list[str]:
    """The spellings of one click option (`--seed`, `--resume/--no-resume` both), empty for an argument."""
    if getattr(param, "param_type_name", "") != "option":
        return []
    return [*param.opts, *param.secondary_opts]


def _default(param: Any) -> str:
    default = param.default
    if callable(default) or default is None or repr(default).startswith("<") or default == ():
        return ""
    if getattr(param, "is_flag", False) and default is False:
        return ""
    return code(default if not isinstance(default, (list, tuple)) else ",".join(map(str, default)))


def _type(param: Any, ctx: Any) -> str:
    """The value type of a parameter, from whichever click (typer's vendored one or click) built it."""
    try:
        return str(param.display_type(ctx)).strip("<>")
    except (AttributeError, TypeError):
        kind = getattr(param, "type", None)
        return str(getattr(kind, "name", "") or getattr(getattr(param, "type_descriptor", None), "annotation", ""))


def argument_name(param: Any) -> str:
    return (getattr(param, "metavar", None) or param.name).upper()


def _param_row(param: Any, ctx: Any) -> list[str]:
    if getattr(param, "param_type_name", "") == "option":
        names = " / ".join(code(f) for f in flags(param))
        kind = "flag" if getattr(param, "is_flag", False) else cell(_type(param, ctx)).upper()
    else:
        names = code(argument_name(param))
        kind = "argument" + ("" if param.required else " (optional)")
    help_text = getattr(param, "help", None) or ""
    if getattr(param, "hidden", False):
        help_text = "(hidden) " + help_text
    return [names, kind, _default(param), cell(help_text)]


def cli_reference(app: Any = None, program: str = "moe-autotune") -> str:
    """Every command and every flag of the Typer app (orchestrator/commands/cli.py's by default), from its click
    tree."""
    import typer

    if app is None:
        from orchestrator.commands.cli import app
    root = typer.main.get_command(app)
    sections, overview = [], []
    for path, command in walk_commands(root):
        name = " ".join((program, *path))
        hidden = getattr(command, "hidden", False)
        short = (command.help or "").strip().split("\n\n")[0]
        if path:
            overview.append([f"[{code(name)}](#{_anchor(name)})", cell(("(internal) " if hidden else "") + short)])
        params = [p for p in command.params if p.name != "help"]
        ctx = _context(command)
        body = [f"## {name}"]
        if hidden:
            body.append("*Internal: hidden from `--help`; the Slurm batch script runs it.*")
        body.append(prose(command.help))
        usage = " ".join([name, *(argument_name(p) for p in params
                                  if getattr(p, "param_type_name", "") == "argument"), "[OPTIONS]"])
        body.append(f"```text\n{usage}\n```")
        if params:
            body.append(table(["name", "kind", "default", "help"], (_param_row(p, ctx) for p in params)))
        sections.append("\n\n".join(b for b in body if b))
    intro = table(["command", "what it does"], overview)
    return page("Command-line reference", "the Typer app `orchestrator.commands.cli.app` (each command's options and "
                "help in `orchestrator/commands/`)", intro, *sections)


def _context(command: Any) -> Any:
    """A click context for the command (display_type wants one), from the click that built it."""
    try:
        return command.context_class(command)
    except Exception:  # noqa: BLE001 - a click without context_class: the type is read without one
        return None


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ---- the sweep spec ---------------------------------------------------------------------------------------------

def spec_fields(model: Any = None, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted name, pydantic FieldInfo, owning model) of every field of the spec, nested models included."""
    from pydantic import BaseModel

    if model is None:
        from orchestrator.spec.schema import SweepSpec as model
    out = []
    for name, info in model.model_fields.items():
        out.append((prefix + name, info, model))
        nested = info.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            out += spec_fields(nested, prefix + name + ".")
    return out


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    return re.sub(r"\b(typing|pydantic\.main|orchestrator\.\w+|search_spaces\.\w+)\.", "", text)


def _field_default(info: Any) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    if info.default_factory is not None:
        value = info.default_factory()
        return "" if isinstance(value, BaseModel) else code(json.dumps(value))
    return "" if info.default is PydanticUndefined else code(json.dumps(info.default))


def spec_reference() -> str:
    rows = [[code(name), code(_type_name(info.annotation)), _field_default(info), cell(info.description)]
            for name, info, _ in spec_fields()]
    return page("Sweep spec reference", "the pydantic models of `orchestrator/spec/schema.py` (and `Cost` in "
                "`orchestrator/spec/economics.py`): each field's docstring",
                "A spec is one YAML file; every field has a default and a misspelt field is refused by name. "
                "Nested fields are written as YAML mappings (`budget: {n_trials: 8}`).",
                table(["field", "type", "default", "what it means"], rows))


# ---- layouts and rules ------------------------------------------------------------------------------------------

def _values(dim: Any) -> str:
    if dim.choices:
        return ", ".join(code(c) for c in dim.choices)
    if dim.parametrised:
        return ", ".join(code(k) for k in dim.parametrised)
    bounds = []
    if dim.minimum is not None:
        bounds.append(f"≥ {dim.minimum:g}")
    if dim.maximum is not None:
        bounds.append(f"≤ {dim.maximum:g}")
    return cell(f"{dim.kind} " + " ".join(bounds)).strip()


def dimensions_reference() -> str:
    from search_spaces import Layout, dimensions_of

    rows = []
    for dim in dimensions_of(Layout):
        values = _values(dim)
        if dim.parametrised:
            values += " " + cell("; " + ", ".join(f"{k}:F with F in [{lo:g}, {hi:g}]"
                                                  for k, (lo, hi) in dim.parametrised.items()))
        if dim.benchmark_only:
            values += " " + cell("(benchmark only: " + ", ".join(dim.benchmark_only) + ")")
        search = "opt-in" if dim.opt_in else ("yes" if dim.searchable else "no")
        rows.append([code(dim.name), values, code(dim.default), search, code(dim.flag),
                     code(dim.megatron or ""), code(dim.megatron_lm or ""), cell(dim.doc)])
    return page("Layout dimensions", "the fields of `search_spaces.layouts.layout.Layout`, declared with "
                "`search_spaces.layouts.dimensions.dimension`",
                "Every dimension of a layout with its legal values, its default, whether a sweep searches it "
                "(*opt-in*: only when the spec's `free` names it), its flag (`moe-autotune estimate` and the "
                "trainer) and its Megatron-Bridge and Megatron-LM names.",
                table(["dimension", "values", "default", "searched", "flag", "Megatron-Bridge", "Megatron-LM",
                       "what it is"], rows))


def rules_reference() -> str:
    from search_spaces import RULE_REGISTRY

    rows = [[code(r.name), cell(r.why), code(r.level or "feature"), ", ".join(code(f) for f in r.reads)]
            for r in RULE_REGISTRY]
    return page("Legality rules", "`search_spaces.layouts.rules.REGISTRY` (each rule declared with `@rule`)",
                "Every rule a layout must keep, in the order they are checked. A layout that breaks one is refused "
                "by `estimate`, counted per rule by `space`, told to Optuna as infeasible by a sweep and refused by "
                "the trainer. *Level* is the level of the space's nested enumeration that decides the rule "
                "(*feature*: a feature rule); *reads* are the layout fields it depends on.",
                table(["rule", "why", "level", "reads"], rows))


def failures_reference() -> str:
    from search_spaces.failures import FAILURE_CLASSES

    rows = [[code(c.name), cell(c.meaning), "yes" if c.symptom else ""] for c in FAILURE_CLASSES]
    return page("Failure classes", "`search_spaces.failures.FAILURE_CLASSES`",
                "Why a failed trial failed: the class of its root cause, the earliest failure across its ranks that "
                "is not a symptom (every failing rank records its own failure; the backend also reads the node "
                "logs: gloo and NCCL aborts, torchrun's summary of the ranks that ended by a signal). The class is "
                "detail beside the trial's status, which keeps its meaning; `status` shows it with the rank and "
                "one line, as do `status --csv` (`failure_class`, `failure_rank`, `failure_reason`) and the MLflow "
                "child run's tags of the same names. A *symptom* is chosen only when every failure is one.",
                table(["class", "meaning", "symptom"], rows))


# ---- catalogs ---------------------------------------------------------------------------------------------------

def _billions(n: int) -> str:
    return f"{n / 1e9:,.1f} B" if n >= 1e8 else f"{n / 1e6:,.1f} M"


def models_reference() -> str:
    from search_spaces import MODEL_NAMES, load_model

    rows = []
    for name in MODEL_NAMES:
        m = load_model(name)
        experts = f"{m.num_experts} (top-{m.topk}" + (f", {m.num_shared_experts} shared)" if m.num_shared_experts
                                                       else ")") if m.num_experts else "dense"
        attention = "MLA" if m.is_mla else f"{m.num_attention_heads} heads, {m.num_kv_heads} KV"
        if m.sliding_window:
            attention += f", sliding window {m.sliding_window}"
        if getattr(m, "linear_num_value_heads", 0):
            attention += ", gated delta-net"
        rows.append([code(name), m.num_layers, m.hidden_size, cell(attention), cell(experts), m.vocab_size,
                     m.mtp_layers or "", _billions(m.total_params())])
    return page("Model catalog", "`search_spaces.catalog.models` (`MODEL_NAMES`, `load_model`; the configs in "
                "`search_spaces/catalog/hf_configs/`)",
                "A spec's `model:` and `--model` take one of these names or the path of a Hugging Face "
                "`config.json`.",
                table(["model", "layers", "hidden", "attention", "experts", "vocab", "MTP layers", "parameters"],
                      rows))


READING_EXAMPLES = (  # three families, as their authors publish them (tests/data/hf_configs/SOURCES.json)
    ("Llama-4-Maverick (nested text_config, interleaved MoE, chunked attention)",
     "tests/data/hf_configs/llama-4-maverick-17b-128e-instruct.json"),
    ("DeepSeek-V3 (MLA, leading dense layers, a shared expert, MTP)", "tests/data/hf_configs/deepseek-v3.json"),
    ("gpt-oss-120b (sliding window and full attention alternating, sinks)", "tests/data/hf_configs/gpt-oss-120b.json"),
)


def model_reading_reference() -> str:
    from search_spaces.catalog.models import load_model
    from search_spaces.catalog.reading import describe

    from orchestrator.commands.model import reading_lines

    parts = []
    for title, path in READING_EXAMPLES:
        lines = reading_lines(describe(load_model(str(ROOT / path))))
        parts.append(f"## {title}\n\n`moe-autotune model {path}`\n\n```\n" + "\n".join(lines) + "\n```")
    return page("How a model's config is read", "`search_spaces.catalog.reading` (`moe-autotune model`)",
                "`moe-autotune model CONFIG` shows how a Hugging Face `config.json` (or a catalog model) was read: "
                "the decoder layers by kind, the experts, the parameters, what the estimate approximates and the "
                "fields read past. A field the reader does not know, or one that changes the cost and is not "
                "modelled, is refused in one line instead (exit 2).", *parts)


def gpus_reference() -> str:
    from search_spaces import GPUS

    precisions = sorted({p for g in GPUS.values() for p in g.peak_tflops})
    rows = [[code(g.name), cell(g.description), f"{g.memory_gib:g}", g.family, g.host, g.nvlink_domain,
             f"{g.hbm_tbps:g}", f"{g.nvlink_gbps:g}", f"{g.scaleout_gbps:g}", f"{g.host_link_gbps:g}", g.sms or ""]
            for g in GPUS.values()]
    peaks = [[code(g.name), *(f"{g.peak_tflops[p]:g}" if p in g.peak_tflops else "—" for p in precisions)]
             for g in GPUS.values()]
    return page("GPU catalog", "`search_spaces.catalog.hardware.GPUS`",
                "A spec's `gpu:` and `--gpu` take one of these names. Link rates are GB/s per GPU and direction.",
                table(["GPU", "what", "memory GiB", "family", "host", "NVLink domain", "HBM TB/s", "NVLink GB/s",
                       "scale-out GB/s", "host link GB/s", "SMs"], rows),
                "## Dense peak TF/s by precision",
                table(["GPU", *(code(p) for p in precisions)], peaks))


def trainer_coverage_reference() -> str:
    from trainers import coverage

    return page("Trainer layout coverage", "`trainers.coverage.MATRIX`",
                f"Every cell runs in CI on {coverage.RANKS} CPU ranks (gloo) in one set of processes "
                "(`python -m trainers.cells`), the real trainer at each cell's layout: "
                "`tests/trainers/test_layout_matrix.py`. Each must end `ok`, its loss must fall and what Megatron-Core "
                "applied (TP, CP, EP, ETP, PP, VPP, DP, sequence parallelism) must equal the layout. A cell that "
                "differs from another layout only by TP and CP (they split the same full-size weights, so the "
                "model is the same) must give that layout's loss, to 2e-4 relative: the reference layouts that are "
                "not cells run beside them. "
                f"tiny-moe at {coverage.SEQ_LEN['tiny-moe']} tokens, the other families at "
                f"{coverage.SEQ_LEN['tiny-gpt-oss']}; MBS {coverage.BATCH['mbs']}, GBS {coverage.BATCH['gbs']}, fp32. "
                "The same test also runs layouts drawn from the sweep's own space for each tiny model (a seed of "
                "one's own: `MOE_AUTOTUNE_LAYOUT_SEED`); each must run, or be refused for one of the trainer's "
                "declared capability gaps.",
                coverage.markdown_table())


# ---- the cost model's parts -------------------------------------------------------------------------------------

def cost_modules() -> list[str]:
    """The modules of search_spaces/cost, the package's own docstring first."""
    import search_spaces.cost as cost

    return [m.name for m in pkgutil.iter_modules(cost.__path__)]


def cost_parts() -> dict[str, str]:
    """One page per module of the cost model (its docstring, via mkdocstrings) and an index linking them."""
    out = {}
    index = ["# The cost model's parts", f"!!! note \"Generated\"\n    {GENERATED} Source: `search_spaces/cost/`.",
             "::: search_spaces.cost\n    options:\n      members: false\n      show_root_heading: false",
             "One module per mechanism; each page is the module's own docstring (what it models and its sources).",
             table(["module", "what it models"],
                   ([f"[{code(name)}]({name}.md)", cell(_first_line(f"search_spaces.cost.{name}"))]
                    for name in cost_modules()))]
    out["cost-model/parts/index.md"] = "\n\n".join(index) + "\n"
    for name in cost_modules():
        out[f"cost-model/parts/{name}.md"] = (
            f"# `search_spaces.cost.{name}`\n\n"
            f"::: search_spaces.cost.{name}\n    options:\n      members: false\n      show_root_heading: false\n")
    return out


def _first_line(module: str) -> str:
    doc = importlib.import_module(module).__doc__ or ""
    return doc.strip().split("\n\n")[0]


# ---- accuracy tables from bench/results.json --------------------------------------------------------------------

def _pct(value: Any) -> str:
    return "—" if value is None else f"{float(value):.1f}%"


def accuracy_reference(results: dict | None = None) -> str:
    """The benchmark figures `bench/run_all.py` last wrote to bench/results.json, as tables."""
    if results is None:
        results = json.loads(RESULTS.read_text())
    parts = ["Figures as `bench/run_all.py` last recorded them in `bench/results.json` (the same run writes "
             "[the benchmark results](../benchmarks.md) with every row)."]
    est = (results.get("estimator_accuracy") or {}).get("result") or {}
    if est:
        parts += ["## Throughput: predicted vs published TF/s per GPU",
                  f"{est.get('count', '?')} published rows; MAPE of the fitted half and of the held-out half "
                  "(never seen by the fit).",
                  table(["rows", "MAPE", "rows counted"],
                        ([cell(k.replace("<=", "≤ ").replace(">=", "≥ ")), _pct(v.get("mape")), v.get("rows", "")]
                         for k, v in est.get("mape", {}).items()))]
        if est.get("mape_by_family"):
            parts += ["### By GPU family",
                      table(["half and family", "MAPE"],
                            ([cell(k), _pct(v)] for k, v in est["mape_by_family"].items()))]
        lc = est.get("long_context_moe") or {}
        if lc.get("mape"):
            parts += ["### Long-context MoE rows",
                      table(["half", "MAPE"], ([cell(k), _pct(v)] for k, v in lc["mape"].items()))]
        loo = est.get("leave_one_out") or {}
        if loo.get("folds"):
            parts += ["### Left out: per source, per GPU, per family",
                      "Each group left out in turn, the constants refitted on the others, its rows predicted "
                      "(`bench/leave_one_out.py`).",
                      table(["left out", "rows", "MAPE (refit without them)", "packaged calibration MAPE"],
                            ([f"{cell(f['kind'])} {cell(f['name'])}", f.get("rows", ""), _pct(f.get("mape")),
                              _pct(f.get("packaged_mape"))] for f in loo["folds"])),
                      table(["mean over folds by", "MAPE"],
                            ([cell(k), _pct(v)] for k, v in loo.get("mean", {}).items()))]
        if est.get("rows"):
            parts += ["### Every row",
                      table(["model", "GPU", "GPUs", "length", "source", "half", "published TF/s",
                             "predicted TF/s", "error"],
                            ([code(r["model"]), r["gpu"], r["num_gpus"], r["seq_len"], cell(r.get("source")),
                              r.get("half", ""), r.get("published_tflops", ""), r.get("predicted_tflops", ""),
                              _pct(r.get("error_pct"))] for r in est["rows"]))]
    knobs = (results.get("knob_effects") or {}).get("result") or {}
    if knobs:
        parts += ["## Knob effects: published same-layout A/B pairs",
                  f"{knobs.get('direction_right')}/{knobs.get('pairs')} pairs with the direction right beyond a "
                  f"{knobs.get('noise_pct')}% noise band; ratio MAPE {_pct(knobs.get('mape_held'))} held out, "
                  f"{_pct(knobs.get('mape_fit'))} fitted.",
                  table(["pair", "knob", "GPU", "half", "change", "published B/A", "predicted B/A", "error"],
                        ([code(r["pair"]), r["knob"], r["gpu"], r["half"], cell(r["changed"]), r["published"],
                          r["predicted"], _pct(r["error_pct"])] for r in knobs.get("rows", [])))]
    summary = []
    mem = (results.get("memory_accuracy") or {}).get("result") or {}
    if mem:
        summary.append(["memory model vs the CPU trainer (activations)",
                        f"MAPE {_pct(mem.get('activations_mape_pct'))}, "
                        f"max {_pct(mem.get('activations_max_pct'))}", mem.get("layouts_checked", "")])
        summary.append(["memory model vs the CPU trainer (weights, gradients, optimizer)",
                        f"max {_pct(mem.get('static_max_pct'))}", mem.get("layouts_checked", "")])
    proxy = (results.get("proxy_accuracy") or {}).get("result") or {}
    if proxy:
        summary.append(["proxy trials composed to full size", f"step MAPE {_pct(proxy.get('step_mape'))}, peak "
                        f"memory MAPE {_pct(proxy.get('peak_mape'))}", proxy.get("count", "")])
    cpu = (results.get("cpu_calibration") or {}).get("result") or {}
    if cpu.get("after"):
        summary.append(["`estimate --gpu cpu` vs the CPU trainer (held out)", f"tokens/s MAPE "
                        f"{_pct(cpu['after'].get('tokens_mape'))}, peak memory {_pct(cpu['after'].get('peak_mape'))}",
                        cpu.get("held_layouts", "")])
    transfer = (results.get("transfer_check") or {}).get("result") or {}
    if transfer:
        summary.append(["calibrated ranking at a new length (Spearman)", f"{transfer.get('spearman_before')} → "
                        f"{transfer.get('spearman_after')}", transfer.get("tested_on", "")])
    if summary:
        parts += ["## Memory, proxies and calibration", table(["check", "figure", "layouts"], summary)]
    return page("Accuracy tables", "`bench/results.json`, written by `bench/run_all.py`", *parts)


# ---- a worked example: one estimate, drawn ---------------------------------------------------------------------

# the README's first estimate: DeepSeek-V3 at 128K on 256 H100 (the seed recipe of shared/notes/long-context-moe.md)
EXAMPLE = {"model": "deepseek-v3", "gpu": "h100", "num_gpus": 256, "seq_len": 131072,
           "layout": {"tp": 1, "cp": 32, "ep": 32, "etp": 1, "pp": 8, "vpp": 4, "mbs": 1, "gbs": 128,
                      "precision": "fp8", "dispatcher": "deepep", "recompute": "mla_up_proj,layernorm,moe,mlp",
                      "cuda_graphs": "none", "optimizer_offload": 1.0, "cp_comm_type": "a2a+p2p",
                      "hierarchical_cp": [8, 4]}}
UNIT_NAMES = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "final norm, output layer and loss"}


def pipeline_drawing(layout_string: str, pp: int, vpp: int) -> str:
    """Megatron's pipeline layout string drawn as a grid: virtual stage s runs on pipeline rank s mod PP as its
    chunk s div PP (the interleaved schedule), so each row is one rank and each column one of its chunks."""
    stages = layout_string.split("|")
    grid = [["" for _ in range(vpp)] for _ in range(pp)]
    for s, units in enumerate(stages):
        grid[s % pp][s // pp] = " ".join(units) or "(empty)"
    return table(["pipeline rank", *(f"chunk {c}" for c in range(vpp))],
                 ([str(r), *(code(cell_) for cell_ in row)] for r, row in enumerate(grid)))


def bars(values: dict[str, float], unit: str) -> str:
    """Components as a table of horizontal bars (HTML widths), in the breakdown's order, zeros left out."""
    shown = [(k, v) for k, v in values.items() if v > 0]
    top = max((v for _, v in shown), default=1.0)
    bar = '<span style="display:inline-block;height:0.8em;width:{w:.0f}px;background:#5c6bc0"></span>'
    return table(["component", unit, ""], ([code(k), f"{v:,.3f}", bar.format(w=240 * v / top)] for k, v in shown))


def example_reference() -> str:
    """One estimate of EXAMPLE, as `moe-autotune estimate --json` gives it, drawn: the pipeline placement, the
    memory of the most loaded rank and the step time by component."""
    from search_spaces import Layout, estimate
    from search_spaces.cost.breakdown import PEAK_KEYS

    layout = Layout.from_dict(EXAMPLE["layout"])
    est = estimate(EXAMPLE["model"], EXAMPLE["gpu"], EXAMPLE["num_gpus"], EXAMPLE["seq_len"], layout).to_dict()
    flags = " ".join(f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
                     for k, v in EXAMPLE["layout"].items())
    command = (f"moe-autotune estimate --model {EXAMPLE['model']} --gpu {EXAMPLE['gpu']} --num-gpus "
               f"{EXAMPLE['num_gpus']} --seq-len {EXAMPLE['seq_len']} {flags}")
    from search_spaces.catalog.hardware import load_gpu

    from orchestrator.commands.estimate import precision_class

    precision = est["layout"]["precision"]
    peak = load_gpu(str(EXAMPLE["gpu"])).peak(precision)
    summary = table(["figure", "predicted"], [
        ["fits", f"{est['fits']} ({est['peak_memory_gib']:.1f} of {est['memory_capacity_gib']:.1f} GiB per GPU)"],
        ["tokens/s per GPU", f"{est['tokens_per_sec_per_gpu']:,.1f}"],
        ["TF/s per GPU (Bridge's FLOP count)", f"{est['tflops_per_gpu']:,.1f}"],
        [f"MFU vs {precision_class(precision)} dense peak ({peak:,.1f} TF/s per GPU, {precision})",
         f"{100 * est['mfu']:.1f}%"], ["step time", f"{est['step_time_s']:,.2f} s"]])
    legend = ", ".join(f"`{u}` {name}" for u, name in UNIT_NAMES.items())
    return page("A worked example: one estimate, drawn", "`search_spaces.estimate` on `EXAMPLE` in docs/refgen.py",
                "The cost model's answer (predicted, not measured) for the README's first command (DeepSeek-V3 at "
                "128K tokens on 256 H100, the seed recipe), computed when this page was built:",
                f"```bash\n{command}\n```", summary,
                "## Where the layers go",
                f"Megatron's pipeline layout string `{est['pipeline_layout']}`, one row per pipeline rank and one "
                f"column per virtual chunk (the interleaved schedule runs chunk 0 of every rank, then chunk 1, ...). "
                f"Units: {legend}.",
                pipeline_drawing(est["pipeline_layout"], EXAMPLE["layout"]["pp"], EXAMPLE["layout"]["vpp"]),
                "## Memory of the most loaded pipeline rank",
                "The components whose sum is the predicted peak, GiB:",
                bars({k: v for k, v in est["breakdown"]["memory_gib"].items() if k in PEAK_KEYS}, "GiB"),
                "## Time per step",
                "Components of the most loaded rank's step (`compute` includes its GEMM, attention and element-wise "
                "parts, listed after it).",
                bars(est["breakdown"]["time_s"], "seconds"))


# ---- every page -------------------------------------------------------------------------------------------------

def pages() -> dict[str, str]:
    """Every generated page, keyed by its path under docs/."""
    return {
        "reference/cli.md": cli_reference(),
        "reference/spec.md": spec_reference(),
        "reference/dimensions.md": dimensions_reference(),
        "reference/rules.md": rules_reference(),
        "reference/failures.md": failures_reference(),
        "reference/models.md": models_reference(),
        "reference/model-reading.md": model_reading_reference(),
        "reference/gpus.md": gpus_reference(),
        "reference/accuracy.md": accuracy_reference(),
        "reference/example.md": example_reference(),
        "reference/trainer-coverage.md": trainer_coverage_reference(),
        **cost_parts(),
    }
