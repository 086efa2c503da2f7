"""Issue 34: every file moe-autotune reads is read within bounds, the calibration's constants within their physical
ranges, and an error line quotes a file only as a short, masked excerpt.

Each class has the cases that failed before (a RecursionError, CPython's 4,300-digit ValueError, an OverflowError,
csv's AttributeError, ZeroDivisionError, NaN printed as JSON, a netrc printed whole) and a Hypothesis property over
generated files: the CLI exits 0, or exits 2 with exactly one `error:` line; no traceback; nothing under the test's
folder created or changed.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import logging
import math
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from search_spaces.bounded import MAX_DEPTH, MAX_INT_DIGITS, loads_json, loads_yaml, parse_count, read_csv
from search_spaces.calibration.calibration_file import Calibration, calibration, constant_range
from search_spaces.calibration.fit import FAMILY_PARAMETERS, SHARED_PARAMETERS
from search_spaces.errors import MoeAutotuneError, SpecError
from search_spaces.inputs import EXCERPT_CHARS, excerpt

from orchestrator.dispatch.replay import load_table
from orchestrator.sweep.spool import ResultSpool
from orchestrator.tracking.record_spool import _spool_record
from orchestrator.tracking.views import _saved_view
from orchestrator.userio import json_line
from tests.search_spaces.test_hostile_properties import PROPERTY, assert_answered, inside, run, snapshot

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "tests" / "data" / "replay_small.csv"
ESTIMATE = ["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "1024", "--json"]
DEEP = 5000  # levels: past Python's recursion limit (1,000), as the files were
DIGITS = 5000  # past CPython's 4,300-digit limit on int(str)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder of its own, the working directory while a command runs: whatever a command leaves shows here."""
    return tmp_path_factory.mktemp("bounded")


def refused(argv: list[str], folder: Path, *needles: str) -> str:
    """Run the CLI in `folder`: exactly one `error:` line containing every needle, exit 2, nothing created or
    changed there; the line."""
    before = snapshot(folder)
    with inside(folder):
        code, out, err = run(argv)
    assert_answered(code, out, err)
    assert code == 2, (code, out[-500:])
    line = err.strip()
    for needle in needles:
        assert needle in line, line
    assert snapshot(folder) == before
    return line


