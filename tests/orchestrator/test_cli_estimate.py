"""`moe-autotune estimate` and `moe-autotune space`: output, JSON, and one-line errors with exit code 2."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.commands.cli import main

ISSUE_EXAMPLE = ["estimate", "--model", "deepseek-v3", "--gpu", "h100", "--num-gpus", "256", "--seq-len", "131072",
                 "--tp", "1", "--cp", "32", "--ep", "32", "--etp", "1", "--pp", "8", "--vpp", "4", "--mbs", "1",
                 "--gbs", "128", "--precision", "fp8", "--dispatcher", "deepep", "--recompute",
                 "mla_up_proj,layernorm,moe,mlp", "--cuda-graphs", "none", "--optimizer-offload", "1.0"]


def test_issue_example_json(capsys):
    assert main(ISSUE_EXAMPLE + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["legal"] and out["fits"] and out["violations"] == []
    for key in ("peak_memory_gib", "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s"):
        assert out[key] > 0
    assert {"weights", "gradients", "optimizer_states", "activations"} <= set(out["breakdown"]["memory_gib"])
    assert out["breakdown"]["time_s"]["compute"] > 0
    assert out["layout"]["precision"] == "fp8-blockwise" and out["layout"]["optimizer_offload"] == 1.0


def test_issue_example_table(capsys):
    assert main(ISSUE_EXAMPLE) == 0
    out = capsys.readouterr().out
    assert "weights" in out and "optimizer_states" in out and "tokens/s/GPU" in out and "cp_comm" in out


def test_illegal_layout_prints_json_then_exits_2(capsys):
    rc = main(["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "4", "--seq-len", "512", "--pp", "3",
               "--json"])
    cap = capsys.readouterr()
    assert rc == 2
    out = json.loads(cap.out)
    assert out["legal"] is False and any(v["rule"] == "world_dense" for v in out["violations"])
    assert cap.err.startswith("error: ") and cap.err.count("\n") == 1 and "world_dense" in cap.err


@pytest.mark.parametrize("argv,needle", [
    (["--model", "nope", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096"], "unknown model"),
    (["--model", "tiny-moe", "--gpu", "tpu9", "--num-gpus", "8", "--seq-len", "4096"], "unknown GPU"),
    (["--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "1", "--seq-len", "0"], "seq-len"),
    (["--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "-1", "--seq-len", "64"], "num-gpus"),
    (["--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "1", "--seq-len", "64", "--precision", "fp4"], "precision"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    for command in ("estimate", "space"):
        if command == "space" and "--precision" in argv:
            continue
        assert main([command, *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_space_json(capsys):
    assert main(["space", "--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "4", "--seq-len", "512", "--top", "3",
                 "--gbs", "8", "--fix", "precision=fp32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["legal_count"] > 0 and out["fitting_count"] > 0 and out["rejected_by_rule"]
    assert 0 < len(out["top"]) <= 3
    top = out["top"][0]
    assert top["layout"]["precision"] == "fp32" and top["prediction"]["peak_memory_gib"] > 0


def test_space_free_levers_varies_the_memory_levers(capsys):
    """`--free levers` multiplies the space by every lever's values (3 activation offloads of an MoE, 2 stashes,
    2 moment precisions, fp8 weights or not); the layouts it ranks stay legal."""
    argv = ["space", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "1024", "--top", "3",
            "--max-grids", "4", "--json"]
    counts = {}
    for extra in ([], ["--free", "levers"]):
        assert main([*argv, *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        counts[bool(extra)] = out["total"]
        assert out["top"], out
    assert counts[True] == counts[False] * 3 * 2 * 2 * 2


def test_space_table(capsys):
    assert main(["space", "--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "2", "--seq-len", "256",
                 "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "rejections per rule" in out and "legal" in out


@pytest.mark.timeout(120)
def test_console_script(tmp_path):
    exe = shutil.which("moe-autotune", path=str(Path(sys.executable).parent)) or shutil.which("moe-autotune")
    if exe is None:
        pytest.skip("moe-autotune console script not installed (pip install -e .)")
    env = {**os.environ, "COLUMNS": "200"}
    ok = subprocess.run([exe, *ISSUE_EXAMPLE, "--json"], capture_output=True, text=True, timeout=100, env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["fits"] is True
    bad = subprocess.run([exe, "estimate", "--model", "nope", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "8"],
                         capture_output=True, text=True, timeout=100, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown model") and "Traceback" not in bad.stderr


@pytest.mark.parametrize("extra,gbs", [(["--gbs", "9216"], 9216), ([], 3 * 4)])  # no --gbs: MBS x DP = 3 x 4
def test_micro_batches_above_one_estimate(extra, gbs, capsys):
    """MBS > 1 is applied together with the batch (a layout is checked when built): published recipes with
    MBS 2-4 estimate, with or without --gbs."""
    argv = ["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096",
            "--tp", "2", "--mbs", "3", *extra, "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    layout = json.loads(capsys.readouterr().out)["layout"]
    assert (layout["mbs"], layout["gbs"]) == (3, gbs)


def test_batch_that_is_not_a_multiple_of_mbs_is_one_line(capsys):
    argv = ["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096",
            "--mbs", "3", "--gbs", "10"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "multiple of mbs (3)" in err and err.count("\n") == 1


def test_estimate_names_what_each_knob_would_change(capsys):
    """--json keeps every key and adds "neighbours": per knob, each neighbour value's tokens/s and peak memory and
    their deltas (or the rule that refuses it); the table prints them too."""
    assert main(ISSUE_EXAMPLE + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    near = out["neighbours"]
    knobs = {n["knob"] for n in near}
    assert {"tp", "cp", "ep", "pp", "precision", "recompute", "dispatcher", "cp_comm_type", "cuda_graphs"} <= knobs
    for n in near:
        if n["legal"]:
            assert n["tokens_per_sec_per_gpu"] > 0
            assert n["delta_tokens_pct"] == pytest.approx(100 * (n["tokens_per_sec_per_gpu"]
                                                                  / out["tokens_per_sec_per_gpu"] - 1))
            assert n["delta_peak_gib"] == pytest.approx(n["peak_memory_gib"] - out["peak_memory_gib"])
        else:
            assert n["violations"] and n["violations"][0]["rule"]
    assert {n["value"] for n in near if n["knob"] == "cp"} == {"16", "64"}  # the sizes beside CP32
    assert main(ISSUE_EXAMPLE) == 0
    assert "switching one knob" in capsys.readouterr().out


def test_routing_flag_estimates_each_mode_and_refuses_what_megatron_refuses(capsys):
    base = ["estimate", "--model", "qwen3-235b-a22b", "--gpu", "h100", "--num-gpus", "256", "--seq-len", "16384",
            "--tp", "4", "--ep", "8", "--pp", "8", "--vpp", "4", "--gbs", "256", "--precision", "bf16",
            "--recompute", "layernorm,moe", "--json"]
    tflops = {}
    for routing, dispatcher in (("forced_balance", "deepep"), ("dropless", "deepep"), ("capacity:1.0", "hybridep")):
        assert main(base + ["--routing", routing, "--dispatcher", dispatcher]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["layout"]["routing"] == routing
        tflops[routing] = out["tflops_per_gpu"]
    assert tflops["dropless"] < tflops["forced_balance"]  # the busiest EP rank sets the pace
    assert main(base + ["--routing", "capacity:1.0", "--dispatcher", "deepep"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "routing_dispatcher" in err and err.count("\n") == 1
    assert main([*base, "--routing", "capacity"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "capacity:F" in err and err.count("\n") == 1


# ---- a config.json path: how it was read, above the tables and under "model_reading" (issue 55) -----------------
TINY_CONFIG = Path(__file__).resolve().parents[2] / "search_spaces" / "catalog" / "hf_configs" / "tiny-moe.json"
SMALL = ["--gpu", "cpu", "--num-gpus", "2", "--seq-len", "256"]


@pytest.fixture
def config_folder(tmp_path):
    """A config.json in a folder of its own (the model is named after the folder), the catalog's tiny-moe file."""
    folder = tmp_path / "my-moe"
    folder.mkdir()
    (folder / "config.json").write_text(TINY_CONFIG.read_text())
    return folder


