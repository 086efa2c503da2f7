"""Bad input to the CLI and the sweep spec: one line on stderr naming the problem, exit code 2, nothing damaged.

Every case runs against an Optuna storage that already holds a finished study; after each bad command that
study must still have exactly the same trials.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from orchestrator.commands.cli import main
from tests.sweep_helpers import spec_data

ROOT = Path(__file__).resolve().parents[2]
EXISTING = "kept-study"


def _base_spec(workdir: Path, storage: str) -> dict:
    # analytic backend, no MLflow: a valid spec runs in seconds
    return spec_data(workdir, "bad-input-probe", gpu="h100", gpus_per_node=8, seq_len=1024, gbs=16, fixed={},
                     budget={"n_trials": 2}, seed=1, tracking_uri="none", storage=storage)


def _fingerprint(storage: str) -> dict:
    """The stored trials of the existing study, and which studies exist (a bad command creates none)."""
    rdb = optuna.storages.RDBStorage(storage)
    try:
        study = optuna.load_study(study_name=EXISTING, storage=rdb)
        names = sorted(s.study_name for s in optuna.get_all_study_summaries(rdb, include_best_trial=False))
        return {"studies": names,
                "trials": [(t.number, t.state.name, t.values, json.dumps(t.user_attrs, sort_keys=True, default=str))
                           for t in study.trials]}
    finally:
        # closed now, not whenever the garbage collector gets to it: the last connection to a WAL database
        # checkpoints it into the main file on closing, which would change the file under a later snapshot
        rdb.remove_session()
        rdb.engine.dispose()


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


def _raw_file(world, name: str, text: str | bytes) -> str:
    path = world["root"] / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _spec_text(world, name: str) -> str:
    """The base spec as YAML text under a fresh study name (for cases that edit the text itself)."""
    return yaml.safe_dump(_base_spec(world["root"], world["storage"]) | {"name": f"probe-{name}"})


def _model_file(world, name: str, content: dict | str | bytes) -> str:
    """A model config.json in its own folder (`content` a dict is tiny-moe's config updated with it)."""
    folder = world["root"] / "models" / name
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        cfg = json.loads((ROOT / "search_spaces" / "catalog" / "hf_configs" / "tiny-moe.json").read_text())
        content = json.dumps({**cfg, **content}).replace('"__inf__"', "Infinity")
    (folder / "config.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(folder / "config.json")


def _estimate(model: str) -> list[str]:
    return ["estimate", "--model", model, "--gpu", "h100", "--num-gpus", "8", "--seq-len", "1024"]


def _report_out_is_a_file(world) -> list[str]:
    out = _raw_file(world, "report-out.txt", "keep me\n")
    return ["report", EXISTING, "--storage", world["storage"], "--out", out, "--no-mlflow"]


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
    "config.json missing fields": (lambda w: ["sweep",
                                              _spec_file(w, model=str(w["root"] / "broken-model" / "config.json"))],
                                   ["config"]),
    "config.json path does not exist": (lambda w: ["sweep",
                                                   _spec_file(w, model=str(w["root"] / "absent" / "config.json"))],
                                        ["absent"]),
    # ---- hostile spec files (issue 15) -------------------------------------------------------------
    "YAML anchors and aliases": (lambda w: ["sweep", _raw_file(w, "alias.yaml", _spec_text(w, "alias").replace(
        "gbs: 16", "gbs: &g 16") + "steps: *g\n")], ["alias"]),
    "duplicate top-level key": (lambda w: ["sweep", _raw_file(w, "dup.yaml", _spec_text(w, "dup") + "seed: 2\n")],
                                ["duplicate", "seed"]),
    "duplicate nested key": (lambda w: ["sweep", _raw_file(w, "dup-nested.yaml", _spec_text(w, "dup2").replace(
        "budget:\n  n_trials: 2\n", "budget:\n  n_trials: 2\n  n_trials: 3\n"))], ["duplicate", "n_trials"]),
    "spec not UTF-8": (lambda w: ["sweep", _raw_file(w, "latin1.yaml", _spec_text(w, "latin1").encode()
                                                     + "# café\n".encode("latin-1"))], ["utf-8"]),
    "spec is a directory": (lambda w: ["sweep", str(w["root"])], ["directory"]),
    "spec larger than 1 MiB": (lambda w: ["sweep", _raw_file(w, "huge.yaml", _spec_text(w, "huge")
                                                             + "# padding\n" * 120_000)], ["MiB"]),
    "seed -1": (lambda w: ["sweep", _spec_file(w), "--seed", "-1"], ["seed"]),
    "seed 2**70": (lambda w: ["sweep", _spec_file(w), "--seed", str(2 ** 70)], ["seed"]),
    "seed 2**70 in the spec": (lambda w: ["sweep", _spec_file(w, seed=2 ** 70)], ["seed"]),
    "infinite trial_timeout_s": (lambda w: ["sweep", _spec_file(w, trial_timeout_s=float("inf"))],
                                 ["trial_timeout_s"]),
    "NaN trial_timeout_s": (lambda w: ["sweep", _spec_file(w, trial_timeout_s=float("nan"))], ["trial_timeout_s"]),
    "infinite wall_time_s": (lambda w: ["sweep", _spec_file(w, budget={"n_trials": 2, "wall_time_s": float("inf")})],
                             ["wall_time_s"]),
    "fractional nodes": (lambda w: ["sweep", _spec_file(w, nodes=1.7)], ["nodes"]),
    "boolean nodes": (lambda w: ["sweep", _spec_file(w, nodes=True)], ["nodes"]),
    "string seq_len": (lambda w: ["sweep", _spec_file(w, seq_len="1024")], ["seq_len"]),
    "float gbs": (lambda w: ["sweep", _spec_file(w, gbs=16.0)], ["gbs"]),
    "fractional n_trials": (lambda w: ["sweep", _spec_file(w, budget={"n_trials": 2.5})], ["n_trials"]),
    "boolean seed": (lambda w: ["sweep", _spec_file(w, seed=True)], ["seed"]),
    # ---- hostile model config.json (issue 15) -----------------------------------------------------------
    "config.json binary": (lambda w: ["sweep", _spec_file(w, model=_model_file(w, "binary", bytes(range(256)) * 4))],
                           ["config"]),
    "config.json nested 100,000 deep": (lambda w: ["sweep", _spec_file(w, model=_model_file(
        w, "deep", '{"hidden_size": ' + "[" * 100_000 + "]" * 100_000 + "}"))], ["deep"]),
    "config.json zero heads": (lambda w: ["sweep", _spec_file(w, model=_model_file(
        w, "zero-heads", {"num_attention_heads": 0}))], ["num_attention_heads", "zero-heads"]),
    "config.json infinite hidden_size": (lambda w: ["sweep", _spec_file(w, model=_model_file(
        w, "inf-hidden", {"hidden_size": "__inf__"}))], ["hidden_size", "inf-hidden"]),
    "config.json top-k as a word": (lambda w: ["sweep", _spec_file(w, model=_model_file(
        w, "topk-word", {"num_experts_per_tok": "two"}))], ["num_experts_per_tok"]),
    "config.json layer_types a number": (lambda w: ["sweep", _spec_file(w, model=_model_file(
        w, "layer-types", {"layer_types": 5}))], ["layer_types"]),
    "estimate: config.json negative sizes": (lambda w: _estimate(_model_file(
        w, "negative", {"intermediate_size": -128, "moe_intermediate_size": -128})), ["intermediate_size"]),
    "estimate: config.json top-k above experts": (lambda w: _estimate(_model_file(
        w, "topk-big", {"num_experts_per_tok": 9})), ["num_experts_per_tok"]),
    # ---- output paths, checked before any work -------------------------------------------------------
    "status: --csv into a directory": (lambda w: ["status", EXISTING, "--storage", w["storage"], "--csv",
                                                  str(w["root"])], ["csv"]),
    "status: --csv into a missing directory": (lambda w: ["status", EXISTING, "--storage", w["storage"], "--csv",
                                                          str(w["root"] / "no-such-dir" / "t.csv")], ["csv"]),
    "report: --out onto an existing file": (_report_out_is_a_file, ["out"]),
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
    "estimate: config.json missing fields": (lambda w: ["estimate", "--model",
                                                        str(w["root"] / "broken-model" / "config.json"),
                                                        "--gpu", "h100", "--num-gpus", "8", "--seq-len", "1024"],
                                             ["config"]),
    "space: --fix without a value": (lambda w: ["space", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8",
                                                "--seq-len", "1024", "--fix", "tp"], ["field=value"]),
    "space: --free of a dimension that varies already": (
        lambda w: ["space", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "1024",
                   "--free", "levers,tp"], ["--free", "'tp'"]),
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


def test_bad_output_paths_write_nothing(world, capsys):
    keep = Path(_report_out_is_a_file(world)[5])
    assert main(_report_out_is_a_file(world)) == 2
    assert keep.read_text() == "keep me\n"
    missing = world["root"] / "no-such-dir"
    assert main(["status", EXISTING, "--storage", world["storage"], "--csv", str(missing / "t.csv")]) == 2
    assert not missing.exists()
    capsys.readouterr()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_spec_is_one_line(world, capsys, tmp_path):
    spec = Path(_spec_file(world))
    spec.chmod(0)
    try:
        assert main(["sweep", str(spec)]) == 2
    finally:
        spec.chmod(0o644)
    assert "read" in _one_error_line(capsys.readouterr().err)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_a_file_that_cannot_be_read_is_one_line(world, capsys):
    # /proc/self/mem is a regular file that even root cannot read from offset 0 (EIO)
    assert main(["sweep", "/proc/self/mem"]) == 2
    assert "cannot be read" in _one_error_line(capsys.readouterr().err)
    assert main(_estimate("/proc/self/mem")) == 2
    assert "cannot be read" in _one_error_line(capsys.readouterr().err)


def test_shell_metacharacters_never_reach_a_shell(world, tmp_path):
    # a name that would create a file if any shell ever saw it
    marker = tmp_path / "pwned"
    for name in (f"x;touch {marker}", f"$(touch {marker})", f"`touch {marker}`"):
        assert main(["sweep", _spec_file(world, name=name)]) == 2
        assert main(["sweep", _spec_file(world, model=name)]) == 2
    assert not marker.exists()


# ---- issue 21 class 3: read-only commands never create or change a store -------------------------------------
def _absent(world, name: str) -> str:
    return f"sqlite:///{world['root'] / name}"


READ_ONLY_CASES = {
    "status: storage file missing": lambda w: ["status", "--storage", _absent(w, "absent-optuna.db")],
    "check: storage file missing": lambda w: ["check", "--storage", _absent(w, "absent-optuna.db")],
    "check: tracking store missing": lambda w: ["check", EXISTING, "--storage", w["storage"], "--tracking-uri",
                                                _absent(w, "absent-mlflow.db")],
    "export: storage file missing": lambda w: ["export", EXISTING, "--storage", _absent(w, "absent-optuna.db")],
    "export: registry store missing": lambda w: ["export", "models:/m@production", "--tracking-uri",
                                                 _absent(w, "absent-mlflow.db")],
    "report: storage file missing": lambda w: ["report", "--storage", _absent(w, "absent-optuna.db"),
                                               "--no-mlflow"],
    "calibrate --study: storage file missing": lambda w: ["calibrate", "--study", "s", "--storage",
                                                          _absent(w, "absent-optuna.db"), "--out",
                                                          str(w["root"] / "cal.json")],
    "calibrate --experiment: tracking store missing": lambda w: ["calibrate", "--experiment", "e",
                                                                 "--tracking-uri", _absent(w, "absent-mlflow.db"),
                                                                 "--out", str(w["root"] / "cal.json")],
    "promote --rollback --name: registry missing": lambda w: ["promote", "--rollback", "--name", "m",
                                                              "--tracking-uri", _absent(w, "absent-mlflow.db")],
    "promote --rollback: storage missing": lambda w: ["promote", "--rollback", "--storage",
                                                      _absent(w, "absent-optuna.db")],
    "ui: MLflow file store missing": lambda w: ["ui", "--tracking-uri", f"file://{w['root'] / 'absent-mlruns'}"],
    "status: an empty file is no storage": lambda w: ["status", "--storage", _absent(w, "empty.db")],
    "check: an empty file is no MLflow store": lambda w: ["check", EXISTING, "--storage", w["storage"],
                                                          "--tracking-uri", _absent(w, "empty.db")],
    "status: a text file is no storage": lambda w: ["status", "--storage", _absent(w, "notes.db")],
    "status: a database server that is not there": lambda w: ["status", "--storage",
                                                              "postgresql://nobody@127.0.0.1:9/nodb"],
}


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes (SQLite's -wal/-shm side files of an open reader excepted)."""
    # Connections an earlier command or case left unreferenced close first: the last one to close checkpoints
    # the WAL into the main file, and must not do so between the snapshots taken around a command.
    gc.collect()
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(("-wal", "-shm", "-journal"))}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(READ_ONLY_CASES), ids=list(READ_ONLY_CASES))
def test_read_only_commands_refuse_a_missing_store_and_create_nothing(case, world, capsys):
    (world["root"] / "empty.db").write_bytes(b"")
    (world["root"] / "notes.db").write_text("not a database\n")
    argv = READ_ONLY_CASES[case](world)
    before = _tree(world["root"])
    capsys.readouterr()
    code = main(argv)
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2, line
    assert _tree(world["root"]) == before, f"{case}: files appeared or changed"
    assert "no " in line or "cannot" in line, line


# ---- issue 21 class 1: names on the command line --------------------------------------------------------------
NAME_CASES = {
    "status: a study name with a line break": ["status", "a\nb"],
    "check: a study name with a path separator": ["check", "../x"],
    "report: a study name with a path separator": ["report", "x/../../etc"],
    "export: a study name with a control character": ["export", "a\x1bb"],
    "export: a registered name with a line break": ["export", "m\nx@production"],
    "export: a registered version that is no number": ["export", "m/1; rm"],
    "promote: --name with a space": ["promote", "--rollback", "--name", "m x"],
    "promote: a study name longer than 100": ["promote", "s" * 101],
    "confirm: a study name with a quote": ["confirm", "x'y"],
    "ui: a study name with a line break": ["ui", "a\rb"],
    "calibrate: --study with a path separator": ["calibrate", "--study", "a/b", "--out", "cal.json"],
    "calibrate: --experiment with a line break": ["calibrate", "--experiment", "a\nb", "--out", "cal.json"],
    "sweep: --study-name with a trailing line break": ["sweep", "SPEC", "--study-name", "abc\n"],
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(NAME_CASES), ids=list(NAME_CASES))
def test_a_name_that_is_not_plain_is_one_line_naming_it(case, world, capsys, monkeypatch):
    monkeypatch.chdir(world["root"])
    argv = [(_spec_file(world) if a == "SPEC" else a) for a in NAME_CASES[case]]
    if argv[0] != "sweep":
        argv += ["--storage", world["storage"]] if argv[0] not in ("ui",) else []
    before = _tree(world["root"])
    capsys.readouterr()
    code = main(argv)
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2, line
    assert any(w in line for w in ("letters, digits", "longer than 100", "NAME/VERSION (a number)")), line
    assert _tree(world["root"]) == before
