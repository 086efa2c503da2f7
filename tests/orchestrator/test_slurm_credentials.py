"""Credentials never reach a generated batch script (issue 58, item 4): `slurm render|submit` keeps every value that
carries one out of the script and out of what it prints; the job reads it at run time from a file beside its
scripts, readable by its owner only (orchestrator/commands/slurm_credentials.py).

- generated secrets (tests/orchestrator/test_secrets_property.py's shapes, URL passwords with odd characters,
  tokens in query strings) planted in every option that can carry one: `--tracking-uri`, `--storage`, `--env`, a
  site file's `env:` (kept out, read at run time), and the options no file can carry (`--sbatch-arg`,
  `--partition`, `--container-image`, `--container-mounts`, `--venv`: refused in one line). No rendered file, no
  stdout or stderr holds the secret; the credentials file has mode 600; the script's own settings, run by bash,
  give each value back exactly.
- `submit` with a stand-in sbatch that keeps the script as Slurm would: the kept copy holds no secret; a refused
  submission leaves neither the script nor its credentials file.
- end to end: the job's driver line, run by bash from the rendered script, reaches the tracking server with the
  password (an HTTP server that records the Authorization header it got).
"""

from __future__ import annotations

import base64
import json
import os
import random
import stat
import string
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.commands.cli import main
from orchestrator.commands.slurm_credentials import SUFFIX, carries
from orchestrator.redact import redact_text
from tests.orchestrator.test_secrets_property import SHAPES, Secret, _secret
from tests.orchestrator.test_slurm_render import SPEC, settings_block

ALNUM = string.ascii_letters + string.digits
# characters a password may hold when a user writes it into a URL unescaped (no line break: an argument holds none).
# An unescaped '@' is drawn only without '/', '?', '#', a quote or a space: with them the URL has another reading,
# the one every client takes (`http://a:@x#@h` is user `a`, host `x`), and no rule can tell (see
# search_spaces/redaction.py: _ODD_USERINFO)
ODD = "!$&'()*+,;=:/?#%~-._ \"<>`\\[]{}|^"
AT_ODD = "!$&()*+,;=:@%~-._[]{}|^"
INPUTS = "inputs"  # the files the test writes as the user (the spec, a site file): not searched


def _needle(rng: random.Random) -> str:
    return rng.choice(string.ascii_letters) + "".join(rng.choice(ALNUM) for _ in range(23))


def _odd_password(seed: int, odd: str, template: str) -> Secret:
    """A URL whose password is a random core with odd characters around and inside it."""
    rng = random.Random(f"odd|{seed}")
    core = _needle(rng)
    cut = rng.randrange(1, len(odd) + 1) if odd else 0
    password = odd[:cut] + core + odd[cut:]
    return Secret(template.format(password=password), core, "odd user-info password")


def _query(seed: int, template: str) -> Secret:
    core = _needle(random.Random(f"query|{seed}"))
    return Secret(template.format(secret=core), core, "secret in the query string")


URL_TEMPLATES = {"tracking": ("http://alice:{password}@mlflow.example.com:5000",
                              "https://bob:{password}@mlflow.example.com/base"),
                 "storage": ("postgresql://optuna:{password}@db.example.com:5432/optuna",
                             "postgresql+psycopg://optuna:{password}@db/optuna?sslmode=require")}
QUERY_TEMPLATES = {"tracking": ("https://mlflow.example.com/?token={secret}",),
                   "storage": ("postgresql://db.example.com/optuna?user=u&password={secret}&sslmode=require",
                               "postgresql://db/optuna?sslpassword={secret}")}


@st.composite
def url_secret(draw, store: str) -> Secret:
    seed = draw(st.integers(0, 2 ** 63))
    how = draw(st.sampled_from(["odd", "query", "shape"]))
    if how == "odd":
        odd = draw(st.text(st.sampled_from(draw(st.sampled_from([ODD, AT_ODD]))), max_size=6))
        return _odd_password(seed, odd, draw(st.sampled_from(URL_TEMPLATES[store])))
    if how == "query":
        return _query(seed, draw(st.sampled_from(QUERY_TEMPLATES[store])))
    return _secret(draw(st.sampled_from(["url user-info", "url token as user"])), seed, store)


