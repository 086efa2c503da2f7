"""The published measurements the cost model is calibrated and scored on, as `Measurement`s.

Files (search_spaces/calibration/reference/, copies of ../shared/reference; README there says what each column means):
- megatron_bridge_performance_summary.csv: Megatron-Bridge's performance summary, newest release of each
  (model, system, GPUs, length, precision) that a Layout can express (no FSDP, no NVFP4, catalog models only);
  recompute / CUDA graphs / dispatcher that the table does not print are read from Megatron-Bridge's recipes
  (RECIPE_SETTINGS), otherwise DeepEP on 8-GPU NVLink systems, HybridEP on NVL72, no recompute, no graphs.
- skill_card_measurements.csv: Megatron-Bridge's MoE skill card.
- moe_4k_more.csv: more MoE rows at 4K (Megatron-MoE-ModelZoo, skill cards); FSDP rows and rows already in
  the skill card are left out.
- moe_long_context.csv: MoE rows from 4K to 256K with CP (Megatron-MoE-ModelZoo's Qwen3-235B on H100 and GB300,
  Megatron-Bridge's long-context card: DeepSeek-V3 on H100, Qwen3-Next on GB200, Qwen3-235B on GB200), layouts as
  published, what was not published marked in `assumed`; scored apart (`long_context_moe_rows`), each row with
  its best CP communication type (none is published), so the published_rows() figures stay comparable.
- long_sequence_dense_cp.csv: Llama2-7B (H100) and Llama3-8B (B200) from 4K/8K to 1M tokens with CP (NeMo). Their
  TF/s are NeMo's count, whose Llama formula (NVIDIA/NeMo nemo/utils/flops_formulas.py, llama2/llama3) counts the
  whole attention square (12 S/h per layer and token) where Bridge counts the causal half: they are converted
  to Bridge's count (`nemo_to_bridge`), with the same tokens/s. cp_comm_type as run: p2p (NeMo's default then).

Every row is a `Measurement` in Bridge's FLOP accounting (`search_spaces.cost.flops`). MoE rows say their routing:
forced_balance (the benchmarks' `moe_router_force_load_balancing`, what the cost model's constants are fitted on)
unless the row says otherwise (the skill card's `routing` column); the summary's "(dropless)" and "(tokendrop)"
rows name no catalog model and are left out. Pure Python.
"""

from __future__ import annotations

import csv
from pathlib import Path

from search_spaces.calibration.fit import Measurement, model_spec
from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import ModelSpec, load_model
from search_spaces.cost.flops import flops_per_token
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

DATA = Path(__file__).parent / "reference"
# who published each row: the sources a leave-one-source-out fold leaves out (bench/estimator_accuracy.py)
SUMMARY, CARDS, MODELZOO, NEMO = ("Megatron-Bridge performance summary", "Megatron-Bridge skill cards",
                                  "Megatron-MoE-ModelZoo", "NeMo long-sequence tables")
ORIGINS = (SUMMARY, CARDS, MODELZOO, NEMO)


def _origin(source_text: str) -> str:
    """The publisher a card-or-ModelZoo row's `source` column names."""
    return MODELZOO if "Megatron-MoE-ModelZoo" in source_text else CARDS


def _container(source_text: str) -> tuple[tuple[str, str], ...]:
    """What a card-or-ModelZoo row says of the software it ran: they publish a commit, not a container."""
    where = source_text.split(" (", 1)[0].split(";", 1)[0].strip()
    return (("container", f"not published ({where})"),)
MODELS = {"DeepSeekV3": "deepseek-v3", "DeepSeekV3 (w/o MTP)": "deepseek-v3-no-mtp", "Kimi_K2": "kimi-k2",
          "Qwen3_235B_a22B": "qwen3-235b-a22b", "Qwen3_30B_a3B": "qwen3-30b-a3b", "GPT OSS 120B": "gpt-oss-120b",
          "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3.1-405b", "LLAMA3_8B": "llama3-8b",
          "qwen3-next-80b-a3b": "qwen3-next-80b-a3b"}
