"""What `estimate` and `space` print is true (issue 56): the memory table's rows sum to the peak it prints, with the
per-microbatch and host figures apart; every table states its units, MFU the precision whose dense peak it is of;
every figure is labelled predicted; a knob's neighbours are the sizes the space proposes, never its own value.

Before: the memory table mixed the peak's components with one microbatch's activations and the host's offloaded
bytes (its rows summed to more than the peak); "MFU" named no peak; EP 8 of 160 experts on 256 GPUs offered EP 5
and 10 (which no layout of 256 GPUs can have) as its neighbours; `space --lengths` printed "CP 4 -> 4".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from search_spaces.catalog.hardware import GPU_NAMES, load_gpu
from search_spaces.catalog.models import MODEL_NAMES, load_model
from search_spaces.cost.breakdown import COUNT_KEYS, HOST_KEYS, PEAK_KEYS, PER_MICROBATCH_KEYS
from search_spaces.layouts.neighbours import neighbour_values, proposed_sizes
from search_spaces.layouts.rules import RULES
from search_spaces.layouts.space import dimensions

from orchestrator.commands.cli import main
from orchestrator.outputs.packing_view import cp_change, print_comparison

GLM = str(Path(__file__).parents[1] / "data" / "hf_configs" / "glm-4.5.json")  # 160 routed experts

# (model, gpu, GPUs, tokens, layout flags): offloads (optimizer, activations), a paged stash, recompute (selective,
# full by block), fp8 and bf16, the delta-net model, a CPU run of MiB (the process's resident memory in the peak)
LAYOUTS = [
    ("deepseek-v3", "h100", 1024, 131072, "--tp 2 --cp 16 --ep 32 --pp 16 --optimizer-offload 1.0"),
    ("deepseek-v3", "h100", 256, 131072, "--cp 32 --ep 32 --pp 8 --vpp 4 --gbs 128 --precision fp8 --dispatcher "
     "deepep --recompute mla_up_proj,layernorm,moe,mlp --optimizer-offload 1.0"),
    ("qwen3-235b-a22b", "gb200", 128, 131072, "--tp 4 --cp 4 --ep 32 --pp 4 --vpp 12 --gbs 64 --expert-stash "
     "paged:1.5 --dispatcher hybridep"),
    ("qwen3-235b-a22b", "gb200", 128, 131072, "--tp 4 --cp 4 --ep 32 --pp 4 --vpp 12 --gbs 64 --activation-offload "
     "expert_fc1,moe_act --optimizer-states bf16"),
    ("qwen3-235b-a22b", "gb200", 128, 131072, "--tp 4 --cp 4 --ep 32 --pp 4 --vpp 12 --gbs 64 --recompute full "
     "--recompute-method block --recompute-num-layers 2 --optimizer-offload 0.5"),
    ("qwen3-next-80b-a3b", "h100", 128, 65536, "--tp 2 --cp 4 --ep 16 --pp 4 --gbs 64 --recompute full"),
    ("llama3-70b", "h100", 64, 8192, "--tp 8 --pp 4 --vpp 5 --gbs 512 --recompute core_attn"),
    ("tiny-moe", "cpu", 4, 512, "--ep 2 --pp 2 --gbs 8 --precision fp32"),
]
_ROW = re.compile(r"^│ (.+?)\s*│\s*([-\d.,]+) │$")


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _argv(model: str, gpu: str, num_gpus: int, seq_len: int, flags: str) -> list[str]:
    return ["estimate", "--model", model, "--gpu", gpu, "--num-gpus", str(num_gpus), "--seq-len", str(seq_len),
            *flags.split()]


def _half_unit(text: str) -> float:
    """Half the last printed digit's unit: how far a printed figure may lie from the figure."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10 ** -decimals


