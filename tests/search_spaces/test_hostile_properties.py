"""Hostile input by class (issue 21), proved over generated inputs with Hypothesis (fixed seed, fast lane).

Properties, for every generated input: the CLI exits 0, or exits 2 with exactly one `error:` line; no traceback;
on exit 2 nothing under the test's folder is created or changed (SQLite files compared by content, through
their WAL); and the work done is bounded by a count that does not grow with the numbers given (every `range()`
the enumerating modules build is counted, and a run past the bound is stopped where it happens).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search_spaces import proxy
from search_spaces.catalog import models
from search_spaces.cost import pipeline
from search_spaces.errors import SpecError
from search_spaces.inputs import MAX_GBS, MAX_GPUS, MAX_SEQ_LEN, check_name
from search_spaces.layouts import heuristics, rules, space
from search_spaces.layouts.layout import DIMENSIONS

from orchestrator.commands.cli import main
from tests.sweep_helpers import spec_data

ROOT = Path(__file__).resolve().parents[2]
STUDY = "kept-hostile-7f3e"  # a name no strategy below produces by chance
# max_examples comes from the Hypothesis profile (tests/conftest.py: 300 in the full suite, fewer in --fast)
PROPERTY = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))

# ---- running the CLI in-process --------------------------------------------------------------------------


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def assert_answered(code: int, out: str, err: str, allowed: tuple[int, ...] = (0, 2)) -> None:
    assert "Traceback" not in out + err, err[-2000:]
    assert code in allowed, f"exit {code}: {err[-2000:]}"
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), f"not one error line: {err[-2000:]!r}"


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root by content; an SQLite database by its logical dump (what a reader sees)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name.endswith(("-wal", "-shm", "-journal")):
            continue
        data = path.read_bytes()
        # a store by its dump; a drawn config.json may begin with SQLite's header too, and is compared as bytes
        if path.suffix == ".db" and data.startswith(b"SQLite format 3\x00"):
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                data = "\n".join(conn.iterdump()).encode()
            finally:
                conn.close()
        found[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return found


# ---- counting work ----------------------------------------------------------------------------------------
class WorkExceeded(AssertionError):
    """More loop steps than the bound: raised where the loop is built, so a runaway loop fails at once."""


COUNTED_MODULES = (space, heuristics, rules, proxy, pipeline, models)


@contextlib.contextmanager
def counted_work(limit: int):
    """Count the steps of every range() the enumerating modules build; fail past `limit`."""
    steps = [0]

    def counting_range(*args):
        r = builtins.range(*args)
        steps[0] += len(r)
        if steps[0] > limit:
            raise WorkExceeded(f"more than {limit:,} loop steps (range{args})")
        return r

    with pytest.MonkeyPatch.context() as mp:
        for module in COUNTED_MODULES:
            mp.setattr(module, "range", counting_range, raising=False)
        yield steps


# ---- the world: a storage with a finished study and a real MLflow store -------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    spec = spec_data(root, STUDY, gpu="h100", gpus_per_node=8, seq_len=1024, gbs=16, fixed={},
                     budget={"n_trials": 2}, seed=1)
    (root / "base.yaml").write_text(yaml.safe_dump(spec))
    code, _, err = run(["sweep", str(root / "base.yaml"), "--quiet"])
    assert code == 0, err
    return {"root": root, "spec": spec, "storage": spec["storage"], "tracking": spec["tracking_uri"]}


# ---- class 1: names -------------------------------------------------------------------------------------------
HOSTILE_NAMES = ["abc\n", "a\nb", "a\rb", "a/b", "../x", "..", ".", "-x", "--help", "x" * 101, "a@b", "a b",
                 "caf\u00e9", "a\x00b", "a\x1b[31mb", "a\u2028b", "models:/x@production", "", "$(id)", "a;b",
                 "a'b", 'a"b', "a\\b", "\t", "x" * 100]
NAMES = st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(max_size=130),
                  st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True))


def _name_commands(w, name: str) -> dict[str, list[str]]:
    s, t, root = w["storage"], w["tracking"], w["root"]
    return {  # `--` before a positional name: `-x` or `--help` is then a name, as a user could pass it
        "status": ["status", "--storage", s, "--", name],
        "check": ["check", "--storage", s, "--", name],
        "export": ["export", "--storage", s, "--", name],
        "report": ["report", "--storage", s, "--no-mlflow", "--out", str(root / "report-out"), "--", name],
        "promote": ["promote", "--storage", s, "--tracking-uri", t, "--", name],
        "rollback": ["promote", "--rollback", "--name", name, "--tracking-uri", t],
        "ui": ["ui", "--tracking-uri", t, "--", name],
        "calibrate --study": ["calibrate", "--study", name, "--storage", s, "--out", str(root / "cal.json")],
        "calibrate --experiment": ["calibrate", "--experiment", name, "--tracking-uri", t,
                                   "--out", str(root / "cal.json")],
        "slurm render --study-name": ["slurm", "render", str(root / "base.yaml"), "--study-name", name],
    }


def _plain(name: str) -> bool:
    try:
        check_name(name, "name")
    except SpecError:
        return False
    return True


@PROPERTY
@given(name=NAMES, command=st.sampled_from(sorted(_name_commands({"storage": "", "tracking": "", "root": Path()},
                                                                  "x"))))
def test_every_name_entry_point_answers_or_refuses_with_one_line(world, name, command):
    argv = _name_commands(world, name)[command]
    before = snapshot(world["root"])
    code, out, err = run(argv)
    assert_answered(code, out, err)
    if code == 2:
        assert snapshot(world["root"]) == before, f"{command} {name!r} changed the folder"
    if not _plain(name):
        assert code == 2, f"{command} accepted the name {name!r}"
    if code == 0 and command.startswith("slurm"):  # the name is the job's name: one header line, as given
        assert f"#SBATCH --job-name={name}\n" in out


@PROPERTY
@given(name=NAMES, field=st.sampled_from(["name", "study_name", "experiment"]))
def test_every_spec_name_obeys_the_one_rule(world, name, field):
    path = world["root"] / "names" / "spec.yaml"
    path.parent.mkdir(exist_ok=True)
    data = {k: v for k, v in world["spec"].items() if k != "name"} | {field: name}
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    code, out, err = run(["slurm", "render", str(path)])
    assert_answered(code, out, err)
    assert (code == 0) == _plain(name), (name, err)


# ---- spec YAML: every field, wrong types, huge/negative/unicode values, duplicate keys, aliases ----------------
HUGE = st.one_of(st.integers(min_value=-2 ** 200, max_value=2 ** 200), st.sampled_from(
    [0, -1, 2 ** 20, 2 ** 20 + 1, 2 ** 24, 2 ** 24 + 1, 2 ** 31, 2 ** 63, 2 ** 64, 10 ** 300]))
ANY_VALUE = st.one_of(HUGE, st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                      st.text(max_size=40), st.lists(st.integers(-5, 2 ** 30), max_size=4),
                      st.dictionaries(st.text(max_size=8), st.integers(), max_size=3))
SPEC_FIELDS = ["name", "model", "seq_len", "gpu", "nodes", "gpus_per_node", "gbs", "free", "fixed", "budget",
               "objectives", "steps", "warmup", "trial_timeout_s", "backend", "tracking_uri", "experiment", "storage",
               "model_overrides", "seed", "search", "ray_address", "workdir", "trainer_module", "launcher",
               "replay_table", "fidelity", "trial_gpus", "cost", "track_rejected", "calibration", "study_name",
               "bogus_field"]
NESTED = {"budget": ["n_trials", "wall_time_s", "max_concurrent", "max_proposals_per_trial"],
          "cost": ["usd_per_gpu_hour", "train_tokens"], "model_overrides": ["num_layers", "hidden_size"],
          "fixed": ["tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs", "precision", "recompute", "hierarchical_cp"]}


@st.composite
def spec_texts(draw) -> str:
    data = {k: v for k, v in {"name": "hostile-spec", "model": "tiny-moe", "gpu": "h100", "seq_len": 1024,
                              "backend": "analytic", "tracking_uri": "none"}.items()}
    for field in draw(st.lists(st.sampled_from(SPEC_FIELDS), min_size=1, max_size=4, unique=True)):
        if field in NESTED and draw(st.booleans()):
            data[field] = {draw(st.sampled_from(NESTED[field])): draw(ANY_VALUE)}
        else:
            data[field] = draw(ANY_VALUE)
    text = yaml.safe_dump(data, allow_unicode=True)
    edit = draw(st.sampled_from(["none", "duplicate", "alias", "numeral", "raw"]))
    if edit == "duplicate":
        text += f"{draw(st.sampled_from(SPEC_FIELDS))}: 1\n"
    elif edit == "alias":
        text = "x: &a [1, 2]\n" + text + "steps: *a\n"
    elif edit == "numeral":
        text += f"{draw(st.sampled_from(['nodes', 'seq_len', 'gbs', 'seed', 'trial_timeout_s']))}: " \
                f"{draw(st.sampled_from(['1e3', '1.0e12', '-1e3', '1e999', '0x10', '0o7', '.5', '1_000', '1:20']))}\n"
    elif edit == "raw":
        text = draw(st.text(max_size=200))
    return text


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder of its own, the working directory while a command runs: whatever a command leaves shows here."""
    return tmp_path_factory.mktemp("scratch")


