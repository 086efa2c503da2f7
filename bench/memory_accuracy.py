"""Memory accuracy: the memory model against the real CPU trainer, component by component and term by term.

Each study layout runs the real Megatron-Core trainer (trainers.megatron_moe, gloo, fp32, one warm-up and one
measured step) and reads back what trainers/measure.py counted on the most loaded rank: weights, gradients,
optimizer states, and the activations one microbatch saves for backward, attributed to the module that saved
each tensor. trainers/activation_terms.py maps the saving modules onto the activation terms of
search_spaces/cost/memory.py, so that every term is checked on its own, beside the components.

Nothing is fitted: each term is written from what Megatron-Core saves (which tensor, dtype, sharding). The
layouts whose per-module records were read while the CPU terms were written or corrected are the `derive`
part; the others (`check`) were only ever scored, and the summary line scores those alone.

    .venv/bin/python bench/memory_accuracy.py              # measurements from bench/memory_measurements.json
    .venv/bin/python bench/memory_accuracy.py --remeasure  # run every layout again (~20 min on 2 cores)

Layouts missing from the cache (or whose flags changed) are measured either way. `run()` returns the
figures as a dict (bench/run_all.py reuses it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search_spaces.catalog.hardware import load_gpu  # noqa: E402
from search_spaces.catalog.models import load_model  # noqa: E402
from search_spaces.cost.memory import chunk_activation_terms, rank_memory_breakdown  # noqa: E402
from search_spaces.cost.pipeline import placement  # noqa: E402
from search_spaces.layouts.layout import Layout  # noqa: E402

from trainers.activation_terms import LAYER, measured_terms  # noqa: E402

CACHE = Path(__file__).with_name("memory_measurements.json")
MODELS = ROOT / "tests" / "data" / "models"
STATIC = ("weights", "gradients", "optimizer_states")
COMPONENTS = STATIC + ("activations_per_microbatch",)
MIB = float(1 << 20)
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Case:
    name: str
    nproc: int
    flags: tuple[str, ...]
    model: str = "tiny-moe"
    part: str = "check"  # derive: its per-module record was read while the terms were written

    def model_arg(self) -> str:
        path = MODELS / f"{self.model}.json"
        return str(path.relative_to(ROOT)) if path.is_file() else self.model


def _case(name: str, nproc: int, flags: str, model: str = "tiny-moe", part: str = "check") -> Case:
    return Case(name, nproc, tuple(flags.split()), model, part)


MLA = "tiny-mla-moe"
GQA, GQA_NOQK, MHA = "tiny-gqa-moe", "tiny-gqa-noqknorm-moe", "tiny-mha-moe"
QWEN3_NEXT = "tiny-qwen3-next"
PACKED = "bench/packed_lengths.json"  # a document-length histogram of short documents (relative to the root)
CASES: list[Case] = [
    # read module by module while the CPU terms were written
    _case("d_h256_s1024", 1, "--hidden-size 256 --seq-len 1024", part="derive"),
    _case("d_tp2_h256_s1024", 2, "--hidden-size 256 --seq-len 1024 --tp 2", part="derive"),
    _case("d_cp2_h256_s1024", 2, "--hidden-size 256 --seq-len 1024 --cp 2", part="derive"),
    _case("d_ep2_allgather", 2, "--hidden-size 256 --seq-len 1024 --ep 2 --dispatcher allgather --gbs 2",
          part="derive"),
    _case("d_ep2_alltoall", 2, "--hidden-size 256 --seq-len 1024 --ep 2 --gbs 2", part="derive"),
    _case("d_mla_h256_s1024", 1, "--hidden-size 256 --seq-len 1024", MLA, part="derive"),
    *[_case(f"d_mla_{rc}", 1, f"--hidden-size 128 --seq-len 512 --recompute {rc}", MLA, part="derive")
      for rc in ("layernorm", "core_attn", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")],
    # widths and sequence lengths
    *[_case(f"h{h}_s1024", 1, f"--hidden-size {h} --seq-len 1024") for h in (64, 128, 512)],
    *[_case(f"h128_s{s}", 1, f"--hidden-size 128 --seq-len {s}") for s in (256, 512, 2048)],
    _case("h128_s4096_2layers", 1, "--hidden-size 128 --seq-len 4096 --num-layers 2"),
    _case("mbs2_h256_s512", 1, "--hidden-size 256 --seq-len 512 --mbs 2 --gbs 2"),
    _case("mbs4_h128_s512", 1, "--hidden-size 128 --seq-len 512 --mbs 4 --gbs 4"),
    # heads and KV groups: GQA with QK-norm, GQA and MHA without
    _case("gqa_s1024", 1, "--seq-len 1024", GQA, part="derive"),  # read: the q copy, the dispatcher's indices
    _case("gqa_h256_mbs2", 1, "--hidden-size 256 --seq-len 512 --mbs 2 --gbs 2", GQA),
    _case("gqa_cp2", 2, "--seq-len 1024 --cp 2", GQA),
    _case("gqa_tp2", 2, "--seq-len 1024 --tp 2", GQA, part="derive"),  # read: no q copy with one KV group
    _case("gqa_noqk_s1024", 1, "--seq-len 1024", GQA_NOQK),
    _case("gqa_noqk_cp2_h384", 2, "--hidden-size 384 --seq-len 2048 --cp 2", GQA_NOQK),
    _case("mha_noqk_h256", 1, "--hidden-size 256 --seq-len 1024", MHA),
    _case("mha_noqk_cp2", 2, "--seq-len 2048 --cp 2 --mbs 2 --gbs 2", MHA),
    # MLA: each recompute module alone and the seed's combinations
    *[_case(f"mla_{rc.replace(',', '+')}", 1, f"--hidden-size 256 --seq-len 1024 --recompute {rc}", MLA)
      for rc in ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts", "full",
                 "moe_act,layernorm", "mla_up_proj,layernorm", "mla_up_proj,layernorm,moe,mlp")],
    _case("gqa_core_attn", 1, "--hidden-size 256 --seq-len 1024 --recompute core_attn", GQA),
    _case("moe_act+layernorm_h512", 1, "--hidden-size 512 --seq-len 1024 --recompute moe_act,layernorm"),
    _case("full_block1_h256", 1, "--hidden-size 256 --seq-len 1024 --recompute full --recompute-method block "
                                 "--recompute-num-layers 1"),
    # TP/SP, CP, EP with both dispatchers
    _case("mla_tp2_h256_s512", 2, "--hidden-size 256 --seq-len 512 --tp 2", MLA,
          part="derive"),  # read: MLA's latents under TP
    _case("tp2_mbs2_h128_s2048", 2, "--hidden-size 128 --seq-len 2048 --tp 2 --mbs 2 --gbs 2"),
    _case("cp2_h512_s2048", 2, "--hidden-size 512 --seq-len 2048 --cp 2"),
    _case("mla_cp2_h256", 2, "--hidden-size 256 --seq-len 1024 --cp 2", MLA),
    _case("ep2_alltoall_h512", 2, "--hidden-size 512 --seq-len 1024 --ep 2 --gbs 2"),
    _case("ep2_allgather_h128_s2048", 2, "--hidden-size 128 --seq-len 2048 --ep 2 --dispatcher allgather --gbs 2"),
    _case("gqa_ep2_allgather_mbs2", 2, "--hidden-size 256 --seq-len 512 --ep 2 --dispatcher allgather "
                                       "--mbs 2 --gbs 4", GQA),
    # the examples (widened, longer, several dimensions at once)
    _case("mla_tp2_cp2_ep2", 4, "--hidden-size 256 --seq-len 1024 --tp 2 --cp 2 --ep 2", MLA),
    _case("pp2_vpp2_ep2_moe_act", 4, "--hidden-size 256 --seq-len 1024 --pp 2 --vpp 2 --ep 2 --gbs 4 "
                                     "--recompute moe_act"),
    _case("cp2_ep2_mlp+layernorm", 2, "--hidden-size 512 --seq-len 2048 --cp 2 --ep 2 --recompute mlp,layernorm",
          MLA),
    # PP/VPP: in-flight microbatches per stage, uneven stages
    _case("pp2_h256", 2, "--hidden-size 256 --seq-len 1024 --pp 2 --gbs 4"),
    _case("mla_pp2_vpp2_h128", 2, "--hidden-size 128 --seq-len 1024 --pp 2 --vpp 2 --gbs 4", MLA),
    _case("pp2_uneven_5layers", 2, "--hidden-size 256 --seq-len 512 --pp 2 --num-layers 5 --gbs 4"),
    _case("tp2_ep2_etp2", 4, "--hidden-size 256 --seq-len 1024 --tp 2 --ep 2 --etp 2 --gbs 2"),
    # Qwen3-Next's hybrid stack (3 gated delta-net layers to 1 full attention) at longer lengths: under CP
    # Megatron-Core all-to-alls each delta-net layer to whole sequences of fewer heads; does a rank keep
    # anything that grows with the whole sequence rather than its share?
    _case("qwen3next_h256_s2048", 1, "--hidden-size 256 --seq-len 2048", QWEN3_NEXT),
    _case("qwen3next_cp2_h256_s4096", 2, "--hidden-size 256 --seq-len 4096 --cp 2", QWEN3_NEXT),
    _case("qwen3next_cp2_full_h256_s4096", 2, "--hidden-size 256 --seq-len 4096 --cp 2 --recompute full",
          QWEN3_NEXT),
    _case("qwen3next_cp2_ep2_h256_s2048", 2, "--hidden-size 256 --seq-len 2048 --cp 2 --ep 2", QWEN3_NEXT),
    # packed documents (THD, PackedSeqParams): the sequence's tokens are the same, attention is per document
    _case("packed_h256_s1024", 1, f"--hidden-size 256 --seq-len 1024 --lengths {PACKED}"),
    _case("packed_cp2_h256_s2048", 2, f"--hidden-size 256 --seq-len 2048 --cp 2 --lengths {PACKED}"),
    _case("packed_mla_h256_s1024", 1, f"--hidden-size 256 --seq-len 1024 --lengths {PACKED}", MLA),
    _case("packed_gqa_tp2_mbs2", 2, f"--seq-len 1024 --tp 2 --mbs 2 --gbs 2 --lengths {PACKED}", GQA),
]


# ---- measuring ------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(case: Case) -> dict:
    """One trainer run of the case; the fields of its TrialResult this benchmark reads."""
    with tempfile.TemporaryDirectory(prefix="memory-accuracy-") as tmp:
        result_path = Path(tmp) / "result.json"
        argv = ["-m", "trainers.megatron_moe", "--model", case.model_arg(), "--steps", "1", "--warmup", "1",
                *case.flags, "--result", str(result_path)]
        if case.nproc > 1:
            argv = ["-m", "torch.distributed.run", "--nproc-per-node", str(case.nproc), "--master-addr",
                    "127.0.0.1", "--master-port", str(_free_port()), *argv]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, timeout=RUN_TIMEOUT_S,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if not result_path.is_file():
            raise RuntimeError(f"{case.name}: no result (exit {proc.returncode}): {proc.stdout[-2000:]}")
        result = json.loads(result_path.read_text())
    if result["status"] != "ok":
        raise RuntimeError(f"{case.name}: status {result['status']}: {result.get('error')}")
    extra = result["extra"]
    rank = extra["memory_gib_rank"]
    return {"model": case.model_arg(), "nproc": case.nproc, "flags": list(case.flags), "part": case.part,
            "layout": result["layout"], "seq_len": result["seq_len"], "num_gpus": result["num_gpus"],
            "model_overrides": extra["model_overrides"], "memory_gib": result["memory_gib"],
            "pipeline_rank": extra["pipeline_rank_per_rank"][rank],
            "activations_by_module": extra["activations_by_module"],
            "versions": result["versions"]}


def measurements(remeasure: bool = False, verbose: bool = False) -> dict[str, dict]:
    """Every case's measurement: from the cache unless asked (or missing, or its flags changed)."""
    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {"runs": {}}
    runs = cache["runs"]
    for case in CASES:
        known = runs.get(case.name)
        if remeasure or not known or known["flags"] != list(case.flags) or known["model"] != case.model_arg():
            if verbose:
                print(f"measuring {case.name} ({case.nproc} ranks) ...", file=sys.stderr, flush=True)
            runs[case.name] = measure(case)
            cache["measured"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True))
    # the split is the case list's (a cached run keeps the part it had when it was measured)
    return {case.name: {**runs[case.name], "part": case.part} for case in CASES}