def _model_json(path, capsys) -> dict:
    assert main(["model", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command,extra", [("estimate", []), ("space", ["--top", "2", "--max-grids", "4"])])
def test_a_config_path_shows_its_reading_above_the_tables(command, extra, config_folder, capsys):
    assert main(["model", str(config_folder)]) == 0
    reading = capsys.readouterr().out
    assert reading.startswith("my-moe\n") and "parameters:" in reading and "ignored:" in reading
    assert main([command, "--model", str(config_folder), *SMALL, *extra]) == 0
    out = capsys.readouterr().out
    assert out.startswith(reading)  # the model command's lines, first, then the tables
    assert "predicted" in out[len(reading):]


@pytest.mark.parametrize("command,extra", [("estimate", []), ("space", ["--top", "2", "--max-grids", "4"])])
def test_a_config_path_puts_its_reading_in_the_json(command, extra, config_folder, capsys):
    expected = _model_json(config_folder, capsys)
    assert main([command, "--model", str(config_folder / "config.json"), *SMALL, *extra, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model_reading"] == expected
    assert (expected["total_params"], expected["experts"], expected["topk"]) == (493_248, 4, 2)


def test_the_reading_is_of_the_model_as_estimated(config_folder, capsys):
    """--num-layers applies to the reading too: it describes what the figures are of."""
    assert main(["estimate", "--model", str(config_folder), *SMALL, "--num-layers", "2", "--json"]) == 0
    reading = json.loads(capsys.readouterr().out)["model_reading"]
    assert reading["layers"] == 2 and reading["pattern"] == "2 × MoE+full"
    assert reading["total_params"] < _model_json(config_folder, capsys)["total_params"]


def test_a_catalog_name_prints_no_reading(capsys):
    for command, extra in (("estimate", []), ("space", ["--top", "2", "--max-grids", "4"])):
        assert main([command, "--model", "tiny-moe", *SMALL, *extra, "--json"]) == 0
        assert "model_reading" not in json.loads(capsys.readouterr().out)
        assert main([command, "--model", "tiny-moe", *SMALL, *extra]) == 0
        assert "parameters:" not in capsys.readouterr().out