@contextlib.contextmanager
def inside(folder: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        yield


@PROPERTY
@given(text=spec_texts())
def test_any_spec_file_answers_or_is_refused_with_one_line(scratch, text):
    path = scratch / "spec.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    before = snapshot(scratch)
    with inside(scratch):
        code, out, err = run(["slurm", "render", str(path)])
    assert_answered(code, out, err)
    assert snapshot(scratch) == before  # render writes nothing, whatever it answers


# ---- config.json files -------------------------------------------------------------------------------------
TINY = json.loads((ROOT / "search_spaces" / "catalog" / "hf_configs" / "tiny-moe.json").read_text())
CONFIG_FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size",
                 "num_key_value_heads", "n_routed_experts", "num_experts", "moe_intermediate_size",
                 "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace", "num_nextn_predict_layers",
                 "head_dim", "kv_lora_rank", "sliding_window", "full_attention_interval", "layer_types",
                 "max_position_embeddings", "linear_num_key_heads"]


@st.composite
def config_files(draw) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    cfg = dict(TINY)
    for field in draw(st.lists(st.sampled_from(CONFIG_FIELDS), min_size=1, max_size=3, unique=True)):
        cfg[field] = draw(st.one_of(HUGE, st.integers(1, 4096), ANY_VALUE))
    return json.dumps(cfg, ensure_ascii=False).encode("utf-8", "surrogatepass")