PRECISIONS = {"BF16": "bf16", "FP8": "fp8-tensorwise", "FP8-CS": "fp8-tensorwise", "FP8-MX": "mxfp8",
              "MXFP8": "mxfp8", "FP8-CS (FP8-MX)": "fp8-tensorwise", "fp8-block": "fp8-blockwise",
              "bf16": "bf16", "mxfp8": "mxfp8", "fp8": "fp8-delayed", "fp8-blockwise": "fp8-blockwise"}
# Settings the summary table does not print (recompute, CUDA graphs, dispatcher), read from Megatron-Bridge:
# rows of release 26.06+ from its perf recipes at the commit the summary was taken from (067f987,
# src/megatron/bridge/perf_recipes/<model>/<gpu>/*.py); rows of release 26.04.x from the legacy configs of that
# time (commit 0a21da4, 2026-05-20: scripts/performance/configs/*/*_workload_base_configs.py and the recipes'
# default dispatcher). Other rows keep the defaults. (model, gpu, precision) -> (recompute, cuda_graphs, dispatcher)
_TE_GRAPHS = "attn,moe_router,moe_preprocess"
RECIPE_SETTINGS = {
    "26.06+": {
        ("deepseek-v3", "gb300", "mxfp8"): ("none", "full_iteration", "hybridep"),
        ("deepseek-v3", "gb200", "mxfp8"): ("mla_up_proj", _TE_GRAPHS, "hybridep"),
        ("gpt-oss-120b", "gb300", "mxfp8"): ("none", "full_iteration", "hybridep"),
        ("gpt-oss-120b", "gb200", "mxfp8"): ("none", "full_iteration", "hybridep"),
        ("gpt-oss-120b", "b300", "mxfp8"): ("none", _TE_GRAPHS, "hybridep"),
        ("qwen3-30b-a3b", "gb300", "mxfp8"): ("none", "full_iteration", "hybridep"),
        ("qwen3-30b-a3b", "gb200", "mxfp8"): ("none", "full_iteration", "hybridep"),
        ("qwen3-30b-a3b", "b300", "mxfp8"): ("none", "full_iteration", "hybridep"),
        ("qwen3-30b-a3b", "h100", "fp8-tensorwise"): ("none", _TE_GRAPHS, "hybridep"),
        ("qwen3-235b-a22b", "gb300", "mxfp8"): ("none", "full_iteration", "hybridep"),
        ("qwen3-235b-a22b", "gb200", "mxfp8"): ("none", "full_iteration", "hybridep"),
        ("kimi-k2", "gb300", "mxfp8"): ("mla_up_proj", "none", "hybridep"),
    },
    "26.04": {
        ("gpt-oss-120b", "gb300", "bf16"): ("none", _TE_GRAPHS, "alltoall"),
        ("gpt-oss-120b", "gb200", "bf16"): ("layernorm,moe_act", "none", "alltoall"),
        ("gpt-oss-120b", "b300", "bf16"): ("none", _TE_GRAPHS, "hybridep"),
        ("gpt-oss-120b", "b200", "bf16"): ("layernorm,moe_act", "none", "alltoall"),
        ("gpt-oss-120b", "h100", "bf16"): ("layernorm,moe_act", "none", "alltoall"),
        ("qwen3-235b-a22b", "b200", "mxfp8"): ("none", "none", "alltoall"),
    },
}
# The EP all-to-all overlap (Megatron-Bridge's moe_a2a_overlap / comm_overlap.overlap_moe_expert_parallel_comm) of the
# summary's MoE rows, from the config of each row's own release: 26.08 from the perf recipes at 067f987
# (perf_recipes/{deepseek,gpt_oss,qwen}/common.py turn it on for every row); 26.06 from the v0.5.0 tag's legacy
# configs (the perf recipes postdate the 26.06 table); 26.04.01 from 0a21da4's
# scripts/performance/configs/*/*_workload_base_configs.py; 25.11 from branch gaod/r0.2.0_test (4a82e1651, the
# configs that reproduce that table's layouts). A field left unset is off (CommOverlapConfig sets it False).
# (release, model, gpu, precision) of the rows that ran it; every other summary row ran without it.
EP_OVERLAP_ON = {
    *{("26.08", model, gpu, "mxfp8") for model in ("deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b")
      for gpu in ("gb300", "gb200")},
    ("26.06", "qwen3-30b-a3b", "b300", "mxfp8"),
    ("26.04.01", "deepseek-v3", "b200", "mxfp8"),
    ("26.04.01", "gpt-oss-120b", "gb200", "bf16"),
    ("26.04.01", "qwen3-235b-a22b", "h100", "fp8-tensorwise"),
    ("25.11", "qwen3-235b-a22b", "b200", "mxfp8"),
}
# NeMo's Llama FLOP formula (nemo/utils/flops_formulas.py) uses these vocabularies (LLM_VOCAB_SIZE_MAP)
NEMO_VOCAB = {"llama2-7b": 32000, "llama3-8b": 128256}


