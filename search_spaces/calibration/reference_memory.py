"""The published rows as they ran, memory-wise: the memory levers (search_spaces/cost/offload.py, fp8 weights) each
row's own config turned on -- and, where a table printed none, the recompute and graphs its config ran -- and, for a row
the model still predicts not to fit, why -- each with its source.

`reference.published_rows()` and `long_context_moe_rows()` keep the layouts the cost model is calibrated on (the
levers change no time term the fit reads); `as_run(row)` is the row with its levers, `memory_gap(row)` the reason
a row that ran is still predicted not to fit (tests/search_spaces/test_reference_memory.py holds both to the estimates:
every row
fits as run or names its gap, and a gap that closes must be removed). Pure Python.
"""

from __future__ import annotations

import dataclasses

from search_spaces.calibration.fit import Measurement

# megatron-bridge 0.6.2's perf recipes (the 26.08 configs): src/megatron/bridge/perf_recipes/...
_QWEN_STASH = ("perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8 (megatron-bridge 0.6.2, the "
               "26.08 recipes of perf_recipes/qwen/{gb300,gb200}/qwen3_moe.py qwen3_30b_a3b_pretrain_8gpu_*_fp8mx): "
               "moe_paged_stash with moe_expert_rank_capacity_factor 1.5")
_MODELZOO_OFFLOAD = ("yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md @e8650517d60d (moe_4k_more.csv's "
                     "source column): fine-grained activation offload of expert_fc1 and moe_act")


def row_key(row: Measurement) -> tuple:
    """What names a published row here: model, GPU, GPUs, length, precision and its release (or source)."""
    return row.model, row.gpu, row.num_gpus, row.seq_len, row.layout.precision, row.release or row.source


# Megatron-Bridge's perf scripts take the precision from scripts/performance/utils/precision.py get_precision_config:
# fp8_cs -> bf16_with_fp8_current_scaling_mixed, fp8_mx -> bf16_with_mxfp8_mixed, both with fp8_param_gather=True
# (src/megatron/bridge/training/mixed_precision.py) and no perf config of these models turning it off
_FP8_PARAMS = ("Megatron-Bridge {tag} ({commit}): scripts/performance/utils/precision.py "
               "get_precision_config('{dtype}') -> mixed_precision.py {recipe} sets fp8_param_gather=True "
               "(weights kept in fp8); {config} leaves it")
_LLAMA_405B_GB300 = _FP8_PARAMS.format(
    tag="v0.5.0 (the 26.06 release)", commit="fcbb603", dtype="fp8_mx", recipe="bf16_with_mxfp8_mixed",
    config="scripts/performance/configs/llama31/ (405B GB300 FP8-MX)")
_LLAMA_405B_GB200 = _FP8_PARAMS.format(
    tag="v0.5.0 (the 26.06 release)", commit="fcbb603", dtype="fp8_cs", recipe="bf16_with_fp8_current_scaling_mixed",
    config="scripts/performance/configs/llama31/ (405B GB200 FP8-CS)")
_LLAMA3_70B_GB300 = _FP8_PARAMS.format(
    tag="v0.4.1 (the 26.04.01 release)", commit="f9b6319", dtype="fp8_mx", recipe="bf16_with_mxfp8_mixed",
    config="scripts/performance/configs/llama3/ (70B GB300 FP8-MX)")
_QWEN_B300 = _FP8_PARAMS.format(
    tag="v0.5.0 (the 26.06 release)", commit="fcbb603", dtype="fp8_mx", recipe="bf16_with_mxfp8_mixed",
    config="scripts/performance/configs/qwen3/ (30B-A3B B300 FP8-MX)")
_QWEN_FP8_PARAMS = ("megatron-bridge 0.6.2's perf_recipes precision for fp8mx (_perf_precision) is mixed_precision.py "
                    "bf16_with_mxfp8_mixed: fp8_param_gather=True")
# Megatron-Bridge v0.2.0 (the 25.11 release, commit 7af9601c), scripts/performance/configs/deepseek/
# workload_base_configs.py DEEPSEEK_V3_GB200_BASE_CONFIG (= its BF16 config): PP4 VPP4 EP64 as the row,
# recompute_modules ["mla_up_proj"], TE CUDA graphs of moe_router and moe_preprocess (its GBS is 2048; the table's row
# ran 4096)
_DEEPSEEK_GB200_2511 = ("Megatron-Bridge v0.2.0 (25.11, 7af9601c) scripts/performance/configs/deepseek/"
                        "workload_base_configs.py DEEPSEEK_V3_GB200_BF16_BASE_CONFIG: recompute_modules "
                        "['mla_up_proj'], cuda_graph_impl transformer_engine, cuda_graph_scope "
                        "['moe_router', 'moe_preprocess']")

# row -> (the lever fields its config set, the source); a row's recompute and graphs where the table printed none
ROW_LEVERS: dict[tuple, tuple[dict, str]] = {
    ("qwen3-30b-a3b", "gb300", 8, 4096, "mxfp8", "bridge-26.08"): (
        {"expert_stash": "paged:1.5", "fp8_param_gather": True}, _QWEN_STASH + "; " + _QWEN_FP8_PARAMS),
    ("qwen3-30b-a3b", "gb200", 8, 4096, "mxfp8", "bridge-26.08"): (
        {"expert_stash": "paged:1.5", "fp8_param_gather": True}, _QWEN_STASH + "; " + _QWEN_FP8_PARAMS),
    ("qwen3-30b-a3b", "b300", 8, 4096, "mxfp8", "bridge-26.06"): ({"fp8_param_gather": True}, _QWEN_B300),
    ("qwen3-235b-a22b", "gb200", 256, 4096, "mxfp8", "moe_4k_more"): (
        {"activation_offload": "expert_fc1,moe_act"}, _MODELZOO_OFFLOAD),
    ("llama3.1-405b", "gb300", 256, 8192, "mxfp8", "bridge-26.06"): ({"fp8_param_gather": True}, _LLAMA_405B_GB300),
    ("llama3.1-405b", "gb200", 256, 8192, "fp8-tensorwise", "bridge-26.06"): (
        {"fp8_param_gather": True}, _LLAMA_405B_GB200),
    ("llama3-70b", "gb300", 64, 8192, "mxfp8", "bridge-26.04.01"): ({"fp8_param_gather": True}, _LLAMA3_70B_GB300),
    ("deepseek-v3-no-mtp", "gb200", 256, 4096, "bf16", "bridge-25.11"): (
        {"recompute": "mla_up_proj", "cuda_graphs": ("moe_router", "moe_preprocess")}, _DEEPSEEK_GB200_2511),
}

# row -> why the model still predicts it not to fit although it ran, with the source: none today (every published row
# fits as it ran). The three Qwen3-30B-A3B full-iteration rows were the last: their graphs were charged +50% of the
# activations (a rule of thumb) until memory.FULL_ITERATION_POOL_EXCESS replaced it.
MEMORY_GAPS: dict[tuple, str] = {}


def as_run(row: Measurement) -> Measurement:
    """The row with the memory levers its own config turned on (the row itself when none)."""
    levers = ROW_LEVERS.get(row_key(row))
    return row if levers is None else dataclasses.replace(row, layout=row.layout.replace(**levers[0]))


def memory_gap(row: Measurement) -> str | None:
    """Why the model predicts a published row not to fit although it ran (None: no known gap)."""
    return MEMORY_GAPS.get(row_key(row))