@PROPERTY
@given(content=config_files())
def test_any_config_json_answers_or_is_refused_within_bounded_work(scratch, content):
    folder = scratch / "configs" / hashlib.sha256(content).hexdigest()[:16]  # models are cached by path
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_bytes(content)
    before = snapshot(scratch)
    with counted_work(ESTIMATE_WORK), inside(scratch):
        code, out, err = run(["estimate", "--model", str(folder / "config.json"), "--gpu", "h100", "--num-gpus",
                              "8", "--seq-len", "1024", "--pp", "2", "--vpp", "2"])
    assert_answered(code, out, err)
    assert snapshot(scratch) == before


# ---- class 2: sizes ---------------------------------------------------------------------------------------
SIZES = st.one_of(st.integers(min_value=-3, max_value=2 ** 70), st.integers(1, 4096),
                  st.sampled_from([2 ** 20, 2 ** 20 - 1, 2 ** 20 + 1, 2 ** 24, 2 ** 24 + 1, 3 * 2 ** 18, 2 ** 40,
                                   10 ** 30, 997 * 1009]))
# the most loop steps one command may take, whatever the sizes. Measured at the range limits: `space` takes
# 0.5M steps for deepseek-v3 on 2**20 GPUs at 2**24 tokens and 13.6M for llama3.1-405b (126 layers) on 720,720
# GPUs (a highly composite count: ~40 PP sizes, each a pipeline placement); `estimate` under 100. Before sizes had
# ranges, one divisor loop over --num-gpus 2**40 took 2**40 steps.
ESTIMATE_WORK = 2_000_000
SPACE_WORK = 20_000_000