def _peak_table(out: str) -> tuple[dict[str, str], str]:
    """The printed peak table: its component rows (name -> printed GiB) and the printed peak."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "peak memory per GPU (GiB, predicted)" in line)
    rows: dict[str, str] = {}
    for line in lines[start:]:
        match = _ROW.match(line)
        if match and match.group(1).startswith("peak (the sum of the rows above)"):
            return rows, match.group(2)
        if match:
            rows[match.group(1)] = match.group(2)
    raise AssertionError(f"no peak row:\n{out}")


@pytest.mark.parametrize("case", LAYOUTS, ids=lambda c: f"{c[0]}-{c[2]}x{c[1]}-{c[4].split(' --')[-1]}")
def test_memory_rows_sum_to_the_printed_peak_and_the_other_figures_stand_apart(case, capsys):
    code, out, err = _run(capsys, _argv(*case))
    assert code == 0, err
    rows, peak = _peak_table(out)
    assert list(rows) == list(PEAK_KEYS)  # exactly the peak's components: no per-microbatch or host figure
    total = sum(float(v.replace(",", "")) for v in rows.values())
    slack = sum(_half_unit(v) for v in rows.values()) + _half_unit(peak)
    assert abs(total - float(peak.replace(",", ""))) <= slack + 1e-12, (rows, peak)
    other = out[out.index("not in the peak (GiB, predicted)"):]
    for key in PER_MICROBATCH_KEYS + HOST_KEYS:
        assert re.search(rf"│ {key}\s*│", other), key
    assert "per microbatch" in other and "host (CPU-offloaded" in other

    code, out, err = _run(capsys, _argv(*case) + ["--json"])
    data = json.loads(out)
    memory = data["memory_per_gpu_gib"]
    assert memory["peak"] == data["peak_memory_gib"]
    assert sum(memory["peak_components"].values()) == pytest.approx(memory["peak"], rel=1e-12)
    groups = [set(memory[g]) for g in ("peak_components", "per_microbatch", "host_offloaded")]
    assert sum(len(g) for g in groups) == len(set().union(*groups))  # distinct keys
    # every figure of the flat breakdown is in one group, with the same value
    flat = {k: v for k, v in data["breakdown"]["memory_gib"].items() if k not in COUNT_KEYS}
    assert {k: v for g in ("peak_components", "per_microbatch", "host_offloaded")
            for k, v in memory[g].items()} == flat
    assert data["figures"] == "predicted"


def test_mfu_names_the_precision_whose_dense_peak_it_is_of(capsys):
    code, out, _ = _run(capsys, _argv(*LAYOUTS[1]))
    assert code == 0
    assert "MFU vs FP8 dense peak (1,978.9 TFLOP/s/GPU)" in out and "fp8-blockwise: predicted by the cost model" in out
    code, out, _ = _run(capsys, _argv(*LAYOUTS[1]) + ["--json"])
    data = json.loads(out)
    assert data["mfu_vs_dense_peak_tflops_per_gpu"] == {"fp8-blockwise": 1978.9}
    assert data["mfu"] == pytest.approx(data["tflops_per_gpu"] / 1978.9)


def test_space_says_its_default_precision_and_what_mfu_is_of(capsys):
    argv = ["space", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "1024", "--top", "2",
            "--max-grids", "4"]
    code, out, err = _run(capsys, argv)
    assert code == 0, err
    header = out.splitlines()[0]
    assert "precision fp8-blockwise, space's default on h100 (the fastest it runs; --fix precision=bf16" in header
    assert "predicted to fit" in header and "MFU vs FP8 dense peak" in out
    code, out, err = _run(capsys, argv + ["--fix", "precision=bf16"])
    assert code == 0, err
    assert "precision bf16 (--fix)" in out.splitlines()[0] and "MFU vs BF16 dense peak" in out
    code, out, _ = _run(capsys, argv + ["--json"])
    data = json.loads(out)
    assert data["figures"] == "predicted" and data["mfu_vs_dense_peak_tflops_per_gpu"] == {"fp8-blockwise": 1978.9}


# ---- neighbours -------------------------------------------------------------------------------------------------
def test_ep_neighbours_are_the_sizes_the_space_proposes_not_every_divisor(capsys):
    """EP 8 of GLM-4.5's 160 experts on 256 GPUs: 5 and 10 divide 160 but no ETP*EP*PP of them divides 256, so the
    space never proposes them; the neighbours are 4 and 16."""
    code, out, err = _run(capsys, ["estimate", "--model", GLM, "--gpu", "h100", "--num-gpus", "256", "--seq-len",
                                   "32768", "--tp", "2", "--cp", "4", "--ep", "8", "--pp", "4", "--json"])
    assert code == 0, err
    near = json.loads(out)["neighbours"]
    assert {n["value"] for n in near if n["knob"] == "ep"} == {"4", "16"}
    assert all(n["legal"] for n in near if n["knob"] == "ep")


@pytest.mark.parametrize("case", [LAYOUTS[0], LAYOUTS[5], ("llama3.1-405b", "gb200", 576, 131072,
                                                           "--tp 8 --cp 8 --pp 9 --gbs 8 --cp-comm-type allgather")],
                         ids=lambda c: c[0])
def test_neighbours_never_repeat_the_value_and_are_proposed_sizes(case, capsys):
    model, gpu, num_gpus, seq_len, flags = case
    code, out, err = _run(capsys, _argv(*case) + ["--json"])
    assert code == 0, err
    data = json.loads(out)
    spec = load_model(model)
    sizes = proposed_sizes(spec, load_gpu(gpu), num_gpus, seq_len,
                           dimensions(spec, load_gpu(gpu), num_gpus, seq_len, gbs=data["layout"]["gbs"]))
    for n in data["neighbours"]:
        assert n["value"] != str(data["layout"][n["knob"]]), n  # "CP 16 -> 16" never
        if n["knob"] in sizes:
            assert int(n["value"]) in sizes[n["knob"]], n
    if model == "llama3.1-405b":  # 126 layers on 576 GPUs: PP 9, 18, 36 place them, PP 8 and 12 do not
        assert {n["value"] for n in data["neighbours"] if n["knob"] == "pp"} == {"18"}


def test_neighbour_values_skip_the_current_value():
    assert neighbour_values([1, 2, 4], 2, ordered=True) == [1, 4]
    assert neighbour_values([1, 2, 2, 4], 2, ordered=True) == [1]  # a repeated value is not a neighbour
    assert neighbour_values(["a", "b"], "a", ordered=False) == ["b"]


def test_the_packed_comparison_never_prints_a_cp_that_does_not_change(capsys):
    cmp = {"full_length_best": "tp2/cp4/a", "packed_best": "tp4/cp4/b", "full_length_best_cp": 4, "packed_best_cp": 4,
           "full_length_best_tokens_full": 1.0, "full_length_best_tokens_packed": 2.0, "packed_best_tokens_packed": 3.0,
           "attention_vs_full_length": 0.25,
           "reason": {"attention": {"full_length_best_s": 2.0, "packed_best_s": 1.0},
                      "recompute": {"full_length_best_s": 0.0, "packed_best_s": 0.0}}}
    assert cp_change(cmp) == "CP stays 4" and cp_change({**cmp, "packed_best_cp": 8}) == "CP 4 -> 8"
    capsys.readouterr()
    print_comparison(cmp)
    out = capsys.readouterr().out
    assert "CP 4 -> 4" not in out and "CP stays 4" in out and "recompute" not in out and "attention 2.00 s" in out
    print_comparison({**cmp, "packed_best": cmp["full_length_best"]})
    out = capsys.readouterr().out
    assert "the same layout" in out and "->" not in out


# ---- generated: every answer has rows or one line naming why; every figure is labelled predicted ---------------
_FIRST_SPACE_ROW = re.compile(r"^│\s*1\s*│\s*tp\d+/", re.M)
_ESTIMATE_ROW = re.compile(r"tokens/s/GPU\s*│\s*[\d,.]+")
# tables of counts and rules, not of figures: no prediction to label
_NOT_FIGURES = ("rejections per rule", ": illegal layout")
_LAYOUT_FLAGS = st.fixed_dictionaries({}, optional={
    "--tp": st.sampled_from(["1", "2", "4", "8"]), "--cp": st.sampled_from(["1", "2", "4", "16"]),
    "--ep": st.sampled_from(["1", "2", "4", "8", "5"]), "--pp": st.sampled_from(["1", "2", "4", "3"]),
    "--precision": st.sampled_from(["bf16", "fp8", "mxfp8", "fp32"]),
    "--recompute": st.sampled_from(["none", "full", "layernorm"]),
    "--optimizer-offload": st.sampled_from(["0.0", "1.0"])})
_EXAMPLES = max(8, settings().max_examples // 10)  # the profile's: fast 8, full 30, deep 300


def _titles(out: str) -> list[str]:
    """The title of every table printed (the line above its top border: one line, estimate.py's _table)."""
    lines = out.splitlines()
    return [lines[i - 1].strip() for i, line in enumerate(lines) if line.startswith("┏") and i > 0]


def _names_why(line: str) -> bool:
    return any(re.search(rf"\b{re.escape(rule)}\b", line) for rule in RULES) or any(
        word in line for word in ("memory", "--budget", "--max-grids", "seq-len", "num-gpus", "precision",
                                  "supports", "must", "unknown"))


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["estimate", "space"]), as_json=st.booleans(), model=st.sampled_from(MODEL_NAMES),
       gpu=st.sampled_from(GPU_NAMES), num_gpus=st.sampled_from([1, 2, 4, 8, 16, 64, 128]),
       seq_len=st.sampled_from([512, 4096, 16384, 65536, 131072]), flags=_LAYOUT_FLAGS,
       fix_bf16=st.booleans())