def strict_json(text: str) -> object:
    """json.loads that refuses NaN and Infinity (RFC 8259): what jq or a browser accept."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def table_rows() -> tuple[list[str], list[list[str]]]:
    with TABLE.open(newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def table_text(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


# ==== class 1: bounded parsers — the cases that failed before ====================================================
@pytest.mark.parametrize("text", ["[" * DEEP + "]" * DEEP, '{"a": ' * DEEP + "1" + "}" * DEEP,
                                  '{"gemm_efficiency": ' + '{"x": ' * DEEP + "1" + "}" * DEEP + "}"])
def test_a_calibration_nested_thousands_deep_is_one_line_not_a_recursion_error(scratch, text):
    (scratch / "deep.json").write_text(text)
    refused([*ESTIMATE, "--calibration", str(scratch / "deep.json")], scratch, f"nested deeper than {MAX_DEPTH}")


@pytest.mark.parametrize("text", ["name: x\nmodel: " + "[" * DEEP + "]" * DEEP + "\n",
                                  '{"name": "x", "fixed": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}",
                                  "name: x\nfree:\n" + "".join("  " * i + "- \n" for i in range(900))])
def test_a_spec_nested_thousands_deep_is_one_line_not_a_recursion_error(scratch, text):
    (scratch / "deep.yaml").write_text(text)
    refused(["sweep", str(scratch / "deep.yaml")], scratch, "nested deeper than")


def test_an_integer_of_5000_digits_in_a_spec_or_a_calibration_is_one_line(scratch):
    huge = "9" * DIGITS
    (scratch / "huge.yaml").write_text(f"name: x\nnodes: {huge}\n")
    refused(["sweep", str(scratch / "huge.yaml")], scratch, f"{DIGITS:,} digits", f"at most {MAX_INT_DIGITS}")
    (scratch / "huge.json").write_text(f'{{"elementwise_passes": {huge}}}')
    refused([*ESTIMATE, "--calibration", str(scratch / "huge.json")], scratch, f"{DIGITS:,} digits")
    (scratch / "huge-spec.json").write_text(f'{{"name": "x", "seed": -{huge}}}')  # a JSON spec (JSON is YAML)
    refused(["sweep", str(scratch / "huge-spec.json")], scratch, f"{DIGITS:,} digits")


@pytest.mark.parametrize("column", ["num_gpus", "seq_len", "tp", "mbs", "gbs"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "9" * DIGITS])
def test_inf_or_a_huge_number_in_an_integer_column_of_a_table_is_one_line(scratch, column, value):
    header, rows = table_rows()
    rows[1][header.index(column)] = value
    (scratch / "inf.csv").write_text(table_text(header, rows))
    line = refused(["calibrate", "--out", str(scratch / "cal.json"), "--table", str(scratch / "inf.csv")], scratch,
                   "line 3", column)
    assert len(line) < 400


@pytest.mark.parametrize("change, needle", [
    (lambda row: row + ["x", "y"], "24 cells, but the header has 22 columns"),  # csv's rest-key list before
    (lambda row: row[:5], "5 cells, but the header has 22 columns"),
])
def test_a_table_row_with_more_or_fewer_cells_than_its_header_is_one_line(scratch, change, needle):
    header, rows = table_rows()
    rows[0] = change(rows[0])
    (scratch / "cells.csv").write_text(table_text(header, rows))
    refused(["calibrate", "--out", str(scratch / "cal.json"), "--table", str(scratch / "cells.csv")], scratch,
            "line 2", needle)


def test_a_replay_sweep_refuses_a_damaged_table_before_it_stores_anything(tmp_path):
    header, rows = table_rows()
    rows[0] = rows[0] + ["extra"]
    (tmp_path / "t.csv").write_text(table_text(header, rows))
    spec = {"name": "rp", "model": "tiny-moe", "gpu": "cpu", "gpus_per_node": 4, "seq_len": 128, "gbs": 8,
            "backend": "replay", "replay_table": str(tmp_path / "t.csv"), "tracking_uri": "none",
            "storage": f"sqlite:///{tmp_path / 'optuna.db'}", "workdir": str(tmp_path / "runs")}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    refused(["sweep", str(tmp_path / "spec.yaml")], tmp_path, "cells, but the header has")


def test_damaged_spool_lines_are_skipped_with_a_warning_not_raised(tmp_path, caplog):
    """The result spool and the MLflow spool are read back on --resume: a line nested too deep or holding a huge
    integer is one damaged line, like a torn one (before: RecursionError, ValueError)."""
    good = json.dumps({"trial_number": 1, "attrs": {}})
    path = tmp_path / "results-spool.jsonl"
    path.write_text("\n".join([good, "[" * DEEP + "]" * DEEP, '{"trial_number": ' + "9" * DIGITS + ', "attrs": {}}',
                               "x" * ((1 << 20) + 5), json.dumps({"trial_number": 2, "attrs": {}})]) + "\n")
    with caplog.at_level(logging.WARNING, logger="moe_autotune"):
        kept = ResultSpool(path).records()
    assert sorted(kept) == [1, 2]
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 3
    assert _spool_record("[" * DEEP + "]" * DEEP) is None
    assert _spool_record('{"trial_number": ' + "9" * DIGITS + ', "payload": {}}') is None
    assert _saved_view('{"state": ' + "[" * DEEP + "]" * DEEP + "}") is None


def test_counts_read_back_are_whole_finite_and_short():
    assert [parse_count(t) for t in ("8", " 8 ", "8.0", "1e3", "-3")] == [8, 8, 8, 1000, -3]
    assert all(parse_count(t) is None for t in ("", "inf", "-inf", "nan", "8.5", "1e999", "9" * 70, "x", "0x10"))


# ==== class 1: properties over generated files ===================================================================
LITERALS = ["0", "-0.0", "1", "5e-324", "1e308", "1e999", "-1e999", "NaN", "Infinity", "-Infinity", "true", "null",
            '"x"', "0.5", "2.5e-7"]


@st.composite
def json_values(draw, depth: int = 0) -> str:
    """JSON text of one value: numbers of any size and digit count, nesting of any depth, keys given twice."""
    kind = draw(st.sampled_from(["literal", "digits", "nest", "object"] if depth < 3 else ["literal", "digits"]))
    if kind == "literal":
        return draw(st.sampled_from(LITERALS))
    if kind == "digits":
        return draw(st.sampled_from(["", "-"])) + "9" * draw(st.integers(1, 6000))
    if kind == "nest":
        levels = draw(st.integers(1, 3000))
        opener = draw(st.sampled_from(["[", '{"k": ']))
        closer = "]" if opener == "[" else "}"
        return opener * levels + draw(st.sampled_from(LITERALS)) + closer * levels
    keys = draw(st.lists(st.sampled_from(["a", "hopper", "bf16", "cpu", "x86"]), min_size=1, max_size=3))
    return "{" + ", ".join(f'"{k}": {draw(json_values(depth + 1))}' for k in keys) + "}"


@st.composite
def calibration_texts(draw) -> str:
    names = [n for n in Calibration.model_fields if n != "software"]
    keys = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4))  # a key may come twice
    text = "{" + ", ".join(f'"{k}": {draw(json_values())}' for k in keys) + "}"
    if draw(st.booleans()):
        text = '{"format": "moe-autotune calibration", "constants": ' + text + "}"
    return text if draw(st.integers(0, 9)) else draw(st.text(max_size=200))


@PROPERTY
@given(text=calibration_texts())
def test_any_calibration_file_answers_or_is_refused_with_one_line(scratch, text):
    (scratch / "cal.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    before = snapshot(scratch)
    with inside(scratch):
        code, out, err = run([*ESTIMATE, "--calibration", str(scratch / "cal.json")])
    assert_answered(code, out, err)
    if code == 0:
        assert math.isfinite(strict_json(out)["tokens_per_sec_per_gpu"])
    assert snapshot(scratch) == before


@st.composite
def config_texts(draw) -> str:
    tiny = json.loads((ROOT / "search_spaces" / "catalog" / "hf_configs" / "tiny-moe.json").read_text())
    fields = draw(st.lists(st.sampled_from([*tiny, "layer_types", "rope_scaling"]), min_size=1, max_size=3))
    body = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in tiny.items())
    return "{" + body + "".join(f', "{k}": {draw(json_values())}' for k in fields) + "}"


@settings(PROPERTY, max_examples=max(1, settings.default.max_examples // 2))  # a model parsed per example
@given(text=config_texts())
def test_any_config_json_within_or_past_the_parser_bounds_answers_with_one_line(scratch, text):
    folder = scratch / "configs" / str(abs(hash(text)))  # models are cached by path
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(text)
    before = snapshot(scratch)
    with inside(scratch):
        code, out, err = run(["estimate", "--model", str(folder / "config.json"), "--gpu", "h100", "--num-gpus",
                              "8", "--seq-len", "1024", "--json"])
    assert_answered(code, out, err)
    assert snapshot(scratch) == before


@st.composite
def yaml_values(draw) -> str:
    """One YAML value in flow or block style: nested to any depth, integers of any digit count."""
    kind = draw(st.sampled_from(["flow", "block", "digits", "hex", "sexagesimal", "plain"]))
    if kind == "flow":
        levels = draw(st.integers(1, 3000))
        return draw(st.sampled_from(["[", "{a: "])) * levels
    if kind == "block":
        return "\n" + "".join("  " * (i + 1) + "- \n" for i in range(draw(st.integers(1, 900))))
    if kind == "digits":
        return draw(st.sampled_from(["", "-", "+"])) + "9" * draw(st.integers(1, 6000))
    if kind == "hex":
        return "0x" + "f" * draw(st.integers(1, 6000))
    if kind == "sexagesimal":
        return ":".join(["59"] * draw(st.integers(2, 3000)))
    return draw(st.sampled_from(["1e999", ".inf", ".nan", "1_000", "0o17", "~", "[1, 2]"]))


# PyYAML scans up to 1,024 characters ahead in a flow collection (a possible simple key): about a second for a
# text of thousands of '[' before the depth bound refuses it. A third of the profile's examples.
@settings(PROPERTY, max_examples=max(1, settings.default.max_examples // 3))
@given(field=st.sampled_from(["nodes", "seq_len", "seed", "fixed", "budget", "free", "cost", "model", "x"]),
       value=yaml_values(), flow=st.booleans())
def test_any_spec_past_the_parser_bounds_answers_or_is_refused_with_one_line(scratch, field, value, flow):
    base = "name: bounded\nmodel: tiny-moe\ngpu: h100\nseq_len: 1024\nbackend: analytic\ntracking_uri: none\n"
    text = base.replace(f"{field}: ", "#") + f"{field}: {value}" + ("]" * 3100 if flow else "") + "\n"
    (scratch / "spec.yaml").write_text(text)
    before = snapshot(scratch)
    with inside(scratch):
        code, out, err = run(["slurm", "render", str(scratch / "spec.yaml")])
    assert_answered(code, out, err)
    assert snapshot(scratch) == before


# hostile cells: inf, nan, huge, empty, text, quotes and line breaks, secrets
CELLS = st.one_of(st.sampled_from(["inf", "-inf", "nan", "NaN", "1e999", "-1", "0", "", "none", "-", "8.5", "1e3",
                                   "9" * 5000, "x" * 5000, '"', "a\nb", "ok", "oom", "invalid"]),
                  st.text(max_size=30), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                  st.integers(-2 ** 80, 2 ** 80).map(str))


@st.composite
def table_texts(draw) -> str:
    header, rows = table_rows()
    rows = copy.deepcopy(rows[:draw(st.integers(0, 6))])
    for _ in range(draw(st.integers(0, 8))):  # any cell of any column, number columns included
        if rows:
            rows[draw(st.integers(0, len(rows) - 1))][draw(st.integers(0, len(header) - 1))] = draw(CELLS)
    edit = draw(st.sampled_from(["none", "none", "extra cells", "fewer cells", "header", "bytes"]))
    if edit == "extra cells" and rows:
        rows[-1] += draw(st.lists(CELLS, min_size=1, max_size=3))
    elif edit == "fewer cells" and rows:
        rows[-1] = rows[-1][:draw(st.integers(0, len(header) - 1))]
    elif edit == "header":
        header = draw(st.lists(st.sampled_from([*header, "colour", "", "tp"]), min_size=0, max_size=30))
    elif edit == "bytes":
        return draw(st.binary(max_size=400)).decode("latin-1")
    return table_text(header, rows)


@settings(PROPERTY, max_examples=max(1, settings.default.max_examples // 2))  # a refusal runs the CLI too
@given(text=table_texts())
def test_any_table_is_read_within_bounds_or_refused_with_one_line(scratch, text):
    """load_table is the one reader of replay and calibration tables: a table, or one SpecError line; a refused
    table is one line from `calibrate --table` too (which writes no file)."""
    path = scratch / "table.csv"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        table = load_table(path)
    except SpecError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600
        refused(["calibrate", "--out", str(scratch / "cal.json"), "--table", str(path)], scratch)
        return
    for row in table.rows.values():
        for value in (row.tokens_per_sec_per_gpu, row.peak_memory_gib, row.measured.tflops_per_gpu):
            assert value is None or math.isfinite(value)
        assert row.status != "ok" or row.tokens_per_sec_per_gpu is not None


@PROPERTY
@given(depth=st.integers(1, 3 * MAX_DEPTH), digits=st.integers(1, 3 * MAX_INT_DIGITS),
       style=st.sampled_from(["json", "yaml"]))
def test_the_bounds_hold_exactly_where_they_are_declared(depth, digits, style):
    nested = "[" * depth + "1" + "]" * depth
    number = "9" * digits
    load = loads_json if style == "json" else loads_yaml
    for text, fine in ((nested, depth <= MAX_DEPTH), ("[" + number + "]", digits <= MAX_INT_DIGITS)):
        if fine:
            assert load(text, "x") is not None
        else:
            with pytest.raises(SpecError):
                load(text, "x")


# ==== class 2: the calibration constants' physical ranges ========================================================
@pytest.mark.parametrize("content, needle", [
    ('{"gemm_efficiency": {"hopper": {"bf16": 1e308, "fp8": 1e308}}}', "gemm_efficiency.hopper.bf16"),  # ZeroDivision
    ('{"comm_efficiency": 0.5, "comm_efficiency": 1e-300}', "duplicate key 'comm_efficiency'"),  # OverflowError
    ('{"attention_fwd_efficiency": {"hopper": 5e-324}}', "attention_fwd_efficiency.hopper"),  # NaN, exit 0
    ('{"elementwise_passes": 1e308}', "elementwise_passes"),  # NaN and Infinity, exit 0
    ('{"dispatcher_efficiency": {"alltoall": 5e-324}}', "dispatcher_efficiency.alltoall"),  # NaN, exit 0
    ('{"ep_serial_exposed": 1e308}', "ep_serial_exposed"),  # OverflowError
    ('{"host_kernel_launch_s": {"x86": 1e308}}', "host_kernel_launch_s.x86"),  # ZeroDivisionError
])
def test_a_constant_outside_its_physical_range_is_one_line_naming_it_and_its_range(scratch, content, needle):
    (scratch / "range.json").write_text(content)
    line = refused([*ESTIMATE, "--calibration", str(scratch / "range.json")], scratch, needle)
    if "duplicate" not in needle:
        assert "within [" in line and "got " in line


def test_every_fit_moves_its_constants_within_their_physical_ranges():
    """A calibration `calibrate` or the benchmarks fit is never refused when read back: each fit's bounds lie
    within its constant's range, and so do the packaged constants and the defaults."""
    for p in (*SHARED_PARAMETERS, *(p for ps in FAMILY_PARAMETERS.values() for p in ps)):
        r = constant_range(p.constant)
        assert r.low <= p.lower <= p.upper <= r.high, (p.name, r)
    assert Calibration.model_validate(calibration().model_dump()) == calibration()
    Calibration()  # the defaults


