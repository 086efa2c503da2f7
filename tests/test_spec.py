"""The sweep spec: defaults, overrides, and one-line errors naming the field for bad input."""

from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.spec import load_spec, parse_spec
from search_spaces.errors import SpecError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

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
    assert spec.backend == "analytic" and spec.storage == "sqlite:///optuna.db"
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