# ---- predicting and scoring -------------------------------------------------------------------------------
def predicted(run: dict) -> dict:
    """The memory model on the measured rank: its components, its terms, and its bytes per decoder layer."""
    model = load_model(run["model"]).with_overrides(**run["model_overrides"])
    layout = Layout.from_dict(run["layout"])
    mem = rank_memory_breakdown(model, load_gpu("cpu"), run["num_gpus"], run["seq_len"], layout, run["pipeline_rank"])
    terms: dict[str, float] = {}
    layers: dict[int, float] = {}
    place = placement(model, layout.pp, layout.vpp)
    if place is None:  # the layout ran, so its layers fit on its stages
        raise ValueError(f"{layout.key()}: the model cannot be placed on PP x VPP stages")
    for chunk in place.rank_stages(run["pipeline_rank"]):
        for key, value in chunk_activation_terms(model, layout, run["seq_len"], tuple(chunk), cpu=True).items():
            terms[key] = terms.get(key, 0.0) + value
        # each layer's own share: what the chunk's first i+1 layers keep less what its first i keep (full
        # recompute's checkpointed layers keep nothing themselves: their inputs are `recompute_inputs`)
        units = [u for u in chunk if u.is_layer]
        before = 0.0
        for i, unit in enumerate(units):
            kept = chunk_activation_terms(model, layout, run["seq_len"], tuple(units[:i + 1]), cpu=True)
            kept.pop("recompute_inputs", None)
            layers[unit.layer] = sum(kept.values()) - before
            before = sum(kept.values())
    return {"components": {k: getattr(mem, k) for k in COMPONENTS}, "terms": terms, "layers": layers,
            "mla": model.is_mla}