def test_estimate_json_is_strict_json_and_a_figure_that_is_not_finite_is_one_line(scratch):
    with inside(scratch):
        code, out, err = run(ESTIMATE)
    assert code == 0 and strict_json(out)["tokens_per_sec_per_gpu"] > 0
    with pytest.raises(MoeAutotuneError, match=r"estimate --json: breakdown\.time\[1\] is nan, not a finite"):
        json_line({"a": 1.0, "breakdown": {"time": [0.5, float("nan")]}}, "estimate --json")


def _leaves(data: dict, path: tuple = ()) -> list[tuple]:
    out = []
    for key, value in data.items():
        out += _leaves(value, (*path, key)) if isinstance(value, dict) else [(*path, key)]
    return out


def _is_constant(name: str) -> bool:
    """A field with a physical range (not the software the constants belong to, nor the release they assume)."""
    try:
        constant_range(name)
    except KeyError:
        return False
    return True


CONSTANT_PATHS = _leaves({k: v for k, v in Calibration().model_dump().items() if _is_constant(k)})
ANY_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=0, max_value=1e-300),
                      st.sampled_from([0.0, -0.0, 5e-324, 2.2e-308, 1e-300, 1e308, 1.7976931348623157e308, -1.0]),
                      st.integers(-2 ** 70, 2 ** 70), st.booleans(), st.text(max_size=5))


