"""The sweep spec: defaults, overrides, and one-line errors naming the field for bad input."""

from pathlib import Path

import pytest

from search_spaces.errors import SpecError

from orchestrator.commands.cli import main
from orchestrator.spec.schema import load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BAD_SPECS = [
    ({"bogus": 1}, "bogus"),
    ({"budget": {"n_trails": 3}}, "n_trails"),
    ({"budget": {"n_trials": 0}}, "budget.n_trials"),
    ({"budget": {"max_concurrent": -1}}, "max_concurrent"),
    ({"backend": "magic"}, "backend"),
    ({"seq_len": 0}, "seq_len"),
    ({"nodes": 0}, "nodes"),
    ({"gpus_per_node": "eight"}, "gpus_per_node"),
    ({"name": "a; rm -rf /"}, "name"),
    ({"model": "tiny-moe; ls"}, "model"),
    ({"fixed": {"tp": 0}}, "tp"),
    ({"fixed": {"tq": 2}}, "tq"),
    ({"fixed": {"precision": "fp7"}}, "precision"),
    ({"free": ["tp", "zz"]}, "zz"),
    ({"objectives": ["loss"]}, "objectives"),
    ({"steps": 2, "warmup": 2}, "warmup"),
    ({"backend": "replay"}, "replay_table"),
    ({"launcher": "mpirun"}, "launcher"),
    ({"model_overrides": {"num_layers": 0}}, "num_layers"),
    ({"name": "x", "study_name": "y"}, "study_name"),
]


@pytest.mark.parametrize("data,needle", BAD_SPECS)
def test_bad_spec_is_one_line_naming_the_field(data, needle):
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_defaults_and_overrides():
    spec = parse_spec({"study_name": "s1", "budget": {"n_trials": 5}},
                      {"n_trials": 3, "max_concurrent": 2, "backend": "analytic", "storage": None})
    assert spec.name == "s1" and spec.budget.n_trials == 3 and spec.budget.max_concurrent == 2
    assert spec.backend == "analytic" and spec.storage == "journal:///optuna.journal"
    assert spec.tracking_uri == "sqlite:///mlflow.db"
    assert parse_spec({}, {"study_name": "other"}).name == "other"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path):
    spec = load_spec(path)
    assert spec.num_gpus >= 1


def test_examples_exist():
    names = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert {"quickstart.yaml", "deepseek-v3-128k-h100x1024.yaml", "qwen3-235b-128k-gb200x128.yaml"} <= names