@st.composite
def any_secret(draw) -> Secret:
    if draw(st.booleans()):
        return draw(url_secret(draw(st.sampled_from(["tracking", "storage"]))))
    return _secret(draw(st.sampled_from(sorted(SHAPES))), draw(st.integers(0, 2 ** 63)), "any")


@dataclass(frozen=True)
class Slot:
    """Where a secret is planted: the options that carry it, and how the job reads it (a variable), or None for a
    place no file can carry (the command refuses it)."""
    name: str
    variable: str | None

    def argv(self, value: str, site: Path) -> list[str]:
        if self.name == "--sbatch-arg":
            return ["--sbatch-arg", f"--comment={value}"]
        if self.name.startswith("--env "):
            return ["--env", f"{self.variable}={value}"]
        if self.name.startswith("site env "):
            site.write_text(json.dumps({"env": {self.variable: value}}))
            return ["--site", str(site)]
        return [self.name, value]


REFERENCE = {"--tracking-uri": Slot("--tracking-uri", "MOE_AUTOTUNE_TRACKING_URI"),
             "--storage": Slot("--storage", "MOE_AUTOTUNE_STORAGE"),
             "--env HF_TOKEN": Slot("--env HF_TOKEN", "HF_TOKEN"),
             "--env MY_SETTINGS": Slot("--env MY_SETTINGS", "MY_SETTINGS"),  # a plain name: its value is judged
             "site env DATABASE_URL": Slot("site env DATABASE_URL", "DATABASE_URL")}
REFUSED = {name: Slot(name, None) for name in ("--sbatch-arg", "--partition", "--container-image",
                                               "--container-mounts", "--venv")}


@dataclass
class Plant:
    slots: dict[str, Secret]


@st.composite
def plants(draw) -> Plant:
    chosen = draw(st.lists(st.sampled_from(sorted(REFERENCE)), min_size=1, max_size=3, unique=True))
    if draw(st.integers(0, 3)) == 0:  # now and then a place no file can carry, beside them
        chosen.append(draw(st.sampled_from(sorted(REFUSED))))
    slots = {}
    for name in chosen:
        if name == "--tracking-uri":
            slots[name] = draw(url_secret("tracking"))
        elif name == "--storage":
            slots[name] = draw(url_secret("storage"))
        else:
            slots[name] = draw(any_secret())
    return Plant(slots)


def _leaks(secrets: list[Secret], texts: dict[str, str]) -> list[tuple[str, str]]:
    return [(s.shape, where) for s in secrets for where, text in texts.items()
            if s.needle in text or s.needle in "".join(text.split())]