@st.composite
def constants(draw) -> tuple[dict, bool]:
    """Some constants (a table's entries alike) set to any value, drawn in or out of range; and whether all
    are within their ranges."""
    data: dict = {}
    within = True
    for path in draw(st.lists(st.sampled_from(CONSTANT_PATHS), min_size=1, max_size=len(CONSTANT_PATHS),
                              unique=True)):
        r = constant_range(path[0])
        value = draw(st.one_of(ANY_FLOAT, st.floats(r.low, r.high), st.sampled_from([r.low, r.high])))
        within &= isinstance(value, (int, float)) and not isinstance(value, bool) and r.low <= value <= r.high
        node = data
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return data, within


@PROPERTY
@given(drawn=constants(), gpu=st.sampled_from(["h100", "b200", "cpu"]),
       model=st.sampled_from(["tiny-moe", "tiny-qwen3-next", "tiny-mla-moe"]))
def test_any_constants_give_strict_json_or_one_line_naming_a_constant(scratch, drawn, gpu, model):
    data, within = drawn
    (scratch / "constants.json").write_text(json.dumps(data))  # Python's json writes NaN and Infinity too
    with inside(scratch):
        code, out, err = run(["estimate", "--model", model, "--gpu", gpu, "--num-gpus", "8", "--seq-len", "1024",
                              "--json", "--calibration", str(scratch / "constants.json")])
    assert_answered(code, out, err)
    if within:  # within the ranges the model answers, every figure finite
        assert code == 0, err
    if code == 0:
        assert math.isfinite(strict_json(out)["tokens_per_sec_per_gpu"])
    else:
        assert "constant " in err, err