def score(name: str, run: dict) -> dict:
    pred = predicted(run)
    measured = {k: run["memory_gib"][k] * (1 << 30) for k in COMPONENTS}
    errors = {k: pred["components"][k] / measured[k] - 1 for k in COMPONENTS}
    by_module = run["activations_by_module"]
    mterms = measured_terms(by_module, pred["mla"])
    total = measured["activations_per_microbatch"]
    terms = {k: {"measured": mterms.get(k, 0.0), "predicted": pred["terms"].get(k, 0.0)}
             for k in sorted(set(mterms) | set(pred["terms"]))}
    layer_bytes: dict[int, float] = {}
    for owner, nbytes in by_module.items():
        match = LAYER.match(owner)
        if match:
            layer_bytes[int(match.group(1))] = layer_bytes.get(int(match.group(1)), 0.0) + nbytes
    # a layer that full recompute checkpoints saves nothing itself: compare the layers that keep theirs
    layer_errors = {i: pred["layers"][i] / layer_bytes[i] - 1 for i in layer_bytes
                    if i in pred["layers"] and layer_bytes[i] > 0.01 * total}
    return {"name": name, "part": run["part"], "nproc": run["nproc"], "model": Path(run["model"]).stem,
            "flags": " ".join(run["flags"]), "measured": measured, "predicted": pred["components"],
            "errors": errors, "terms": terms,
            "worst_layer_error": max(layer_errors.values(), key=abs) if layer_errors else 0.0}


