"""Bad input to the CLI and the sweep spec: one line on stderr naming the problem, exit code 2, nothing damaged.

Every case runs against an Optuna storage that already holds a finished study; after each bad command that
study must still have exactly the same trials.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from orchestrator.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXISTING = "kept-study"


def _base_spec(workdir: Path, storage: str) -> dict:
    # analytic backend, no MLflow: a valid spec runs in seconds
    return {"name": "bad-input-probe", "model": "tiny-moe", "gpu": "h100", "nodes": 1, "gpus_per_node": 8,
            "seq_len": 1024, "gbs": 16, "backend": "analytic", "budget": {"n_trials": 2}, "seed": 1,
            "tracking_uri": "none", "storage": storage, "workdir": str(workdir / "runs")}


def _fingerprint(storage: str) -> dict:
    """The stored trials of the existing study, and which studies exist (a bad command creates none)."""
    study = optuna.load_study(study_name=EXISTING, storage=storage)
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False))
    return {"studies": names,
            "trials": [(t.number, t.state.name, t.values, json.dumps(t.user_attrs, sort_keys=True, default=str))
                       for t in study.trials]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A storage with a finished analytic study, plus files the cases point at."""
    root = tmp_path_factory.mktemp("bad-input")
    storage = f"sqlite:///{root / 'optuna.db'}"
    good = _base_spec(root, storage) | {"name": EXISTING, "budget": {"n_trials": 3}}
    (root / "good.yaml").write_text(yaml.safe_dump(good))
    assert main(["sweep", str(root / "good.yaml"), "--quiet"]) == 0
    before = _fingerprint(storage)
    assert len(before["trials"]) >= 3 and before["studies"] == [EXISTING]
    # a Hugging Face config.json that lacks hidden_size (and more)
    (root / "broken-model").mkdir()
    (root / "broken-model" / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "vocab_size": 256}))
    return {"root": root, "storage": storage, "before": before}


def _spec_file(world, **changes) -> str:
    """Write the base spec with `changes` applied (a key set to ... is removed) and return its path."""
    tag = abs(hash(json.dumps(changes, sort_keys=True, default=str)))
    data = _base_spec(world["root"], world["storage"]) | {"name": f"probe-{tag}"}  # cases never share a study
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    path = world["root"] / f"spec-{tag}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _raw_file(world, name: str, text: str) -> str:
    path = world["root"] / name
    path.write_text(text)
    return str(path)


