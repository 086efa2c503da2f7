"""A request with no answer says so (issue 56, part 4): `space` and `estimate` never print an empty table with exit 0;
a space with no layout to list is one line naming the rule(s) that emptied it (or the memory nothing fits in), exit 2.
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search_spaces.layouts.emptiness import binding_rules
from search_spaces.layouts.rules import RULES

from orchestrator.commands.cli import main

# a row of `space`'s table of the fastest fitting layouts: "│ 1 │ tp1/cp1/..."
_FIRST_ROW = re.compile(r"^│\s*1\s*│\s*tp\d+/", re.M)
_LIMITS = ("--budget", "--max-grids")


def _space(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["space", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _names_why(line: str) -> bool:
    """The line names a legality rule, the memory, or the search limit that left the space empty."""
    return any(re.search(rf"\b{re.escape(rule)}\b", line) for rule in RULES) or "memory" in line or any(
        limit in line for limit in _LIMITS)


def test_250_gpus_is_one_line_naming_the_batch_rule_and_a_batch_they_divide_answers(capsys):
    """The issue's example: 250 GPUs printed an empty table with exit 0. Counted by the first rule each combination
    breaks, pipeline_split leads, but it is global_batch that refuses everything the other rules let through: the
    line names it, and a batch that 250's data-parallel sizes divide (4000) has an answer."""
    argv = ("--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "250", "--seq-len", "4096", "--max-grids", "8")
    code, out, err = _space(capsys, *argv)
    line = _one_line(err)
    assert code == 2 and out == ""
    assert "no legal layout of tiny-moe on 250 x h100" in line
    assert "every layout the other rules allow breaks global_batch (" in line, line
    assert "pipeline_split 14,929,920" in line  # the counts are still there, largest first
    code, out, err = _space(capsys, *argv, "--gbs", "4000", "--top", "1")
    assert code == 0 and _FIRST_ROW.search(out), err


def test_a_sequence_nothing_fits_is_one_line_naming_memory(capsys):
    code, out, err = _space(capsys, "--model", "deepseek-v3", "--gpu", "h100", "--num-gpus", "8", "--seq-len",
                            "131071", "--json")
    line = _one_line(err)
    assert code == 2 and out == ""
    assert line.startswith("error: nothing fits in memory: none of the ") and "79.6 GiB per GPU" in line, line


def test_a_search_cut_short_before_anything_fits_says_which_limit(capsys):
    code, _, err = _space(capsys, "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096",
                          "--budget", "0.000001")
    assert code == 2 and "--budget ran out first (raise --budget" in _one_line(err)


def test_top_zero_is_refused_not_an_empty_table(capsys):
    code, out, err = _space(capsys, "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096",
                            "--top", "0")
    assert code == 2 and "--top" in _one_line(err) and out == ""


def test_binding_rules_are_those_of_the_deepest_level_that_refused_any():
    counts = {"pipeline_split": 900, "world_dense": 50, "global_batch": 3, "interleaved_microbatches": 7}
    assert binding_rules(counts) == ["interleaved_microbatches", "global_batch"]  # mbs level, most first
    assert binding_rules({"heads_tp": 4, "world_dense": 0}) == ["heads_tp"]  # a rule that refused none is no cause
    assert binding_rules({}) == []


_MODELS = st.sampled_from(["tiny-moe", "deepseek-v3", "llama3-8b", "tiny-mla-moe"])
_GPUS = st.sampled_from(["h100", "b200", "cpu"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=_MODELS, gpu=_GPUS, num_gpus=st.integers(1, 600), seq_len=st.integers(1, 300_000),
       gbs=st.one_of(st.none(), st.integers(1, 5000)))
def test_every_space_answer_has_a_row_or_is_one_line_naming_why(capsys, model, gpu, num_gpus, seq_len, gbs):
    argv = ["--model", model, "--gpu", gpu, "--num-gpus", str(num_gpus), "--seq-len", str(seq_len),
            "--top", "2", "--max-grids", "6", *(["--gbs", str(gbs)] if gbs else [])]
    code, out, err = _space(capsys, *argv)
    if code == 0:
        assert _FIRST_ROW.search(out), f"exit 0 without a layout listed: {argv}\n{out[-2000:]}"
        return
    line = _one_line(err)
    assert code == 2 and out == "", argv
    assert _names_why(line), f"{argv}: {line}"


_LAYOUT_FLAGS = st.fixed_dictionaries({}, optional={
    "--tp": st.sampled_from([1, 2, 3, 4, 8]), "--cp": st.sampled_from([1, 2, 4, 16]),
    "--pp": st.sampled_from([1, 2, 3, 4, 7]), "--ep": st.sampled_from([1, 2, 4, 5, 8, 64]),
    "--vpp": st.sampled_from([1, 2, 4])})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=_MODELS, num_gpus=st.integers(1, 600), seq_len=st.integers(1, 300_000), flags=_LAYOUT_FLAGS)
def test_every_estimate_answer_has_rows_or_exits_2_naming_the_rule(capsys, model, num_gpus, seq_len, flags):
    argv = ["estimate", "--model", model, "--gpu", "h100", "--num-gpus", str(num_gpus), "--seq-len", str(seq_len),
            *(str(x) for kv in flags.items() for x in kv)]
    capsys.readouterr()
    code = main(argv)
    cap = capsys.readouterr()
    if code == 0:
        assert re.search(r"tokens/s/GPU\s*│\s*[\d,.]+", cap.out), f"{argv}\n{cap.out[-2000:]}"
        return
    line = _one_line(cap.err)
    assert code == 2, argv
    assert line.startswith("error: illegal layout: ") and _names_why(line), f"{argv}: {line}"