def test_every_answer_has_rows_labelled_predicted_or_is_one_line(capsys, command, as_json, model, gpu, num_gpus,
                                                                 seq_len, flags, fix_bf16):
    argv = [command, "--model", model, "--gpu", gpu, "--num-gpus", str(num_gpus), "--seq-len", str(seq_len)]
    if command == "estimate":
        argv += [x for kv in flags.items() for x in kv]
    else:
        argv += ["--top", "2", "--max-grids", "4"] + (["--fix", "precision=bf16"] if fix_bf16 and gpu != "cpu" else [])
    code, out, err = _run(capsys, argv + (["--json"] if as_json else []))
    event(f"{command} exit {code}")
    assert "measured" not in out, out[-2000:]
    if code != 0:
        assert code == 2, (argv, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
        assert _names_why(err), (argv, err)
        return
    if as_json:
        data = json.loads(out)
        assert data["figures"] == "predicted"
        rows = data["top"] if command == "space" else [data] if data["legal"] else []
        assert rows, (argv, out[-2000:])
        return
    assert (_FIRST_SPACE_ROW if command == "space" else _ESTIMATE_ROW).search(out), (argv, out[-2000:])
    titles = _titles(out)
    assert titles, out[-2000:]
    for title in titles:
        assert "predicted" in title or any(t in title for t in _NOT_FIGURES), (title, argv)
    if command == "space":
        assert "predicted to fit" in out.splitlines()[0] and "precision" in out.splitlines()[0]
    assert re.search(r"MFU vs (FP8|MXFP8|BF16|FP32) dense peak", out), out[-2000:]