# ==== class 3: a file is quoted only as a short, masked excerpt ==================================================
NETRC = "machine example.com login alice password {secret}\n"
ENV = "AWS_SECRET_ACCESS_KEY={secret}\nDATABASE_URL=postgresql://u:{secret}@db/x\n"


@pytest.mark.parametrize("content", [NETRC, ENV, "TOKEN={secret}\n", "model,gpu,password={secret}\n"])
def test_a_file_of_secrets_named_as_a_table_is_not_printed(scratch, content):
    """Before: `replay table x: unknown column 'AWS_SECRET_ACCESS_KEY=...'`, the whole line, every secret in it."""
    secret = "zq" + "Hunter2Secret" * 3
    (scratch / "secrets").write_text(content.format(secret=secret))
    line = refused(["calibrate", "--out", str(scratch / "cal.json"), "--table", str(scratch / "secrets")], scratch)
    assert secret not in line and secret[:8] not in line


@pytest.mark.parametrize("content", [NETRC, ENV, "TOKEN={secret}\n"])
def test_a_file_of_secrets_named_as_a_replay_table_is_not_printed(tmp_path, content):
    """The same file given as a sweep's `replay_table`: the refusal names the file, never what it holds."""
    secret = "zq" + "Hunter2Secret" * 3
    (tmp_path / "secrets").write_text(content.format(secret=secret))
    spec = {"name": "rp", "model": "tiny-moe", "gpu": "cpu", "gpus_per_node": 4, "seq_len": 128, "gbs": 8,
            "backend": "replay", "replay_table": str(tmp_path / "secrets"), "tracking_uri": "none",
            "storage": f"sqlite:///{tmp_path / 'optuna.db'}", "workdir": str(tmp_path / "runs")}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    line = refused(["sweep", str(tmp_path / "spec.yaml")], tmp_path, "secrets")
    assert secret not in line and secret[:8] not in line


