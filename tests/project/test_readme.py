"""The README's commands and spec snippets, executed and loaded: a README that drifts from the code fails here.

Every fenced block of README.md, trainers/README.md and the hand-written pages under docs/ is a shell block (```bash, or
an unlabelled block of commands), a YAML snippet (```yaml: loaded with the spec loader,
orchestrator.spec.schema.load_spec) or
a diagram (an unlabelled block with arrows). A shell line is one command (`\\` continues it; `# ...` is a comment).

Placeholders are expanded by these rules, in this order, never skipped:
1. `.venv/bin/moe-autotune` is `moe-autotune` (the same console script).
2. `[...]` groups are optional: the command runs once without them and once with all of them.
3. A token `a|b|c` is one run per alternative.
4. `...` stands for the arguments of the same block's previous command of the same subcommand.
5. Upper-case metavariables take the values of `METAVARIABLES`.

Each command then runs as the user runs it: tests/project/test_wheel.py builds the wheel, installs it with its [train]
extra in a clean venv and runs every command with its console script (argv lists, never a shell) in a folder
outside the source tree holding a copy of examples/, in the block's order; each must exit 0, except:
- `REAL_TRAINER_TRIALS`: a sweep of a spec whose backend runs the real trainer gets a budget of that many
  trials (the example's full budget runs in tests/orchestrator/test_sweep_quickstart.py);
- `MAPPED`: commands that cannot run inside a test (a server until Ctrl-C, the setup and the suite itself)
  name the test that runs them, and that test must exist;
- a command an earlier block already ran (the same argv) is not run again.
The fast lane checks the extraction, every subcommand and flag against the CLI's own help, the spec snippets and
the `estimate` lines; the slow lane (tests/project/test_wheel.py) runs the blocks end to end from the wheel.
"""

from __future__ import annotations

import itertools
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.commands.cli import main
from orchestrator.spec.schema import load_spec

ROOT = Path(__file__).resolve().parents[2]
# the README, the trainer's, and the documentation's hand-written pages (the reference pages are generated at build
# time and hold no commands); the README comes first: its first spec snippet is the one checked below
READMES = [ROOT / "README.md", ROOT / "trainers" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
METAVARIABLES = {"URI": "sqlite:///mlflow.db", "N": "5077"}  # the README's default store; a port
REAL_TRAINER_TRIALS = 2
MAPPED = {
    ("moe-autotune", "ui"): ("tests/orchestrator/test_mlflow_ui.py",
                             "test_ui_opens_on_the_trials_with_a_tokens_column_and_stops_on_ctrl_c"),
    ("moe-autotune", "dashboard"): ("tests/orchestrator/test_dashboard.py",
                                    "test_the_dashboard_serves_the_default_journal_study_with_its_trials_and_stops_on_ctrl_c"),
    ("bash", "scripts/setup.sh"): (".ci/run", "bash scripts/setup.sh"),
    ("bash", "scripts/test.sh"): (".ci/run", "bash scripts/test.sh"),
}
PROGRAMS = ("moe-autotune", "bash", "torchrun")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str:
        if self.lang == "yaml":
            return "yaml"
        if self.lang in ("bash", "sh") or (not self.lang and self.text.split() and self.text.split()[0] in (
                *PROGRAMS, ".venv/bin/moe-autotune")):
            return "shell"
        return "diagram" if not self.lang and "─▶" in self.text else "unknown"


def fenced_blocks() -> list[Block]:
    blocks = []
    for path in READMES:
        text = path.read_text()
        for m in re.finditer(r"^```([\w-]*)\n(.*?)^```", text, re.S | re.M):
            blocks.append(Block(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)))
    return blocks


