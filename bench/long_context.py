"""DeepSeek-V3 on 256 H100 from 4K to 128K with its published long-context layout: which CP communication `space`
ranks best at each length, why (per ring step: bytes, link, transfer time against the attention that hides it),
and how far each length's throughput is from the 4K one (issue 17: within +-15%).

Layout (notes/long-context-moe.md, Megatron-Bridge's long-context skill): TP1, CP = seq/4096, EP32, PP8, VPP4,
FP8 blockwise, DeepEP, selective recompute (mla_up_proj, layernorm, moe, mlp), optimizer offload; GBS keeps 128
microbatches per pipeline at every length. `space` (search_spaces.layouts.space.explore) is run with every field fixed
but the CP communication (cp_comm_type and hierarchical_cp), so its ranking is the CP choice.

    .venv/bin/python bench/long_context.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from search_spaces.catalog.hardware import load_gpu
from search_spaces.catalog.models import load_model
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.throughput import cp_step_report, job_for
from search_spaces.layouts.layout import Layout
from search_spaces.layouts.space import explore, hierarchical_options

MODEL, GPU, GPUS = "deepseek-v3", "h100", 256
LAYOUT = dict(tp=1, ep=32, etp=1, pp=8, vpp=4, mbs=1, precision="fp8-blockwise", dispatcher="deepep",
              recompute="mla_up_proj,layernorm,moe,mlp", optimizer_offload=1.0, cuda_graphs="none")
LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
BAND = 0.15


def fixed_for(seq_len: int) -> tuple[dict, int]:
    cp = max(1, seq_len // 4096)
    return {**LAYOUT, "cp": cp}, 128 * (GPUS // (8 * cp))


def options(cp: int) -> list[tuple[str, tuple[int, ...]]]:
    if cp == 1:
        return [("p2p", ())]
    return [("p2p", ()), ("a2a", ()), ("allgather", ())] + [("a2a+p2p", s) for s in hierarchical_options([cp])]


def _option(seq: int, fixed: dict, gbs: int, kind: str, sizes: tuple[int, ...]) -> dict:
    layout = Layout.from_dict({**fixed, "gbs": gbs, "cp_comm_type": kind, "hierarchical_cp": list(sizes)})
    est = estimate(MODEL, GPU, GPUS, seq, layout)
    row = {"cp_comm": kind + (f" [{sizes[0]},{sizes[1]}]" if sizes else ""), "legal": est.legal}
    if est.legal:
        if est.tflops_per_gpu is None or est.peak_memory_gib is None or est.step_time_s is None or est.time is None:
            raise ValueError(f"{row['cp_comm']}: a legal layout's estimate lacks its figures")
        report = cp_step_report(job_for(load_model(MODEL), load_gpu(GPU), GPUS, seq, layout))
        row.update(tflops=round(est.tflops_per_gpu, 1), fits=est.fits, peak_gib=round(est.peak_memory_gib, 1),
                   cp_comm_s=round(est.time.cp_comm, 2), step_s=round(est.step_time_s, 1),
                   **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in report.items()})
    return row


def run() -> dict:
    lengths = []
    for seq in LENGTHS:
        fixed, gbs = fixed_for(seq)
        found = explore(MODEL, GPU, GPUS, seq, fixed=fixed, gbs=gbs, top=1)
        best = found.top[0] if found.top else None
        lengths.append({"seq_len": seq, "cp": fixed["cp"], "gbs": gbs,
                        "best": None if best is None else {
                            "cp_comm_type": best["layout"]["cp_comm_type"],
                            "hierarchical_cp": best["layout"]["hierarchical_cp"],
                            "tflops": round(best["prediction"]["tflops_per_gpu"], 1),
                            "tokens_per_sec_per_gpu": round(best["prediction"]["tokens_per_sec_per_gpu"], 1)},
                        "options": [_option(seq, fixed, gbs, k, s) for k, s in options(fixed["cp"])]})
    base = lengths[0]["best"]["tflops"]
    for row in lengths:
        row["ratio_to_4k"] = round(row["best"]["tflops"] / base, 3) if row["best"] else None
    ratios = [r["ratio_to_4k"] for r in lengths if r["ratio_to_4k"]]
    return {"lengths": lengths, "band": [min(ratios), max(ratios)],
            "within_band": all(1 - BAND <= x <= 1 + BAND for x in ratios) and len(ratios) == len(LENGTHS)}


def _cost(o: dict) -> str:
    ring = (f"; ring: {o['transfer_ms']} ms {o['ring_link']} transfers against {o['attention_fwd_step_ms']}/"
            f"{o['attention_bwd_step_ms']} ms fwd/bwd attention steps" if o["ring"] > 1 else "")
    a2a = f"; all-to-all over {o['a2a']} ranks {o['a2a_ms']} ms" if o["a2a"] > 1 else ""
    return (f"{o['cp_comm']}: attention {o['attention_layer_ms']} + exposed CP {o['exposed_ms']} = "
            f"{round(o['attention_layer_ms'] + o['exposed_ms'], 1)} ms{a2a}{ring}")


def why(row: dict) -> str:
    """The winner against the others, per attention layer and microbatch: attention time + exposed CP time."""
    legal = sorted((o for o in row["options"] if o["legal"]), key=lambda o: o["attention_layer_ms"] + o["exposed_ms"])
    best = row["best"]
    name = best["cp_comm_type"] + (f" [{best['hierarchical_cp'][0]},{best['hierarchical_cp'][1]}]"
                                   if best["hierarchical_cp"] else "")
    shown = legal[:3] + [o for o in legal[3:] if o["cp_comm"] == "p2p"]  # the plain ring for contrast
    return (f"- **{row['seq_len'] // 1024}K (CP{row['cp']}): {name}.** Per attention layer and microbatch: "
            + "; ".join(_cost(o) for o in shown) + ".")


def section(r: dict) -> list[str]:
    lines = ["DeepSeek-V3 on 256 H100, the published long-context layout (TP1, CP = seq/4096, EP32, PP8, VPP4, FP8, "
             "DeepEP, selective recompute, optimizer offload; 128 microbatches per step), each length with the CP "
             "communication `space` ranks best:", "",
             "| length | CP | best CP communication | TF/s/GPU | / 4K |", "|---|---|---|---|---|"]
    for row in r["lengths"]:
        b = row["best"]
        sizes = f" [{b['hierarchical_cp'][0]},{b['hierarchical_cp'][1]}]" if b and b["hierarchical_cp"] else ""
        lines.append(f"| {row['seq_len'] // 1024}K | {row['cp']} | {b['cp_comm_type'] + sizes if b else '-'} | "
                     f"{b['tflops'] if b else '-'} | {row['ratio_to_4k']} |")
    lo, hi = r["band"]
    lines += ["", f"**Band: {lo:.3f}–{hi:.3f} of the 4K throughput "
              f"({'within' if r['within_band'] else 'OUTSIDE'} ±{int(BAND * 100)}%).** Published runs of this "
              "family stay near 300–320 TF/s from 4K to 256K (notes/long-context-moe.md).", "",
              "Why each length's winner wins (the three cheapest options and the plain p2p ring, ms per attention "
              "layer and microbatch on one rank; the rest of the step is the same for all): while TP·CP fits one "
              "NVLink domain (8 GPUs) the p2p ring hides its transfers, but a2a runs attention as one kernel over the "
              "whole sequence (1/CP of the heads) instead of shard-long ring steps, which the kernel-length factor "
              "rewards more than the all-to-all costs; beyond one node a plain p2p ring moves the full MLA K/V of a 4K "
              "shard (336 MB) over InfiniBand per step against ~1 ms of attention, so nothing hides it, while a2a+p2p "
              "keeps the all-to-all inside the node and makes each cross-node ring step 8x longer for the same "
              "bytes.", ""]
    lines += [why(row) for row in r["lengths"] if row["cp"] > 1]
    lines += ["",
              "Per ring step of one attention layer (one microbatch, one rank): the K/V bytes a transfer moves, the "
              "link the ring crosses, the transfer's time against the attention of that step (forward, backward) "
              "that hides it, the all-to-all time (a2a levels, not hidden) and what stays exposed per layer:", ""]
    cols = ("cp_comm", "tflops", "fits", "ring_link", "kv_mb_per_transfer", "transfer_ms", "attention_fwd_step_ms",
            "attention_bwd_step_ms", "a2a_ms", "exposed_ms", "cp_comm_s")
    heads = ("CP communication", "TF/s/GPU", "fits", "ring link", "MB / transfer", "transfer ms", "attn fwd/step ms",
             "attn bwd/step ms", "a2a ms", "exposed ms/layer", "cp_comm s/step")
    for row in r["lengths"]:
        if row["cp"] == 1:
            continue
        lines += [f"**{row['seq_len'] // 1024}K (CP{row['cp']})**", "", "| " + " | ".join(heads) + " |",
                  "|" + "---|" * len(heads)]
        for o in row["options"]:
            if o["legal"]:
                lines.append("| " + " | ".join(str(o.get(c, "-")) for c in cols) + " |")
            else:
                lines.append(f"| {o['cp_comm']} | illegal | " + " | ".join("-" for _ in cols[2:]) + " |")
        lines.append("")
    return lines


def main() -> None:
    for line in section(run()):
        print(line)


if __name__ == "__main__":
    main()
