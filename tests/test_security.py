"""No shell strings anywhere: processes are started from argv lists only (a grep-able rule)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "search_spaces", "trainers", "bench", "scripts", "slurm")
# Ways Python hands a string to a shell.
FORBIDDEN = [
    (re.compile(r"shell\s*=\s*True"), "subprocess with shell=True"),
    (re.compile(r"\bos\.system\s*\("), "os.system"),
    (re.compile(r"\bos\.popen\s*\("), "os.popen"),
    (re.compile(r"\bsubprocess\.getoutput\s*\(|\bsubprocess\.getstatusoutput\s*\("), "subprocess.getoutput"),
    (re.compile(r"\bpty\.spawn\s*\("), "pty.spawn"),
]


def python_sources():
    for pkg in PACKAGES:
        yield from (ROOT / pkg).rglob("*.py")


def test_sources_exist():
    assert any(True for _ in python_sources())


def test_no_shell_strings_in_project_code():
    offenders = []
    for path in python_sources():
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, what in FORBIDDEN:
                if pattern.search(code):
                    offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {what}")
    assert not offenders, "shell strings built in project code:\n" + "\n".join(offenders)


def test_rule_catches_a_violation(tmp_path):
    # The rule itself must be able to fail.
    sample = 'import subprocess\nsubprocess.run("ls " + name, shell=True)\n'
    assert any(p.search(sample) for p, _ in FORBIDDEN)
