"""No shell strings anywhere: processes are started from argv lists only (a grep-able rule)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


# ---- credentials in URIs (issue 15, item 7): one redaction for MLflow artifacts and error lines ----------
import pytest  # noqa: E402

from orchestrator.redact import redact_mapping, redact_uri  # noqa: E402
from orchestrator.tracking.environment import recorded_variables  # noqa: E402

REDACTIONS = [
    ("postgresql://optuna:hunter2@db:5432/optuna", "postgresql://***@db:5432/optuna"),
    ("https://:hunter2@mlflow.example.com/", "https://***@mlflow.example.com/"),  # password only
    ("https://ghp_hunter2@github.com/x.git", "https://***@github.com/x.git"),  # a token as the user
    ("mysql+pymysql://u:p@hunter2@db/x", "mysql+pymysql://***@db/x"),  # an unescaped '@' in the password
    ("http://u:hunter2/x@host/db", "http://***@host/db"),  # a '/' in the password
    ("cannot open storage 'postgresql://u:hunter2@h/db': refused",
     "cannot open storage 'postgresql://***@h/db': refused"),
    ("postgresql://h/db?user=u&password=hunter2&sslmode=require",
     "postgresql://h/db?user=u&password=***&sslmode=require"),
    ("a http://a:hunter2@x and ray://b:hunter2@y:10001", "a http://***@x and ray://***@y:10001"),
    # nothing to hide: unchanged
    ("sqlite:////abs/optuna.db", "sqlite:////abs/optuna.db"),
    ("http://127.0.0.1:5000/path/a@b", "http://127.0.0.1:5000/path/a@b"),
    ("models:/tiny-moe-4096-layout@production", "models:/tiny-moe-4096-layout@production"),
    ("none", "none"),
]


@pytest.mark.parametrize("text,expected", REDACTIONS)
def test_redact_uri(text, expected):
    assert redact_uri(text) == expected


def test_redact_mapping_and_environment():
    spec = {"storage": "postgresql://u:hunter2@h/db", "nested": [{"api_key": "hunter2", "tp": 2}], "seed": 1}
    assert "hunter2" not in repr(redact_mapping(spec))
    assert redact_mapping(spec)["nested"][0]["tp"] == 2 and redact_mapping(spec)["seed"] == 1
    env = {"DB_PASSWD": "hunter2", "X_PWD": "hunter2", "PWD": "/home/me", "SSH_PASSPHRASE": "hunter2",
           "PROXY_PASS": "hunter2", "MLFLOW_TRACKING_URI": "https://u:hunter2@h/", "OMP_NUM_THREADS": "1"}
    # an allow-list: MLflow's URI is not a tuning variable, so it is not recorded at all
    assert recorded_variables(env) == {"OMP_NUM_THREADS": "1"}