def _int(text: str | None, default: int = 1) -> int:
    text = (text or "").strip()
    if not text or text.lower() in ("n/a", "no"):
        return default
    return int(float(text.split()[0]))


def _first_number(cell: str) -> float:
    """A table cell's figure: the first of "37556 (36108)" (the summary prints a second run in brackets)."""
    return float(cell.split()[0])


def _release(text: str) -> tuple:
    """'bridge-26.04.01' -> (26, 4, 1)."""
    return tuple(int(p) for p in text.rsplit("-", 1)[-1].split(".") if p.isdigit())


def _recipe_settings(model: str, gpu: str, precision: str, release: str):
    era = "26.06+" if _release(release) >= (26, 6) else "26.04" if _release(release)[:2] == (26, 4) else None
    if era is None:  # an earlier release: no recipe settings recorded
        return None
    return RECIPE_SETTINGS.get(era, {}).get((model.replace("-no-mtp", ""), gpu, precision))


def _routing(r: dict, moe: bool) -> str:
    """A row's routing: its own column where it has one, else forced balance for MoE rows (dense: none)."""
    return (r.get("routing") or "").strip() or ("forced_balance" if moe else "dropless")


def _default_dispatcher(gpu: str) -> str:
    return "hybridep" if load_gpu(gpu).nvlink_domain > 8 else "deepep"


def _summary_row(r: dict) -> Measurement | None:
    model, precision = MODELS.get(r["model"]), PRECISIONS.get(r["precision"].strip())
    if not model or not precision or _int(r["fsdp"], 0) > 0:
        return None
    gpu = r["system"].replace("DGX-", "").lower()
    try:
        spec = model_spec(model)
        layout = Layout(tp=_int(r["tp"]), cp=_int(r["cp"]), pp=_int(r["pp"]), vpp=_int(r["vp"]),
                        ep=_int(r["ep"]) if spec.is_moe else 1, mbs=int(r["mbs"]), gbs=int(r["gbs"]),
                        precision=precision, dispatcher=_default_dispatcher(gpu) if spec.is_moe else "alltoall",
                        routing=_routing(r, spec.is_moe))
        tflops = _first_number(r["tflops_per_gpu"])
        # the measured quantity is tokens/s; the TF/s beside it is in that release's FLOP count, which for
        # gpt-oss up to 26.04.01 was 0.83x today's (TF/s / tokens/s per release; flops.py counts today's)
        tokens = _first_number(r["tokens_per_sec_per_gpu"]) if (r.get("tokens_per_sec_per_gpu") or "").strip() \
            else None
        if not load_gpu(gpu).supports(precision):
            return None
    except (SpecError, ValueError):
        return None
    known = _recipe_settings(model, gpu, precision, r["release"])
    if known:
        rc, graphs, dispatcher = known
        layout = Layout.from_dict({**layout.to_dict(), "recompute": rc, "cuda_graphs": graphs,
                                   "dispatcher": dispatcher})
    if (r["release"], model.replace("-no-mtp", ""), gpu, precision) in EP_OVERLAP_ON:
        layout = layout.replace(ep_overlap=True)
    return Measurement(model, gpu, int(r["num_gpus"]), int(r["seq_len"]), layout, tflops_per_gpu=tflops,
                       tokens_per_sec_per_gpu=tokens, source="summary " + r["release"],
                       release="bridge-" + r["release"], origin=SUMMARY,
                       software=(("container", "NeMo " + r["release"]),))