# id -> (argv builder, words the one stderr line must contain, case-insensitively)
CASES = {
    # ---- the spec file ---------------------------------------------------------------------------
    "spec path does not exist": (lambda w: ["sweep", str(w["root"] / "nope" / "spec.yaml")], ["does not exist"]),
    "unknown model": (lambda w: ["sweep", _spec_file(w, model="gpt-17-moe")], ["gpt-17-moe"]),
    "typo'd spec field": (lambda w: ["sweep", _spec_file(w, seq_length=4096)], ["seq_length"]),
    "typo'd nested field": (lambda w: ["sweep", _spec_file(w, budget={"n_trial": 3})], ["n_trial"]),
    "negative seq_len": (lambda w: ["sweep", _spec_file(w, seq_len=-4096)], ["seq_len"]),
    "zero gpus_per_node": (lambda w: ["sweep", _spec_file(w, gpus_per_node=0)], ["gpus_per_node"]),
    "negative nodes": (lambda w: ["sweep", _spec_file(w, nodes=-1)], ["nodes"]),
    "zero n_trials": (lambda w: ["sweep", _spec_file(w, budget={"n_trials": 0})], ["n_trials"]),
    "zero gbs": (lambda w: ["sweep", _spec_file(w, gbs=0)], ["gbs"]),
    "unknown GPU": (lambda w: ["sweep", _spec_file(w, gpu="h1000")], ["h1000"]),
    "unknown free dimension": (lambda w: ["sweep", _spec_file(w, free=["tp", "cpp"])], ["cpp"]),
    "zero fixed tp": (lambda w: ["sweep", _spec_file(w, fixed={"tp": 0})], ["tp"]),
    "unknown precision": (lambda w: ["sweep", _spec_file(w, fixed={"precision": "fp7"})], ["fp7"]),
    "warmup not below steps": (lambda w: ["sweep", _spec_file(w, steps=3, warmup=3)], ["warmup"]),
    "shell characters in name": (lambda w: ["sweep", _spec_file(w, name="x; rm -rf ~")], ["name"]),
    "shell characters in model": (lambda w: ["sweep", _spec_file(w, model="$(reboot)")], ["model"]),
    "not YAML": (lambda w: ["sweep", _raw_file(w, "broken.yaml", "name: [unclosed\n  model: : :\n")], ["yaml"]),
    "YAML list at top level": (lambda w: ["sweep", _raw_file(w, "list.yaml", "- tp\n- cp\n")], ["mapping"]),
    "config.json missing fields": (lambda w: ["sweep", _spec_file(w, model=str(w["root"] / "broken-model" / "config.json"))],
                                   ["config"]),
    "config.json path does not exist": (lambda w: ["sweep", _spec_file(w, model=str(w["root"] / "absent" / "config.json"))],
                                        ["absent"]),
    # ---- nothing can fit: say which constraint binds ----------------------------------------------
    "nothing fits in memory": (lambda w: ["sweep", _spec_file(w, model="deepseek-v3", gpus_per_node=1, seq_len=131072,
                                                              gbs=1)], ["memory"]),
    "no legal layout with the fixed fields": (lambda w: ["sweep", _spec_file(w, fixed={"tp": 3})], ["tp"]),
    # ---- command-line overrides and storage -------------------------------------------------------
    "storage directory does not exist": (lambda w: ["sweep", _spec_file(w), "--storage",
                                                    f"sqlite:///{w['root'] / 'no' / 'such' / 'dir' / 'x.db'}"],
                                         ["storage"]),
    "storage URL scheme unknown": (lambda w: ["sweep", _spec_file(w), "--storage", "nosuchdb://host/db"], ["storage"]),
    "existing study without --resume": (lambda w: ["sweep", _spec_file(w), "--study-name", EXISTING],
                                        ["already exists"]),
    "resume a study that is not there": (lambda w: ["sweep", _spec_file(w), "--study-name", "never-ran", "--resume"],
                                         ["never-ran"]),
    "zero --n-trials": (lambda w: ["sweep", _spec_file(w), "--n-trials", "0"], ["n_trials"]),
    "unknown --backend": (lambda w: ["sweep", _spec_file(w), "--backend", "quantum"], ["backend"]),
    "shell characters in --study-name": (lambda w: ["sweep", _spec_file(w), "--study-name", "a|b`id`"], ["name"]),
    "typo'd option": (lambda w: ["sweep", _spec_file(w), "--n-trial", "3"], ["--n-trial"]),
    # ---- other commands ----------------------------------------------------------------------------
    "estimate: zero GPUs": (lambda w: ["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "0",
                                       "--seq-len", "1024"], ["num-gpus"]),
    "estimate: unknown model": (lambda w: ["estimate", "--model", "nope-moe", "--gpu", "h100", "--num-gpus", "8",
                                           "--seq-len", "1024"], ["nope-moe"]),
    "estimate: negative tp": (lambda w: ["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8",
                                         "--seq-len", "1024", "--tp", "-2"], ["tp"]),
    "estimate: config.json missing fields": (lambda w: ["estimate", "--model", str(w["root"] / "broken-model" / "config.json"),
                                                        "--gpu", "h100", "--num-gpus", "8", "--seq-len", "1024"],
                                             ["config"]),
    "space: --fix without a value": (lambda w: ["space", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8",
                                                "--seq-len", "1024", "--fix", "tp"], ["field=value"]),
    "status: storage file does not exist": (lambda w: ["status", "--storage", f"sqlite:///{w['root'] / 'absent.db'}"],
                                            ["does not exist"]),
    "status: unknown study": (lambda w: ["status", "no-such-study", "--storage", w["storage"]], ["no-such-study"]),
    "export: GPUs not divisible by nodes": (lambda w: ["export", EXISTING, "--format", "sbatch", "--allow-estimated",
                                                       "--storage", w["storage"], "--gpus-per-node", "3"],
                                            ["3"]),
}


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected exactly one line on stderr, got {len(lines)}:\n{stderr[-3000:]}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in stderr
    return lines[0]


def test_there_are_at_least_twenty_cases():
    assert len(CASES) >= 20


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_gives_one_line_and_exit_2(case, world, capsys):
    build, words = CASES[case]
    argv = build(world)
    before = _fingerprint(world["storage"])  # per case, so one failure does not cascade into the others
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert code == 2, f"exit code {code}; stderr: {captured.err}"
    for word in words:
        assert word.lower() in line.lower(), f"{word!r} not named in: {line}"
    after = _fingerprint(world["storage"])
    assert after["trials"] == world["before"]["trials"], "a bad command changed the stored trials"
    assert after["studies"] == before["studies"], f"a bad command left a study behind: {after['studies']}"


# A few through the real console script: what a user's shell sees (no rich box, no traceback).
SUBPROCESS_CASES = ["unknown model", "typo'd spec field", "spec path does not exist", "shell characters in name",
                    "storage URL scheme unknown", "typo'd option"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", SUBPROCESS_CASES, ids=SUBPROCESS_CASES)
def test_console_script_prints_one_line_and_exits_2(case, world):
    exe = Path(sys.executable).with_name("moe-autotune")
    assert exe.is_file(), "the console script is not installed (pip install -e .)"
    build, words = CASES[case]
    before = _fingerprint(world["storage"])
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm-256color"}  # rich/typer boxes would show up here
    proc = subprocess.run([str(exe), *build(world)], capture_output=True, text=True, timeout=240, env=env,
                          cwd=world["root"])
    line = _one_error_line(proc.stderr)
    assert proc.returncode == 2, proc.stderr
    for word in words:
        assert word.lower() in line.lower()
    assert _fingerprint(world["storage"]) == {**before, "trials": world["before"]["trials"]}


def test_shell_metacharacters_never_reach_a_shell(world, tmp_path):
    # a name that would create a file if any shell ever saw it
    marker = tmp_path / "pwned"
    for name in (f"x;touch {marker}", f"$(touch {marker})", f"`touch {marker}`"):
        assert main(["sweep", _spec_file(world, name=name)]) == 2
        assert main(["sweep", _spec_file(world, model=name)]) == 2
    assert not marker.exists()