def _mape(values: list[float]) -> float:
    return 100 * sum(abs(v) for v in values) / len(values) if values else 0.0


def run(remeasure: bool = False, verbose: bool = False) -> dict:
    runs = measurements(remeasure, verbose)
    rows = [score(name, data) for name, data in runs.items()]
    check = [r for r in rows if r["part"] == "check"]
    act = [r["errors"]["activations_per_microbatch"] for r in check]
    static = [abs(r["errors"][k]) for r in check for k in STATIC]
    term_summary = {}
    for term in sorted({t for r in check for t in r["terms"]}):
        # each term against its own size where it is at least 1% of the activations; and its error as a
        # share of the layout's activations everywhere
        own = [v["predicted"] / v["measured"] - 1 for r in check if (v := r["terms"].get(term))
               and v["measured"] >= 0.01 * r["measured"]["activations_per_microbatch"]]
        share = [(v["predicted"] - v["measured"]) / r["measured"]["activations_per_microbatch"]
                 for r in check if (v := r["terms"].get(term))]
        term_summary[term] = {"layouts": len(own), "mape_pct": _mape(own),
                              "max_pct": 100 * max(map(abs, own), default=0.0),
                              "max_share_pct": 100 * max(map(abs, share), default=0.0)}
    return {
        "rows": rows, "terms": term_summary, "layouts_checked": len(check),
        "layouts_derive": len(rows) - len(check),
        "activations_mape_pct": _mape(act), "activations_max_pct": 100 * max(map(abs, act), default=0.0),
        "static_max_pct": 100 * max(static, default=0.0),
        "measured": json.loads(CACHE.read_text()).get("measured") if CACHE.is_file() else None,
    }