@pytest.mark.parametrize("argv,needle", [
    (["sweep", "does-not-exist.yaml"], "does not exist"),
    (["sweep", "{bad}", "--n-trials", "0"], "n_trials"),
    (["sweep", "{bad}", "--backend", "nope"], "backend"),
    (["status", "--storage", "sqlite:///nowhere/optuna.db"], "does not exist"),
])
def test_cli_bad_input_exit_2(argv, needle, tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("model: tiny-moe\n")
    argv = [str(spec) if a == "{bad}" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


def test_bad_yaml_and_non_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(SpecError, match="YAML"):
        load_spec(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(bad)


# ---- hostile spec files and values (issue 15) ----------------------------------------------------------
STRICT_BAD_SPECS = [
    ({"nodes": True}, "nodes"),
    ({"seq_len": "4096"}, "seq_len"),
    ({"gbs": 16.0}, "gbs"),
    ({"steps": True, "warmup": 0}, "steps"),
    ({"warmup": 1.0}, "warmup"),
    ({"gpus_per_node": 8.0}, "gpus_per_node"),
    ({"budget": {"max_concurrent": True}}, "budget.max_concurrent"),
    ({"budget": {"max_proposals_per_trial": "3"}}, "budget.max_proposals_per_trial"),
    ({"budget": {"wall_time_s": float("inf")}}, "budget.wall_time_s"),
    ({"budget": {"wall_time_s": float("nan")}}, "budget.wall_time_s"),
    ({"trial_timeout_s": float("inf")}, "trial_timeout_s"),
    ({"trial_timeout_s": "900"}, "trial_timeout_s"),
    ({"seed": -1}, "seed"),
    ({"seed": 2 ** 32}, "seed"),
    ({"seed": 2 ** 70}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"model_overrides": {"hidden_size": True}}, "model_overrides.hidden_size"),
]


@pytest.mark.parametrize("data,needle", STRICT_BAD_SPECS, ids=[repr(d) for d, _ in STRICT_BAD_SPECS])
def test_spec_numbers_are_strict_and_finite(data, needle):
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_seed_range_edges_and_float_fields_still_take_ints():
    assert parse_spec({"seed": 0}).seed == 0 and parse_spec({"seed": 2 ** 32 - 1}).seed == 2 ** 32 - 1
    spec = parse_spec({"trial_timeout_s": 60, "budget": {"wall_time_s": 3600}})
    assert spec.trial_timeout_s == 60.0 and spec.budget.wall_time_s == 3600.0


# 369 bytes (the report had 657): nine levels of nine aliases each, 9**9 strings once expanded
ALIAS_BOMB = "\n".join(
    ['name: bomb', 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [{','.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    + ["fixed: {tp: *i}"]) + "\n"


def test_yaml_alias_bomb_is_refused_quickly_and_small(tmp_path):
    """Run in a child with 1 GiB of address space and a deadline: before the fix this blew up."""
    import subprocess
    import sys

    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "from orchestrator.spec.schema import load_spec\n"
            "from search_spaces.errors import SpecError\n"
            "try:\n    load_spec(sys.argv[1])\nexcept SpecError as exc:\n    print(exc)\n    sys.exit(2)\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                              cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired:
        pytest.fail("the alias bomb hangs the spec loader")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "alias" in proc.stdout or "anchor" in proc.stdout, proc.stdout


@pytest.mark.parametrize("text,needle", [
    ("seed: 1\nseed: 2\n", "'seed'"),
    ("budget:\n  n_trials: 2\n  n_trials: 3\n", "'n_trials'"),
    ("fixed: {tp: 1, tp: 2}\n", "'tp'"),
    ("free: [tp]\nbudget: {n_trials: 2}\nfree: [cp]\n", "'free'"),
])
def test_duplicate_yaml_keys_are_refused_at_any_depth(tmp_path, text, needle):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="duplicate") as info:
        load_spec(path)
    assert needle in str(info.value) and "line" in str(info.value) and "\n" not in str(info.value)


def test_spec_files_that_are_not_text_or_not_files(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: café\n".encode("latin-1"))
    with pytest.raises(SpecError, match="UTF-8"):
        load_spec(bad)
    with pytest.raises(SpecError, match="directory"):
        load_spec(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 200_000)
    with pytest.raises(SpecError, match="MiB"):
        load_spec(big)
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"name: a\x00b\n")
    with pytest.raises(SpecError):
        load_spec(nul)


# ---- issue 20 defect 3: YAML 1.2 numerals -----------------------------------------------------------------
def _load_text(tmp_path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_spec(path)


def test_readme_cost_line_with_yaml12_numerals_is_accepted(tmp_path):
    # the README's own line: YAML 1.1 read 1.0e12 as the string '1.0e12' and the spec refused it
    spec = _load_text(tmp_path, "cost: {usd_per_gpu_hour: 2.5, train_tokens: 1.0e12}\n")
    assert spec.cost.train_tokens == 1e12 and spec.cost.usd_per_gpu_hour == 2.5
    spec = _load_text(tmp_path, "cost: {usd_per_gpu_hour: 25e-1, train_tokens: 1e12}\ntrial_timeout_s: 9E+2\n")
    assert (spec.cost.usd_per_gpu_hour, spec.cost.train_tokens, spec.trial_timeout_s) == (2.5, 1e12, 900.0)


@pytest.mark.parametrize("text,needle", [
    ("cost: {train_tokens: '1.0e12'}\n", "cost.train_tokens"),  # quoted: a string, not a number
    ("cost: {train_tokens: 1.0e12.5}\n", "cost.train_tokens"),
    ("cost: {train_tokens: -1e12}\n", "cost.train_tokens"),
    ("cost: {train_tokens: 1e999}\n", "cost.train_tokens"),  # inf
    ("trial_timeout_s: .inf\n", "trial_timeout_s"),
    ("nodes: 1e3\n", "nodes"),  # a float where an integer is wanted, like nodes: 1.7
    ("nodes: 1.7\n", "nodes"),
    ("nodes: true\n", "nodes"),
    ("seed: 1e3\n", "seed"),
])
def test_yaml12_numerals_keep_the_spec_strict(tmp_path, text, needle):
    with pytest.raises(SpecError) as info:
        _load_text(tmp_path, text)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_yaml12_numerals_do_not_change_pyyaml_for_others():
    import yaml

    assert yaml.safe_load("x: 1e12") == {"x": "1e12"}  # only the spec loader reads YAML 1.2 numbers


# ---- issue 21 class 1: names -------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["name", "study_name", "experiment"])
@pytest.mark.parametrize("value", ["abc\n", "a\nb", "a/b", "..", "-x", "x" * 101, "a@b", "a b", "caf\u00e9",
                                   "a\x00b", "a\u2028b", "models:/x@production", ""])
def test_every_spec_name_passes_the_one_name_rule(field, value):
    with pytest.raises(SpecError) as info:
        parse_spec({field: value})
    message = str(info.value)
    assert "\n" not in message and "\r" not in message and "\u2028" not in message and len(message) < 400


def test_plain_names_are_accepted_and_the_cli_override_is_checked(tmp_path):
    assert parse_spec({"name": "a.b_c-9", "experiment": "E" * 100}).experiment == "E" * 100
    with pytest.raises(SpecError, match="name"):
        parse_spec({"name": "ok"}, {"study_name": "bad\nname"})


# ---- issue 21 class 2: sizes are refused by range ----------------------------------------------------------
@pytest.mark.parametrize("data,needle", [
    ({"nodes": 2 ** 40}, "nodes"),
    ({"gpus_per_node": 2 ** 11}, "gpus_per_node"),
    ({"nodes": 2 ** 18, "gpus_per_node": 8}, "nodes x gpus_per_node"),
    ({"seq_len": 2 ** 25}, "seq_len"),
    ({"seq_len": [1024, 2 ** 40]}, "seq_len"),
    ({"gbs": 2 ** 70}, "gbs"),
    ({"trial_gpus": 2 ** 21}, "trial_gpus"),
    ({"fixed": {"cp": 2 ** 40}}, "cp"),
    ({"fixed": {"gbs": 2 ** 30}}, "gbs"),
    ({"model_overrides": {"num_layers": 10 ** 6}}, "num_layers"),
    ({"model_overrides": {"hidden_size": 2 ** 40}}, "hidden_size"),
])
def test_sizes_beyond_any_cluster_are_refused(data, needle):
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert needle in str(info.value) and "\n" not in str(info.value) and len(str(info.value)) < 300


def test_size_range_edges_are_accepted():
    from search_spaces.inputs import MAX_GBS, MAX_GPUS_PER_NODE, MAX_SEQ_LEN

    spec = parse_spec({"nodes": 1024, "gpus_per_node": MAX_GPUS_PER_NODE, "seq_len": MAX_SEQ_LEN, "gbs": MAX_GBS})
    assert spec.num_gpus == 2 ** 20


def test_routing_is_searched_only_when_the_spec_frees_it():
    """Token dropping changes what is trained: a default `free` holds routing at dropless; naming it searches
    capacity:1.0 beside dropless (a search parameter of its own); forced balance only ever comes from `fixed`."""
    from orchestrator.search.prior import Prior
    from orchestrator.search.space import SweepSpace

    base = {"model": "tiny-moe", "gpu": "cpu", "gpus_per_node": 4, "backend": "analytic"}
    held = Prior(parse_spec(base))
    assert "routing" not in held.spec.free and held.dimensions["routing"] == ["dropless"]
    assert SweepSpace.from_prior(held).choices["routing"] == ("dropless",)
    freed = Prior(parse_spec({**base, "free": ["ep", "routing"]}))
    assert freed.dimensions["routing"] == ["dropless", "capacity:1.0"]
    assert {lay.routing for lay in freed.candidates} == {"dropless", "capacity:1.0"}
    assert SweepSpace.from_prior(freed).choices["routing"] == ("capacity:1.0", "dropless")
    forced = Prior(parse_spec({**base, "fixed": {"routing": "forced_balance"}}))
    assert {lay.routing for lay in forced.candidates} == {"forced_balance"}