def _render(capsys, folder: Path, *argv: str) -> tuple[int, str, str]:
    spec = folder / INPUTS / "spec.yaml"
    capsys.readouterr()
    code = main(["slurm", "render", str(spec), "--workdir", str(folder / "work"), *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _example_folder(tmp_path: Path) -> Path:
    folder = Path(tempfile.mkdtemp(dir=tmp_path, prefix="example-"))
    (folder / INPUTS).mkdir()
    (folder / INPUTS / "spec.yaml").write_text(SPEC)
    return folder


def _written(folder: Path) -> dict[Path, str]:
    return {p: p.read_bytes().decode("latin-1") for p in folder.rglob("*")
            if p.is_file() and INPUTS not in p.relative_to(folder).parts}


def _run_settings(script: str, probe: str) -> list[str]:
    """The script's settings part (its credentials file sourced), then `probe`, by bash: NUL-separated values."""
    done = subprocess.run(["bash", "-c", settings_block(script) + probe], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


@settings(max_examples=max(20, settings.default.max_examples // 3), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plant=plants())
def test_no_rendered_file_or_output_holds_a_credential_and_the_job_still_gets_it(plant, capsys, tmp_path):
    folder = _example_folder(tmp_path)
    site = folder / INPUTS / "site.json"
    argv = [a for name, secret in plant.slots.items()
            for a in (REFERENCE.get(name) or REFUSED[name]).argv(secret.text, site)]
    code, out, err = _render(capsys, folder, *argv)
    secrets = list(plant.slots.values())
    written = _written(folder)
    texts = {"stdout": out, "stderr": err, **{str(p): t for p, t in written.items() if p.suffix != SUFFIX}}
    assert not _leaks(secrets, texts), _leaks(secrets, texts)
    refused = [name for name in plant.slots if name in REFUSED]
    event(f"exit {code}{' (a place no file can carry)' if refused else ''}")
    if code != 0:
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and out == "", (code, err)
        assert not written, f"a refused render wrote {sorted(map(str, written))}"
        if refused:
            assert "carries a credential" in err, err
        return
    assert not refused, f"{refused} was written into the script: {err}"
    subprocess.run(["bash", "-n"], input=out, text=True, check=True)
    # the credentials file: one, readable by its owner only, where the script says
    kept = [p for p in written if p.suffix == SUFFIX]
    assert len(kept) == 1, sorted(map(str, written))
    assert stat.S_IMODE(kept[0].stat().st_mode) == 0o600
    assert kept[0].parent == folder / "work" / "runs" / "slurm"
    # run time: every value as given, and the driver's command line without it
    names = [REFERENCE[name].variable for name in plant.slots]
    values = _run_settings(out, "".join(f'printf "%s\\0" "${{{n}-<unset>}}"; ' for n in names)
                           + 'printf "%s\\0" "${DRIVER[@]}" "${LINK[@]}"')
    assert values[:len(names)] == [plant.slots[name].text for name in plant.slots]
    command_lines = values[len(names):]
    assert "--tracking-uri" not in command_lines or "--tracking-uri" not in plant.slots
    assert "--storage" not in command_lines or "--storage" not in plant.slots
    # what was kept out is named on stderr, masked
    assert err.startswith("note: ") and str(kept[0]) in err and "readable by you only" in err, err


@settings(max_examples=max(20, settings.default.max_examples // 3), deadline=None)
@given(secret=any_secret())
def test_the_redaction_hides_every_planted_secret_given_whole_quoted_or_in_a_sentence(secret):
    """Also a URL password with a quote or a space in it, which the rules, made to find a URL inside a text, used to
    stop at (search_spaces/redaction.py: _ODD_USERINFO): an error line quoting the URI showed it."""
    assert carries(secret.text)
    for text in (secret.text, f"cannot use the MLflow tracking URI {secret.text!r}: no answer",
                 f"error: {secret.text} refused", json.dumps({"uri": secret.text})):
        assert secret.needle not in redact_text(text), (text, redact_text(text))


@pytest.mark.parametrize("value", ["sqlite:////abs/optuna.db", "journal:///optuna.journal", "http://127.0.0.1:5000",
                                   "nvcr.io#nvidia/pytorch:25.09-py3", "alice@nvcr.io#nvidia/pytorch",
                                   "/lustre:/lustre", "none", "http://h:5000/path/a@b", "/home/me/dir with space"])
def test_plain_values_stay_in_the_script(value):
    assert not carries(value) and redact_text(value) == value


def test_plain_values_are_rendered_as_before(capsys, tmp_path):
    folder = _example_folder(tmp_path)
    code, out, err = _render(capsys, folder, "--tracking-uri", "http://127.0.0.1:5000", "--storage",
                             f"sqlite:///{folder}/optuna.db", "--env", "NCCL_IB_HCA=mlx5")
    assert code == 0 and err == "", err
    assert not any(p.suffix == SUFFIX for p in _written(folder)), "a credentials file for no credential"
    assert "MOE_AUTOTUNE_CREDENTIALS" not in settings_block(out).split("# Credentials given")[0]
    assert _run_settings(out, 'printf "%s\\0" "${DRIVER[@]}" "$NCCL_IB_HCA"')[-5:] == [
        "--storage", f"sqlite:///{folder}/optuna.db", "--tracking-uri", "http://127.0.0.1:5000", "mlx5"]


# ---- submit: what Slurm keeps --------------------------------------------------------------------------------------
def _fake_sbatch(folder: Path, answer: str, code: int = 0) -> Path:
    """An `sbatch` that keeps a copy of the script it is given (as slurmctld does) and answers `answer`."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/bash\nmkdir -p "{folder}/slurm-kept"\ncp "${{@: -1}}" "{folder}/slurm-kept/"\n'
                      f'echo "{answer}"\nexit {code}\n')
    sbatch.chmod(0o755)
    return bin_dir


def test_submit_hands_slurm_a_script_without_the_password(capsys, tmp_path, monkeypatch):
    password = "pw-" + "Kx7Qm2Zr9Lw4Tn8V" * 2
    folder = _example_folder(tmp_path)
    monkeypatch.setenv("PATH", f"{_fake_sbatch(folder, '4242')}:{os.environ['PATH']}")
    capsys.readouterr()
    uri = f"http://alice:{password}@mlflow.example.com:5000"
    assert main(["slurm", "submit", str(folder / INPUTS / "spec.yaml"), "--workdir", str(folder / "work"),
                 "--tracking-uri", uri]) == 0
    out, err = capsys.readouterr()
    assert out == "4242\n" and password not in err and "http://***@mlflow.example.com:5000" in err, err
    kept_by_slurm = list((folder / "slurm-kept").iterdir())
    assert len(kept_by_slurm) == 1 and password not in kept_by_slurm[0].read_text()
    credentials = list((folder / "work" / "runs" / "slurm").glob(f"*{SUFFIX}"))
    assert len(credentials) == 1 and stat.S_IMODE(credentials[0].stat().st_mode) == 0o600
    assert _run_settings(kept_by_slurm[0].read_text(), 'printf "%s\\0" "$MOE_AUTOTUNE_TRACKING_URI"') == [uri]


def test_a_refused_submission_leaves_no_credentials_behind(capsys, tmp_path, monkeypatch):
    folder = _example_folder(tmp_path)
    monkeypatch.setenv("PATH", f"{_fake_sbatch(folder, 'sbatch: error: invalid partition', 1)}:"
                               f"{os.environ['PATH']}")
    capsys.readouterr()
    code = main(["slurm", "submit", str(folder / INPUTS / "spec.yaml"), "--workdir", str(folder / "work"),
                 "--storage", "postgresql://u:pw-AbC123xyz@db/optuna"])
    err = capsys.readouterr().err
    assert code == 2 and "sbatch failed" in err and "pw-AbC123xyz" not in err, err
    assert list((folder / "work" / "runs" / "slurm").iterdir()) == []


def test_the_job_commands_read_the_stores_from_the_environment(capsys, tmp_path, monkeypatch):
    """`sweep` and `slurm link-run` take --tracking-uri / --storage from MOE_AUTOTUNE_TRACKING_URI /
    MOE_AUTOTUNE_STORAGE when the flag is not given: how the job gets what was kept out of its script."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    monkeypatch.setenv("MOE_AUTOTUNE_TRACKING_URI", "mlfow.db")
    capsys.readouterr()
    assert main(["sweep", str(spec)]) == 2
    assert "tracking URI 'mlfow.db' has no URL scheme" in capsys.readouterr().err
    monkeypatch.setenv("MOE_AUTOTUNE_STORAGE", f"sqlite:///{tmp_path}/missing.db")
    assert main(["slurm", "link-run", str(spec)]) == 2
    assert f"{tmp_path}/missing.db" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()


# ---- end to end: the job's driver reaches the server with the password ------------------------------------------
@pytest.mark.slow  # a sweep process of its own (seconds): the full suite runs it, the fast lane does not
@pytest.mark.timeout(300)
def test_the_rendered_jobs_driver_reaches_the_tracking_server_with_the_password(capsys, tmp_path):
    from tests.orchestrator.test_not_mlflow import LOGIN_PAGE, Answering
    from tests.sweep_helpers import spec_data, write_spec

    password = "p'w " + "Hq3Nv8Rt2Yc6Jd1X" * 2  # a quote and a space in it, unescaped
    spec = write_spec(tmp_path / "spec.json", spec_data(tmp_path, "e2e", budget={"n_trials": 2}))
    with Answering(200, "text/html", LOGIN_PAGE) as server:
        uri = f"http://alice:{password}@127.0.0.1:{server.port}"
        capsys.readouterr()
        assert main(["slurm", "render", str(spec), "--workdir", str(tmp_path), "--tracking-uri", uri]) == 0
        script = capsys.readouterr().out
        assert password not in script
        env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
        env.pop("MOE_AUTOTUNE_TRACKING_URI", None)
        done = subprocess.run(["bash", "-c", settings_block(script) + 'source "$VENV_ACTIVATE" && cd "$WORKDIR" && '
                               '"${DRIVER[@]}" --quiet'], capture_output=True, text=True, env=env, timeout=240)
    expected = "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
    assert expected in server.authorizations, (server.authorizations, done.stderr[-2000:])
    # the server answers a login page: the sweep says so in one line, the password not in it
    assert done.returncode == 2 and "it answers HTML" in done.stderr and password not in done.stderr, done.stderr
