"""`moe-autotune estimate --explain`: each term of the predicted step against the kernel tables, as a table and as
the `explain` list of --json; without the flag the output is what it was; bad input stays one line, exit 2."""

import json

import pytest

from orchestrator.commands.cli import main

QWEN = ["estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--num-gpus", "16", "--seq-len", "4096", "--ep", "8",
        "--precision", "bf16", "--dispatcher", "deepep"]


def test_explain_json_carries_every_term(capsys):
    assert main([*QWEN, "--explain", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    explain = out["explain"]
    assert list(dict.fromkeys(row["component"] for row in explain)) == list(out["breakdown"]["time_s"])
    gemm = [row for row in explain if row["component"] == "gemm"]
    assert [row["part"] for row in gemm] == ["dense GEMMs", "expert grouped GEMMs (one expert)"]
    for row in gemm:
        table = row["table"]
        assert row["range"] in ("inside", "extrapolated") and row["implied"] > 0 and 0 < row["implied_share"] < 1
        assert table["gpu"] == "h200" and table["precision"] == "bf16" and table["unit"] == "TFLOP/s"
        assert table["source"].startswith("this project@") and table["quote"] and table["ratio_model_to_table"] > 0
    attention = [row for row in explain if row["component"] == "attention"]
    assert {row["part"] for row in attention} == {"forward", "backward"}
    assert all(row["range"] == "extrapolated" and "hopper" in row["why"] for row in attention)
    ep = next(row for row in explain if row["component"] == "ep_comm")
    assert ep["shape"] == {"ep_span": 8, "link": "nvlink", "dispatcher": "deepep"} and ep["table"]["unit"] == "GB/s"
    other = next(row for row in explain if row["component"] == "optimizer")
    assert other["range"] == "no table" and other["table"] is None and other["why"]


def test_without_explain_the_json_has_no_explain_key(capsys):
    assert main([*QWEN, "--json"]) == 0
    assert "explain" not in json.loads(capsys.readouterr().out)


def test_explain_table(capsys):
    assert main([*QWEN, "--explain"]) == 0
    out = capsys.readouterr().out
    assert "why: each term of the step against the kernel tables" in out
    assert "DeepEP" in out and "extrapolated" in out and "no table" in out


def test_explain_of_an_illegal_layout_is_empty_and_exits_2(capsys):
    rc = main(["estimate", "--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "4", "--seq-len", "512", "--pp", "3",
               "--explain", "--json"])
    cap = capsys.readouterr()
    assert rc == 2 and json.loads(cap.out)["explain"] == []
    assert cap.err.startswith("error: ") and cap.err.count("\n") == 1


@pytest.mark.parametrize("argv,needle", [
    (["--model", "nope", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096"], "unknown model"),
    (["--model", "tiny-moe", "--gpu", "tpu9", "--num-gpus", "8", "--seq-len", "4096"], "unknown GPU"),
    (["--model", "tiny-moe", "--gpu", "cpu", "--num-gpus", "1", "--seq-len", "64", "--precision", "fp4"], "precision"),
])
def test_bad_input_with_explain_is_one_line_exit_2(argv, needle, capsys):
    assert main(["estimate", *argv, "--explain"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1 and "Traceback" not in err