def summary_rows(path: Path = DATA / "megatron_bridge_performance_summary.csv") -> list[Measurement]:
    """Newest release of each (model, system, GPUs, length, precision) of the summary that we can express."""
    newest: dict[tuple, list[Measurement]] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            row = _summary_row(r)
            if row is None:
                continue
            key = (row.model, row.gpu, row.num_gpus, row.seq_len, row.layout.precision)
            old = newest.get(key)
            if not old or _release(row.release) > _release(old[0].release):
                newest[key] = [row]
            elif _release(row.release) == _release(old[0].release):
                old.append(row)
    return [row for rows in newest.values() for row in rows]


def summary_rows_every_release(path: Path = DATA / "megatron_bridge_performance_summary.csv"
                               ) -> list[Measurement]:
    """Every release of every summary row we can express (search_spaces.catalog.maturity measures releases on them)."""
    with open(path, newline="") as fh:
        return [row for r in csv.DictReader(fh) for row in [_summary_row(r)] if row is not None]


def _card_layout(r: dict, precision: str) -> Layout:
    rc = (r.get("recompute") or "").strip() or "none"
    moe = model_spec(MODELS.get(r["model"], r["model"])).is_moe
    return Layout.from_dict(dict(
        tp=_int(r["tp"]), cp=_int(r["cp"]), pp=_int(r["pp"]), vpp=_int(r["vpp"]), ep=_int(r["ep"]),
        etp=_int(r["etp"]), mbs=_int(r["mbs"]), gbs=int(r["gbs"]), precision=precision,
        dispatcher=r["dispatcher"] or "alltoall", recompute=rc.replace(";", ","),
        cuda_graphs=(r["cuda_graphs"] or "none").replace(";", ","),
        optimizer_offload=float(_int(r.get("optimizer_offload"), 0)),
        cp_comm_type=(r.get("cp_comm_type") or "p2p").strip() or "p2p", routing=_routing(r, moe),
        ep_overlap=(r.get("ep_overlap") or "false").strip().lower() == "true"))


def skill_card_rows(path: Path = DATA / "skill_card_measurements.csv") -> list[Measurement]:
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            model = r["model"] if r["model"] in MODELS.values() or r["model"] == "deepseek-v3-no-mtp" \
                else MODELS.get(r["model"])
            precision = PRECISIONS.get(r["precision"].strip())
            if model and precision:
                out.append(Measurement(model, r["gpu"], int(r["num_gpus"]), int(r["seq_len"]),
                                       _card_layout(r, precision), tflops_per_gpu=float(r["tflops_per_gpu"]),
                                       source="skill card", origin=CARDS, software=_container(
                                           "Megatron-Bridge " + r["source"] + " @067f987df")))
    return out