@PROPERTY
@given(num_gpus=SIZES, seq_len=SIZES, gbs=SIZES, layout=st.dictionaries(
    st.sampled_from(["--tp", "--cp", "--ep", "--pp", "--vpp", "--mbs"]), st.one_of(SIZES, st.integers(1, 16)),
    max_size=3))
def test_estimate_at_any_size_answers_or_refuses_within_bounded_work(num_gpus, seq_len, gbs, layout):
    argv = ["estimate", "--model", "deepseek-v3", "--gpu", "h100", "--num-gpus", str(num_gpus), "--seq-len",
            str(seq_len), "--gbs", str(gbs), "--json"]
    for flag, value in layout.items():
        argv += [flag, str(value)]
    with counted_work(ESTIMATE_WORK):
        code, out, err = run(argv)
    assert_answered(code, out, err)
    if not (1 <= num_gpus <= MAX_GPUS and 1 <= seq_len <= MAX_SEQ_LEN):
        assert code == 2


# what an empty answer of `space` starts with: the rule, memory, or the limit that emptied it
EMPTY_SPACE_LINES = ("error: no legal layout of ", "error: nothing fits in memory", "error: no layout of ")


# `space` enumerates the whole space (up to ~10**5 grid probes at the range limits): fewer examples
@settings(PROPERTY, max_examples=max(1, settings.default.max_examples // 2))
@given(model=st.sampled_from(["tiny-moe", "deepseek-v3", "qwen3-next-80b-a3b", "llama3-8b"]), num_gpus=SIZES,
       seq_len=SIZES, gbs=st.one_of(st.none(), SIZES))
def test_space_at_any_size_answers_or_refuses_within_bounded_work(model, num_gpus, seq_len, gbs):
    argv = ["space", "--model", model, "--gpu", "h100", "--num-gpus", str(num_gpus), "--seq-len", str(seq_len),
            "--max-grids", "2", "--top", "1", "--json"] + (["--gbs", str(gbs)] if gbs is not None else [])
    with counted_work(SPACE_WORK) as steps:
        code, out, err = run(argv)
    assert_answered(code, out, err)
    in_range = 1 <= num_gpus <= MAX_GPUS and 1 <= seq_len <= MAX_SEQ_LEN and (gbs is None or 1 <= gbs <= MAX_GBS)
    if not in_range:
        assert code == 2, err
    elif code != 0:  # an empty answer says which rule (or memory, or a limit) emptied it (issue 56)
        assert code == 2 and err.startswith(EMPTY_SPACE_LINES), err
    assert steps[0] <= SPACE_WORK


@PROPERTY
@given(n=st.integers(1, MAX_GPUS), upto=st.one_of(st.none(), st.integers(1, MAX_GPUS)))
def test_divisors_are_exact_and_take_at_most_sqrt_of_the_range_steps(n, upto):
    with counted_work(1024 + 1) as steps:  # isqrt(MAX_GPUS) trial divisions at most
        found = space.divisors(n, upto)
    limit = n if upto is None else min(n, upto)
    assert found == sorted(found) and all(n % d == 0 and d <= limit for d in found)
    assert set(found) == {d for d in (*found, *(n // d for d in found)) if d <= limit}  # closed under pairing
    assert steps[0] <= 1024
    if n <= 5000:
        assert found == [d for d in builtins.range(1, limit + 1) if n % d == 0]


# every layout dimension's flag (`--ep-overlap` and `--routing` as much as `--tp`), whatever text follows it
@PROPERTY
@given(flag=st.sampled_from(sorted({d.flag for d in DIMENSIONS})),
       value=st.one_of(st.text(max_size=40), st.sampled_from(["true", "False", "yes", "2", "-1", "1e999", "nan",
                                                               "none", "auto", "capacity:1e9", "a2a+p2p", "8,4"])))
def test_any_layout_flag_value_answers_or_is_refused_with_one_line(flag, value):
    argv = ["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "4", "--seq-len", "512", "--gbs", "8",
            "--json", flag, value]
    code, out, err = run(argv)
    assert_answered(code, out, err)