def summary_line(result: dict) -> str:
    return (f"memory accuracy: activations MAPE {result['activations_mape_pct']:.1f}% "
            f"(max {result['activations_max_pct']:.1f}%), weights/grads/optimizer max "
            f"{result['static_max_pct']:.1f}% over {result['layouts_checked']} layouts")


def section(result: dict) -> list[str]:
    lines = [
        f"The memory model (search_spaces/cost/memory.py, CPU terms) against the real Megatron-Core trainer on CPU: "
        f"{result['layouts_checked']} `check` layouts scored, {result['layouts_derive']} `derive` layouts "
        f"(read module by module while the terms were written) shown but not scored. Nothing is fitted. "
        f"Error = predicted / measured - 1 on the most loaded rank; measured {result['measured']}, cached in "
        f"bench/memory_measurements.json (`--remeasure` to run the trainer again).", "",
        "Per activation term (check layouts): error against the term's own size where it is at least 1% of "
        "the activations, and the largest error as a share of all the layout's activations.", "",
        "| term | layouts | MAPE | max | max share of activations |", "|---|---|---|---|---|"]
    for term, s in result["terms"].items():
        lines.append(f"| {term} | {s['layouts']} | {s['mape_pct']:.1f}% | {s['max_pct']:.1f}% | "
                     f"{s['max_share_pct']:.2f}% |")
    lines += ["", "| layout | part | model | ranks | flags | activations measured MiB | predicted MiB | error | "
                  "worst layer | worst term (share) | weights | grads | optimizer |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        total = r["measured"]["activations_per_microbatch"]
        worst = max(r["terms"].items(), key=lambda kv: abs(kv[1]["predicted"] - kv[1]["measured"]))
        share = (worst[1]["predicted"] - worst[1]["measured"]) / total
        worst_text = f"{worst[0]} {share:+.2%}" if abs(share) >= 5e-5 else "none"
        e = r["errors"]
        lines.append(f"| {r['name']} | {r['part']} | {r['model']} | {r['nproc']} | `{r['flags']}` | "
                     f"{total / MIB:.2f} | {r['predicted']['activations_per_microbatch'] / MIB:.2f} | "
                     f"{e['activations_per_microbatch']:+.1%} | {r['worst_layer_error']:+.1%} | "
                     f"{worst_text} | {e['weights']:+.1%} | {e['gradients']:+.1%} | "
                     f"{e['optimizer_states']:+.1%} |")
    return lines + ["", summary_line(result)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remeasure", action="store_true", help="run the trainer for every layout again")
    args = parser.parse_args(argv)
    result = run(remeasure=args.remeasure, verbose=True)
    print("\n".join(section(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