def moe_more_rows(path: Path = DATA / "moe_4k_more.csv", known: list[Measurement] | None = None
                  ) -> list[Measurement]:
    """moe_4k_more.csv without FSDP rows and without rows the skill card already holds (same model, GPU, GPUs,
    length and layout)."""
    seen = {(m.model, m.gpu, m.num_gpus, m.seq_len, m.layout) for m in (known or skill_card_rows())}
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if "FSDP on" in r["source"]:
                continue
            layout = _card_layout(r, PRECISIONS[r["precision"].strip()])
            row = Measurement(r["model"], r["gpu"], int(r["num_gpus"]), int(r["seq_len"]), layout,
                              tflops_per_gpu=float(r["tflops_per_gpu"]) if r["tflops_per_gpu"] else None,
                              tokens_per_sec_per_gpu=float(r["tokens_per_sec_per_gpu"])
                              if r["tokens_per_sec_per_gpu"] else None, source="moe_4k_more",
                              origin=_origin(r["source"]), software=_container(r["source"]))
            if (row.model, row.gpu, row.num_gpus, row.seq_len, row.layout) not in seen:
                out.append(row)
    return out


def nemo_llama_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """NeMo's Llama count per token: L h^2 (12 + 12 g/a + 18 ffn/h + 12 S/h + 6 V/(L h)) -- the whole square."""
    h, layers = model.hidden_size, model.num_layers
    per = (12 + 12 * model.num_kv_heads / model.num_attention_heads + 18 * model.ffn_hidden_size / h
           + 12 * seq_len / h + 6 * NEMO_VOCAB[model.name] / (layers * h))
    return layers * h * h * per


def nemo_to_bridge(model: ModelSpec, seq_len: int) -> float:
    """Factor from a NeMo-counted Llama TF/s to Bridge's count (same tokens/s): Bridge FLOPs / NeMo FLOPs."""
    return flops_per_token(model, seq_len) / nemo_llama_flops_per_token(model, seq_len)


def long_sequence_rows(path: Path = DATA / "long_sequence_dense_cp.csv") -> list[Measurement]:
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            spec, seq = load_model(r["model"]), int(r["seq_len"])
            layout = _card_layout({**r, "mbs": r["mbs"] or "1", "dispatcher": "alltoall"}, PRECISIONS[r["precision"]])
            container = r["source"].split("container NeMo ", 1)[1].split(".framework")[0].split(";")[0]
            out.append(Measurement(r["model"], r["gpu"], int(r["num_gpus"]), seq, layout,
                                   tflops_per_gpu=float(r["tflops_per_gpu"]) * nemo_to_bridge(spec, seq),
                                   source="nemo long sequence", release="nemo-" + container, origin=NEMO,
                                   software=(("container", "NeMo " + container),)))
    return out


LONG_CONTEXT_MOE_SOURCE = "moe long context"


def long_context_moe_rows(path: Path = DATA / "moe_long_context.csv") -> list[Measurement]:
    """The long-context MoE rows (moe_long_context.csv), cp_comm_type left at p2p: score them with each row's
    best type (none is published)."""
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            layout = _card_layout(r, PRECISIONS[r["precision"].strip()])
            out.append(Measurement(r["model"], r["gpu"], int(r["num_gpus"]), int(r["seq_len"]), layout,
                                   tflops_per_gpu=float(r["tflops_per_gpu"]), source=LONG_CONTEXT_MOE_SOURCE,
                                   release=r["series"], origin=_origin(r["source"]),
                                   software=_container(r["source"])))
    return out


def published_rows() -> list[Measurement]:
    """Every published row the cost model can express, in a fixed order (the declared halves depend on it)."""
    cards = skill_card_rows()
    return summary_rows() + cards + moe_more_rows(known=cards) + long_sequence_rows()


def declared_halves(rows: list[Measurement]) -> tuple[list[Measurement], list[Measurement]]:
    """(fit, held out): every other row of each source in file order -- for the long-sequence series every other
    length of each model, so both halves span 4K/8K to 1M."""
    fit: list[Measurement] = []
    held: list[Measurement] = []
    by_series: dict[tuple, int] = {}
    for row in rows:
        series = (row.source, row.model, row.gpu) if row.source in ("nemo long sequence", LONG_CONTEXT_MOE_SOURCE) \
            else (row.source.split()[0],)
        n = by_series.get(series, 0)
        by_series[series] = n + 1
        (fit if n % 2 == 0 else held).append(row)
    return fit, held