def command_lines(block: Block) -> list[str]:
    """One string per command: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    lines = [re.split(r"\s#", " " + line, maxsplit=1)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def expand(line: str, previous: dict[str, list[str]]) -> list[list[str]]:
    """The argv lists one README line stands for (the rules of the module docstring)."""
    tokens = shlex.split(line.replace(".venv/bin/moe-autotune", "moe-autotune", 1))
    plain = [t for t in tokens if not (t.startswith("[") or t.endswith("]"))]
    optional = [t.strip("[]") for t in tokens if t.startswith("[") or t.endswith("]")]
    variants = [plain] + ([tokens_with(tokens)] if optional else [])
    out = []
    for argv in variants:
        if "..." in argv:
            at = argv.index("...")
            argv = argv[:at] + previous[argv[1]] + argv[at + 1:]
        argv = [METAVARIABLES.get(t, t) for t in argv]
        choices = [t.split("|") if "|" in t and not t.startswith("-") else [t] for t in argv]
        out += [list(p) for p in itertools.product(*choices)]
    if tokens[0] == "moe-autotune" and "..." not in tokens:
        previous.setdefault(tokens[1], tokens[2:])
    return out


def tokens_with(tokens: list[str]) -> list[str]:
    return [t.strip("[]") for t in tokens]


def commands() -> list[tuple[Block, str, list[str]]]:
    out = []
    for block in fenced_blocks():
        if block.kind != "shell":
            continue
        previous: dict[str, list[str]] = {}
        for line in command_lines(block):
            out += [(block, line, argv) for argv in expand(line, previous)]
    return out


# ---- fast: extraction, subcommands and flags, spec snippets -------------------------------------------------

def test_every_fenced_block_is_a_command_block_a_spec_or_a_diagram():
    blocks = fenced_blocks()
    assert {b.kind for b in blocks} <= {"shell", "yaml", "diagram"}, [b.where for b in blocks if b.kind == "unknown"]
    assert sum(b.kind == "shell" for b in blocks) >= 4 and any(b.kind == "yaml" for b in blocks)
    for block, line, argv in commands():
        assert argv[0] in PROGRAMS, f"{block.where}: {line!r} runs {argv[0]}, which this harness does not know"
        assert not any(re.fullmatch(r"[A-Z]{1,12}", t) or "[" in t or "|" in t for t in argv[1:]
                       if not t.startswith("-")), f"{block.where}: {argv} keeps a placeholder"


def test_the_placeholder_rules():
    previous: dict[str, list[str]] = {}
    assert expand("moe-autotune status quickstart [--csv leaderboard.csv]", previous) == [
        ["moe-autotune", "status", "quickstart"], ["moe-autotune", "status", "quickstart", "--csv", "leaderboard.csv"]]
    assert [a[-1] for a in expand("moe-autotune export m --format megatron-args|bridge-yaml", previous)] == [
        "megatron-args", "bridge-yaml"]
    expand("moe-autotune estimate --model tiny-moe --gpu cpu", previous)
    assert expand("moe-autotune estimate ... --calibration c.json", previous) == [
        ["moe-autotune", "estimate", "--model", "tiny-moe", "--gpu", "cpu", "--calibration", "c.json"]]
    assert expand(".venv/bin/moe-autotune ui [--port N]", {})[1] == ["moe-autotune", "ui", "--port", "5077"]


def _help(words: tuple[str, ...], capsys) -> str:
    assert main([*words, "--help"]) == 0, words
    return capsys.readouterr().out


def test_every_subcommand_and_flag_of_the_readme_is_the_clis(capsys):
    seen = set()
    for block, _line, argv in commands():
        if argv[0] != "moe-autotune":
            continue
        words = tuple(argv[1:3]) if argv[1] == "slurm" else (argv[1],)
        help_text = _help(words, capsys)
        for flag in (t.split("=", 1)[0] for t in argv if t.startswith("--")):
            assert flag in help_text, f"{block.where}: `moe-autotune {' '.join(words)}` has no {flag}"
        seen.add(words)
    assert {("estimate",), ("space",), ("sweep",), ("promote",), ("export",), ("report",)} <= seen


def test_the_spec_snippets_load_through_the_spec_loader(tmp_path):
    snippets = [b for b in fenced_blocks() if b.kind == "yaml"]
    for n, block in enumerate(snippets):
        path = tmp_path / f"snippet{n}.yaml"
        path.write_text(block.text)
        spec = load_spec(path)  # refuses a typo'd field, a bad value, YAML 1.1 numerals read as strings
        assert spec.name, block.where
    quick = load_spec(tmp_path / "snippet0.yaml")
    assert quick.cost is not None and quick.cost.train_tokens == 1.0e12  # the README's `1.0e12`


def test_the_setup_lines_are_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    for (program, target), (home, needle) in MAPPED.items():
        assert (ROOT / home).exists() and needle in (ROOT / home).read_text(), (program, target)
        if program == "bash":
            assert subprocess.run(["bash", "-n", str(ROOT / target)]).returncode == 0, target
            assert f"bash {target}" in ci


def test_the_estimate_lines_run(tmp_path, monkeypatch, capsys):
    """In a folder holding examples/, after the README's `lengths` lines (which write the histograms they read)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for argv in [argv for _, _, argv in commands() if argv[:2] == ["moe-autotune", "lengths"]]:
        assert main(argv[1:]) == 0, argv
    runs = [argv for _, _, argv in commands() if argv[:2] == ["moe-autotune", "estimate"]
            and "--calibration" not in argv]
    assert runs
    for argv in runs:
        assert main(argv[1:]) == 0, argv
        assert "step" in capsys.readouterr().out


# ---- the blocks end to end: tests/project/test_wheel.py runs them with the installed wheel ---------------------

def is_real_trainer_sweep(argv: list[str], cwd: Path) -> bool:
    """A README sweep whose spec runs the real trainer (it gets REAL_TRAINER_TRIALS trials)."""
    return argv[1] == "sweep" and load_spec(cwd / argv[2]).backend != "analytic"
