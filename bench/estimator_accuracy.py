"""Predicted vs published TF/s/GPU for every reference row the cost model can express.

Rows: tests/data/megatron_bridge_performance_summary.csv (Megatron-Bridge performance summary, newest
release of each configuration) and tests/data/skill_card_measurements.csv (Megatron-Bridge MoE skill card),
copied from ../shared/reference. Rows are skipped when the model is not in the catalog, the precision is
not one of ours (NVFP4), FSDP is used, or routing is token-drop. Unknown dispatcher: DeepEP on 8-GPU
NVLink systems, HybridEP on NVL72; unknown recompute / graphs: none -- except for rows of releases 26.04.x
and 26.06+, whose recipes were read from Megatron-Bridge's history (RECIPE_SETTINGS below).

    .venv/bin/python bench/estimator_accuracy.py          # table + MAPE per GPU family
`run()` returns the figures as a dict (bench/run_all.py reuses it).
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_spaces.costmodel import estimate  # noqa: E402
from search_spaces.errors import SpecError  # noqa: E402
from search_spaces.hardware import load_gpu  # noqa: E402
from search_spaces.layout import Layout  # noqa: E402
from search_spaces.models import load_model  # noqa: E402
from search_spaces.throughput import gpu_family  # noqa: E402

DATA = ROOT / "tests" / "data"
MODELS = {"DeepSeekV3": "deepseek-v3", "DeepSeekV3 (w/o MTP)": "deepseek-v3-no-mtp", "Kimi_K2": "kimi-k2",
          "Qwen3_235B_a22B": "qwen3-235b-a22b", "Qwen3_30B_a3B": "qwen3-30b-a3b", "GPT OSS 120B": "gpt-oss-120b",
          "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3.1-405b", "LLAMA3_8B": "llama3-8b",
          "qwen3-next-80b-a3b": "qwen3-next-80b-a3b"}
PRECISIONS = {"BF16": "bf16", "FP8": "fp8-tensorwise", "FP8-CS": "fp8-tensorwise", "FP8-MX": "mxfp8",
              "MXFP8": "mxfp8", "FP8-CS (FP8-MX)": "fp8-tensorwise", "fp8-block": "fp8-blockwise",
              "bf16": "bf16", "mxfp8": "mxfp8"}


@dataclasses.dataclass
class Row:
    source: str
    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    layout: Layout
    published_tflops: float
    release: str = ""

    @property
    def family(self) -> str:
        return gpu_family(load_gpu(self.gpu))


def _model(name: str):
    if name == "deepseek-v3-no-mtp":
        return dataclasses.replace(load_model("deepseek-v3"), name=name, mtp_layers=0)
    return load_model(name)


def _int(text: str, default: int = 1) -> int:
    text = (text or "").strip()
    if not text or text.lower() == "n/a":
        return default
    return int(float(text.split()[0]))


def _first_number(text: str) -> float:
    return float(text.split()[0])


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


def _recipe_settings(model: str, gpu: str, precision: str, release: str):
    era = "26.06+" if _release(release) >= (26, 6) else "26.04" if _release(release)[:2] == (26, 4) else None
    return RECIPE_SETTINGS.get(era, {}).get((model.replace("-no-mtp", ""), gpu, precision))


def _dispatcher(gpu: str) -> str:
    return "hybridep" if load_gpu(gpu).nvlink_domain > 8 else "deepep"


def summary_rows(path: Path = DATA / "megatron_bridge_performance_summary.csv") -> list[Row]:
    """Newest release of each (model, system, GPUs, length, precision) of the summary that we can express."""
    # older releases of the same configuration ran older software (much slower): keep only the newest
    newest: dict[tuple, list[Row]] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            model = MODELS.get(r["model"])
            precision = PRECISIONS.get(r["precision"].strip())
            if not model or not precision or _int(r["fsdp"], 0) > 0:
                continue
            gpu = r["system"].replace("DGX-", "").lower()
            try:
                g = load_gpu(gpu)
                spec = _model(model)
                world, gbs, mbs = int(r["num_gpus"]), int(r["gbs"]), int(r["mbs"])
                layout = Layout(tp=_int(r["tp"]), cp=_int(r["cp"]), pp=_int(r["pp"]), vpp=_int(r["vp"]),
                                ep=_int(r["ep"]) if spec.is_moe else 1, mbs=mbs, gbs=gbs, precision=precision,
                                dispatcher=_dispatcher(gpu) if spec.is_moe else "alltoall")
                tflops = _first_number(r["tflops_per_gpu"])
            except (SpecError, ValueError):
                continue
            if not g.supports(precision):
                continue
            known = _recipe_settings(model, gpu, precision, r["release"])
            if known:
                rc, graphs, dispatcher = known
                layout = Layout.from_dict({**layout.to_dict(), "recompute": rc, "cuda_graphs": graphs,
                                           "dispatcher": dispatcher})
            key = (model, gpu, world, int(r["seq_len"]), precision)
            row = Row("summary " + r["release"], model, gpu, world, int(r["seq_len"]), layout, tflops, r["release"])
            old = newest.get(key)
            if not old or _release(row.release) > _release(old[0].release):
                newest[key] = [row]
            elif _release(row.release) == _release(old[0].release):
                old.append(row)
    return [row for rows in newest.values() for row in rows]


def _release(text: str) -> tuple:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def skill_card_rows(path: Path = DATA / "skill_card_measurements.csv") -> list[Row]:
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            model = r["model"] if r["model"] in MODELS.values() else MODELS.get(r["model"])
            if r["model"] == "deepseek-v3-no-mtp":
                model = "deepseek-v3-no-mtp"
            precision = PRECISIONS.get(r["precision"].strip())
            if not model or not precision:
                continue
            rc = r["recompute"].strip() or "none"
            layout = Layout.from_dict(dict(
                tp=_int(r["tp"]), cp=_int(r["cp"]), pp=_int(r["pp"]), vpp=_int(r["vpp"]), ep=_int(r["ep"]),
                etp=_int(r["etp"]), mbs=int(r["mbs"]), gbs=int(r["gbs"]), precision=precision,
                dispatcher=r["dispatcher"] or "alltoall", recompute=rc.replace(";", ","),
                cuda_graphs=r["cuda_graphs"].replace(";", ",") or "none"))
            out.append(Row("skill card", model, r["gpu"], int(r["num_gpus"]), int(r["seq_len"]), layout,
                           float(r["tflops_per_gpu"])))
    return out


def all_rows() -> list[Row]:
    return summary_rows() + skill_card_rows()


def predict(row: Row, cal: dict | None = None) -> float | None:
    """Predicted TF/s/GPU, or None when the layout breaks a rule."""
    from search_spaces.flops import flops_per_step
    from search_spaces.throughput import step_time
    from search_spaces.rules import check
    model, gpu = _model(row.model), load_gpu(row.gpu)
    if check(model, gpu, row.num_gpus, row.seq_len, row.layout):
        return None
    if cal is None:
        est = estimate(model, gpu, row.num_gpus, row.seq_len, row.layout)
        return est.tflops_per_gpu
    step = step_time(model, gpu, row.num_gpus, row.seq_len, row.layout, cal)["step"]
    return flops_per_step(model, row.seq_len, row.layout.gbs) / step / row.num_gpus / 1e12


def run(rows: list[Row] | None = None, cal: dict | None = None, verbose: bool = False) -> dict:
    """{'rows': [...], 'mape': {family: %}, 'mape_all': %, 'skipped': n}."""
    rows = rows if rows is not None else all_rows()
    out, skipped = [], 0
    for row in rows:
        pred = predict(row, cal)
        if pred is None:
            skipped += 1
            continue
        err = (pred - row.published_tflops) / row.published_tflops
        out.append({"source": row.source, "model": row.model, "gpu": row.gpu, "family": row.family,
                    "num_gpus": row.num_gpus, "seq_len": row.seq_len, "layout": row.layout.key(),
                    "published_tflops": row.published_tflops, "predicted_tflops": round(pred, 1),
                    "error_pct": round(100 * err, 1)})
    mape = {}
    for fam in sorted({r["family"] for r in out}):
        errs = [abs(r["error_pct"]) for r in out if r["family"] == fam]
        mape[fam] = round(sum(errs) / len(errs), 1)
    by_gpu = {}
    for g in sorted({r["gpu"] for r in out}):
        errs = [abs(r["error_pct"]) for r in out if r["gpu"] == g]
        by_gpu[g] = round(sum(errs) / len(errs), 1)
    all_errs = [abs(r["error_pct"]) for r in out]
    return {"rows": out, "mape": mape, "mape_by_gpu": by_gpu,
            "mape_all": round(sum(all_errs) / max(len(all_errs), 1), 1), "count": len(out), "skipped": skipped}


def main() -> None:
    result = run()
    print(f"{'source':14} {'model':20} {'gpu':6} {'n':>5} {'seq':>6} {'published':>9} {'predicted':>9} {'err%':>6}  layout")
    for r in result["rows"]:
        print(f"{r['source']:14} {r['model']:20} {r['gpu']:6} {r['num_gpus']:5d} {r['seq_len']:6d} "
              f"{r['published_tflops']:9.0f} {r['predicted_tflops']:9.0f} {r['error_pct']:6.1f}  {r['layout']}")
    print(f"\n{result['count']} rows expressed ({result['skipped']} broke a legality rule and were skipped)")
    for fam, m in result["mape"].items():
        print(f"MAPE {fam:10} {m:5.1f}%")
    for g, m in result["mape_by_gpu"].items():
        print(f"MAPE {g:10} {m:5.1f}%")
    print(f"MAPE all        {result['mape_all']:5.1f}%")



def section(r: dict) -> list[str]:
    """The RESULTS.md section (bench/run_all.py)."""
    lines = [f"Predicted vs published TF/s/GPU on {r['count']} published rows (Megatron-Bridge performance summary "
             f"and MoE skill card; {r['skipped']} rows skipped as not expressible). **MAPE, all rows: {r['mape_all']}%**",
             "", "| GPU family | MAPE % |", "|---|---|"]
    lines += [f"| {fam} | {v} |" for fam, v in r["mape"].items()]
    lines += ["", "| GPU | MAPE % |", "|---|---|"]
    lines += [f"| {gpu} | {v} |" for gpu, v in r.get("mape_by_gpu", {}).items()]
    lines += ["", "<details><summary>every row</summary>", "",
              "| model | gpu | GPUs | seq | published | predicted | error % |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {x['model']} | {x['gpu']} | {x['num_gpus']} | {x['seq_len']} | {x['published_tflops']} | "
              f"{x['predicted_tflops']} | {x['error_pct']} |" for x in r["rows"]]
    return lines + ["", "</details>"]


if __name__ == "__main__":
    main()