SECRET_SHAPES = ["password={s}", "PASSWORD: {s}", "login u password {s}", "postgresql://user:{s}@host/db",
                 "https://u:{s}@mlflow.example/x", "Authorization: Bearer {s}", '"token": "{s}"', "api_key={s}",
                 "host=db user=u password={s}", "ghp_{s}{s}", "export DB_PASSWD='{s} x'"]


@settings(PROPERTY, max_examples=max(1, settings.default.max_examples // 3))  # a command (or two) per example
@given(secret=st.text(string.ascii_letters + string.digits, min_size=10, max_size=24).map(lambda s: "zq" + s),
       shape=st.sampled_from(SECRET_SHAPES), where=st.sampled_from(["header", "status", "num_gpus", "tp", "model",
                                                                      "tokens_per_sec_per_gpu",
                                                                      "spec key", "spec value", "calibration key",
                                                                      "calibration value", "config key"]))
def test_a_secret_in_any_file_never_reaches_an_error_line(scratch, secret, shape, where):
    planted = shape.format(s=secret)
    header, rows = table_rows()
    if where in ("header", "status", "num_gpus", "tp", "model", "tokens_per_sec_per_gpu"):
        if where == "header":
            header[-1] = planted
        elif where == "tokens_per_sec_per_gpu":  # every row: no measurement left, the refusal quotes the first
            for row in rows:
                row[header.index(where)] = planted
        else:
            rows[0][header.index(where)] = planted
        (scratch / "t.csv").write_text(table_text(header, rows))
        argv = ["calibrate", "--out", str(scratch / "cal.json"), "--table", str(scratch / "t.csv")]
    elif where.startswith("spec"):
        data = {"name": "quoted", "model": "tiny-moe", "gpu": "h100", "backend": "analytic", "tracking_uri": "none",
                "storage": f"sqlite:///{scratch / 'quoted.db'}"}
        data.update({planted: 1} if where == "spec key" else {("gpu", "model")[len(secret) % 2]: planted})
        (scratch / "s.yaml").write_text(yaml.safe_dump(data))
        argv = ["sweep", str(scratch / "s.yaml")]
    elif where.startswith("calibration"):
        data = {planted: 0.5} if where == "calibration key" else {"comm_efficiency": planted}
        (scratch / "c.json").write_text(json.dumps(data))
        argv = [*ESTIMATE, "--calibration", str(scratch / "c.json")]
    else:
        tiny = json.loads((ROOT / "search_spaces" / "catalog" / "hf_configs" / "tiny-moe.json").read_text())
        folder = scratch / "secret-configs" / str(abs(hash(planted)))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({**tiny, planted: 1, "hidden_size": planted}))
        argv = ["estimate", "--model", str(folder / "config.json"), "--gpu", "h100", "--num-gpus", "8",
                "--seq-len", "1024"]
    before = snapshot(scratch)
    with inside(scratch):
        code, out, err = run(argv)
    assert_answered(code, out, err)
    assert code == 2 and secret not in err, err
    assert snapshot(scratch) == before


def test_an_excerpt_is_short_one_line_and_masked():
    for text in ("x" * 10_000, "a\nb\rc\x1b[31m", "caf\u00e9 " * 50, "password=hunter2hunter2 and more"):
        shown = excerpt(text)
        assert len(shown) <= EXCERPT_CHARS and shown.isprintable() and "hunter2" not in shown


def test_csv_reader_bounds_cells_and_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1," + "x" * 5000 + "\n")
    with pytest.raises(SpecError, match="a cell of 5,000 characters"):
        read_csv(path, "table")
    path.write_text(",".join(f"c{i}" for i in range(300)) + "\n")
    with pytest.raises(SpecError, match="300 cells, more than 256"):
        read_csv(path, "table")
    path.write_text("a,a\n1,2\n")
    with pytest.raises(SpecError, match="column 'a' appears twice"):
        read_csv(path, "table")


@pytest.mark.parametrize("text, needle", [("a: &x [1]\nb: *x\n", "anchors and aliases"),
                                          ("tp: " + "[" * DEEP + "]" * DEEP + "\n", "nested deeper than"),
                                          ("tp: " + "9" * DIGITS + "\n", "5,000 digits"),
                                          ("- 1\n", "no mapping of layout fields")])
def test_a_layout_read_back_from_the_registry_is_bounded(tmp_path, monkeypatch, text, needle):
    """`export name@production` reads layout.yaml from an MLflow store (another's to write) through the bounded
    reader: before, yaml.safe_load (aliases, RecursionError, CPython's digit-limit ValueError)."""
    from orchestrator.outputs import registry

    (tmp_path / "layout.yaml").write_text(text)
    monkeypatch.setattr(registry, "download", lambda ref, dst=None: tmp_path)
    with pytest.raises(SpecError, match=needle) as caught:
        registry.load_layout("m@production")
    assert "models:/m@production" in str(caught.value) and len(str(caught.value)) < 300
