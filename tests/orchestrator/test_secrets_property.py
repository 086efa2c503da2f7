"""Secrets by construction (issue 34): generated secrets of every shape, planted in the environment, the command
line and the spec, never reach anything moe-autotune writes or prints.

Each example plants fresh secrets (URL user-info, libpq key/value DSNs, authorization headers inside JSON,
cookies, vendors' token shapes, JWTs, long random values after key-like words) in allowed and disallowed
environment variables, in the arguments of `sweep` (a Ray address's user-info) and in free-text spec fields, then
runs `sweep` (analytic backend), `promote`, `export` and `report` as a user would (processes of their own) and
searches, for the random part of every secret:
- every command's stdout and stderr;
- every file under the example's folder, byte for byte: both stores' SQLite files (free pages included), the
  trial directories and spools, MLflow's artifacts (environment.json, spec.json, summary.json, the report),
  the report folder;
- every MLflow param and tag of every run, and every registered model version's tags, through the client.

The fast lane runs few examples on SQLite stores; the full profile more; the slow test does the same against a
real MLflow server reached through a tracking URI with user-info (sweep, promote, export, report all given it).
"""

from __future__ import annotations

import base64
import json
import os
import random
import string
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient

from orchestrator.redact import redact_text
from orchestrator.tracking.environment import recorded_variables
from tests.sweep_helpers import spec_data, write_spec

ROOT = Path(__file__).resolve().parents[2]
ALNUM = string.ascii_letters + string.digits
INPUTS = "inputs"  # the example's input files (the spec the user wrote): the only files not searched
# one generated set per example (a sweep, promote, export, report): few in the fast lane, more in the full profile
EXAMPLES = max(1, settings.default.max_examples // 50)
SERVER_EXAMPLES = max(1, settings.default.max_examples // 100)  # each starts a server and five processes
# an end-to-end example takes about a minute: a failing one is reported as drawn, not shrunk
E2E_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)


@dataclass(frozen=True)
class Secret:
    """A planted value and the part of it that must never be written anywhere."""
    text: str
    needle: str
    shape: str


def _word(rng: random.Random, n: int, alphabet: str = ALNUM) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt(rng: random.Random) -> Secret:
    payload = _b64url(json.dumps({"sub": _word(rng, 12), "iat": rng.randrange(10 ** 9)}).encode())
    signature = _word(rng, 43, ALNUM + "-_")
    return Secret(f"{_b64url(b'{\"alg\":\"HS256\",\"typ\":\"JWT\"}')}.{payload}.{signature}", signature, "jwt")


def _shapes() -> dict[str, Callable[[random.Random], Secret]]:
    def core(rng, n=24):
        return _word(rng, n)

    def make(shape, build, n=24, alphabet=ALNUM):
        def one(rng):
            needle = _word(rng, n, alphabet)
            return Secret(build(needle, rng), needle, shape)
        return one

    return {
        "url user-info": make("url user-info", lambda s, r: f"https://alice:{s}@mlflow.example.com:5000/base"),
        "url token as user": make("url token as user", lambda s, r: f"https://{s}@github.com/org/repo.git"),
        "libpq dsn": make("libpq dsn", lambda s, r: f"host=db.example.com port=5432 user=optuna password={s} "
                                                     "dbname=optuna sslmode=require"),
        "libpq dsn quoted": make("libpq dsn quoted", lambda s, r: f"host=db user=u password='{s} x\\'y' dbname=o"),
        "libpq sslpassword": make("libpq sslpassword", lambda s, r: f"sslmode=verify-full sslpassword={s} host=db"),
        "bearer in json": make("bearer in json", lambda s, r: json.dumps(
            {"url": "https://api.example.com", "headers": {"Authorization": f"Bearer {s}"}})),
        "basic header": make("basic header", lambda s, r: f"Authorization: Basic {s}=="),
        "token header": make("token header", lambda s, r: f"Authorization: Token {s}"),
        "cookie": make("cookie", lambda s, r: f"Cookie: sessionid={s}; theme=dark"),
        "set-cookie in json": make("set-cookie in json", lambda s, r: json.dumps({"Set-Cookie": f"sid={s}; Path=/"})),
        "api key header": make("api key header", lambda s, r: f"X-Api-Key: {s}"),
        "github": make("github", lambda s, r: f"ghp_{s}", n=36),
        "github pat": make("github pat", lambda s, r: f"github_pat_{core(r, 22)}_{s}", n=59),
        "aws access key id": make("aws access key id", lambda s, r: f"AKIA{s}", n=16,
                                  alphabet=string.ascii_uppercase + string.digits),
        "slack": make("slack", lambda s, r: f"xoxb-{r.randrange(10 ** 11)}-{r.randrange(10 ** 12)}-{s}"),
        "hugging face": make("hugging face", lambda s, r: f"hf_{s}", n=34),
        "openai-style": make("openai-style", lambda s, r: f"sk-proj-{s}", n=48),
        "jwt": _jwt,
        "generic after key word": make("generic after key word", lambda s, r: f"api_token {s}", n=32),
    }


SHAPES = _shapes()
# shapes that survive a spec field refusing spaces and shell characters (trainer_module)
PLAIN_SHAPES = ("github", "github pat", "aws access key id", "slack", "hugging face", "openai-style", "jwt")
URL_SHAPES = ("url user-info", "url token as user")
# environment variables the recorded environment allows (their values are redacted) and ones it never records
ALLOWED_VARS = ("NCCL_SOCKET_IFNAME", "NCCL_PLANTED", "CUDA_PLANTED", "NVTE_PLANTED", "TORCH_PLANTED", "OMP_PLANTED",
                "SLURM_JOB_NAME", "SLURM_JOB_ID", "SLURM_JOB_NODELIST")
OTHER_VARS = ("DATABASE_URL", "PGPASSWORD", "HTTP_HEADERS", "GITHUB_TOKEN", "HF_TOKEN", "AWS_ACCESS_KEY_ID",
              "NCCL_PASSWORD", "MOE_AUTOTUNE_RAY_ADDRESS", "MY_SETTINGS_JSON")


def _secret(shape: str, seed: int, slot: str) -> Secret:
    """A secret of `shape` for one planting slot: the slot and shape seed it too, so no two needles coincide."""
    return SHAPES[shape](random.Random(f"{slot}|{shape}|{seed}"))


@dataclass
class Planted:
    environment: dict[str, Secret]
    ray_address: Secret  # a Ray address's user-info: given as `sweep --ray-address` or as the spec's field
    ray_on_command_line: bool
    trainer_module: Secret  # a free-text spec field (no spaces or shell characters allowed there)
    tracking_user_info: Secret | None = None  # only with a server: the tracking URI's password

    def all(self) -> list[Secret]:
        out = [*self.environment.values(), self.ray_address, self.trainer_module]
        return out + ([self.tracking_user_info] if self.tracking_user_info else [])


@st.composite
def planted(draw, with_server: bool = False) -> Planted:
    seeds = st.integers(0, 2 ** 63)
    environment = {}
    # every shape at least once, in an allowed variable (redacted) or one never recorded, then the drawn ones
    for i, shape in enumerate(SHAPES):
        names = ALLOWED_VARS if i % 2 == 0 else OTHER_VARS
        name = names[i // 2 % len(names)]
        name = name if name not in environment else f"{name}_{i}"
        environment[name] = _secret(shape, draw(seeds), name)
    for name in ALLOWED_VARS + OTHER_VARS:
        if name not in environment or draw(st.booleans()):
            environment[name] = _secret(draw(st.sampled_from(sorted(SHAPES))), draw(seeds), name)
    environment["MOE_AUTOTUNE_RAY_ADDRESS"] = _secret(draw(st.sampled_from(URL_SHAPES)), draw(seeds), "ray tag")
    ray = _secret("url user-info", draw(seeds), "--ray-address")
    ray = Secret(f"ray://carol:{ray.needle}@head.example.com:10001", ray.needle, "ray address user-info")
    module = _secret(draw(st.sampled_from(PLAIN_SHAPES)), draw(seeds), "trainer_module")
    tracking = _secret("url user-info", draw(seeds), "--tracking-uri") if with_server else None
    return Planted(environment, ray, draw(st.booleans()), module, tracking)


@dataclass(frozen=True)
class Ran:
    """One command as the user saw it."""
    command: str
    code: int
    stdout: str
    stderr: str


def in_processes(folder: Path, planted_env: dict[str, str], args: tuple[str, ...]) -> Ran:
    """The command as a process of its own (the slow lane: as a user runs it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "COLUMNS": "400", **planted_env}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", "orchestrator.commands.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    return Ran(" ".join(args[:2]), done.returncode, done.stdout, done.stderr)


@contextmanager
def _planted_environment(folder: Path, planted_env: dict[str, str]) -> Iterator[None]:
    """This process's environment and working directory as a fresh CLI process would have them."""
    saved, cwd = dict(os.environ), os.getcwd()
    os.environ.update(planted_env)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def in_this_process(capfd) -> Callable[[Path, dict[str, str], tuple[str, ...]], Ran]:
    """The command through the CLI's entry point in this process, its file descriptors captured (the fast lane:
    the same code without a process start per command)."""
    from orchestrator.commands.cli import main

    def run(folder: Path, planted_env: dict[str, str], args: tuple[str, ...]) -> Ran:
        with _planted_environment(folder, planted_env):
            capfd.readouterr()
            code = main(list(args))
            out, err = capfd.readouterr()
        return Ran(" ".join(args[:2]), code, out, err)
    return run


def _with_user_info(uri: str, password: str) -> str:
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://bob:{password}@{rest}"


def run_and_search(folder: Path, plant: Planted, run: Callable[[Path, dict[str, str], tuple[str, ...]], Ran],
                   server_uri: str | None = None) -> None:
    """Plant, run sweep, promote, export and report, then search everything written and printed."""
    storage = f"sqlite:///{folder / 'optuna.db'}"
    tracking = f"sqlite:///{folder / 'mlflow.db'}" if server_uri is None else \
        _with_user_info(server_uri, plant.tracking_user_info.needle)
    data = spec_data(folder, "planted", budget={"n_trials": 3}, storage=storage, tracking_uri=tracking,
                     trainer_module=plant.trainer_module.text, gpus_per_node=8, seq_len=512)
    ray = ("--ray-address", plant.ray_address.text) if plant.ray_on_command_line else ()
    if not plant.ray_on_command_line:
        data["ray_address"] = plant.ray_address.text
    (folder / INPUTS).mkdir()
    spec = write_spec(folder / INPUTS / "spec.json", data)  # the user's own input: not searched
    env = {name: secret.text for name, secret in plant.environment.items()}
    common = ("--storage", storage, "--tracking-uri", tracking)
    runs = [run(folder, env, ("sweep", str(spec), "--quiet", *ray)),
            run(folder, env, ("promote", "planted", *common, "--allow-estimated")),
            run(folder, env, ("export", "planted", *common, "--allow-estimated", "--format", "sbatch")),
            run(folder, env, ("export", "planted", *common, "--allow-estimated", "--format", "bridge-yaml")),
            run(folder, env, ("report", "planted", *common, "--out", str(folder / "report")))]
    for ran in runs:
        assert ran.code == 0, (ran.command, ran.stderr[-2000:])
    recorded = recorded_variables(env)
    assert recorded, "no variable of the environment was recorded: the search would prove little"
    texts = {f"{ran.command} {stream}": getattr(ran, stream) for ran in runs for stream in ("stdout", "stderr")}
    for path in folder.rglob("*"):
        if path.is_file() and INPUTS not in path.relative_to(folder).parts:
            texts[str(path.relative_to(folder))] = path.read_bytes().decode("latin-1")
    texts.update(_mlflow_texts(tracking, folder))
    assert any(name.endswith("environment.json") for name in texts), sorted(texts)
    leaks = [(s.shape, where) for s in plant.all() for where, text in texts.items()
             if s.needle in text or s.needle in "".join(text.split())]
    assert not leaks, f"secrets written or printed: {leaks[:10]}; first: {_around(plant, texts, *leaks[0])}"


def _around(plant: Planted, texts: dict[str, str], shape: str, where: str) -> str:
    """Where a leaked needle sits: 200 characters around it, the needle itself shown as <NEEDLE>."""
    text = texts[where]
    for secret in plant.all():
        at = text.find(secret.needle) if secret.shape == shape else -1
        if at >= 0:
            return text[max(0, at - 200):at + 200].replace(secret.needle, "<NEEDLE>")
    return "(found with whitespace removed)"


def _mlflow_texts(tracking: str, folder: Path) -> dict[str, str]:
    """Every param and tag of every run, every artifact (downloaded), every model's and version's tags."""
    client = MlflowClient(tracking)
    out = {}
    for exp in client.search_experiments():
        out[f"experiment {exp.name} tags"] = json.dumps(exp.tags)
        for run in client.search_runs([exp.experiment_id], max_results=5000):
            out[f"run {run.info.run_id} params"] = json.dumps(run.data.params)
            out[f"run {run.info.run_id} tags"] = json.dumps(run.data.tags)
            # its artifacts, as a reader gets them (their files under the folder are searched byte for byte too)
            target = Path(tempfile.mkdtemp(dir=folder, prefix="downloaded-"))
            for path in Path(client.download_artifacts(run.info.run_id, "", str(target))).rglob("*"):
                if path.is_file():
                    out[f"run {run.info.run_id} artifact {path.relative_to(target)}"] = \
                        path.read_bytes().decode("latin-1")
    for model in client.search_registered_models():
        out[f"model {model.name}"] = json.dumps(model.tags)
        for version in client.search_model_versions(f"name='{model.name}'"):
            out[f"model {model.name} v{version.version}"] = json.dumps(version.tags) + str(version.source)
    return out


# ---- redaction alone: every shape, anywhere in a string --------------------------------------------------------
@settings(max_examples=max(50, settings.default.max_examples), deadline=None)
@given(shape=st.sampled_from(sorted(SHAPES)), seed=st.integers(0, 2 ** 63),
       before=st.text(alphabet=ALNUM + " =:,\n", max_size=20), after=st.text(alphabet=" ,;\n", max_size=5))
def test_redaction_masks_every_shape_wherever_it_sits(shape, seed, before, after):
    secret = _secret(shape, seed, "text")
    for text in (secret.text, f"{before} {secret.text}{after}", json.dumps({"value": secret.text})):
        assert secret.needle not in redact_text(text), (shape, text, redact_text(text))


@settings(max_examples=max(20, settings.default.max_examples // 3), deadline=None)
@given(plant=planted())
def test_the_recorded_environment_holds_no_secret(plant):
    env = {name: secret.text for name, secret in plant.environment.items()}
    blob = json.dumps(recorded_variables(env))
    assert not [s.shape for s in plant.environment.values() if s.needle in blob], blob
    assert not {"DATABASE_URL", "PGPASSWORD", "GITHUB_TOKEN", "NCCL_PASSWORD"} & set(recorded_variables(env))


# ---- end to end ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(1800)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), phases=E2E_PHASES)
@given(plant=planted())
def test_planted_secrets_reach_no_output_file_artifact_or_store(plant, capfd):
    with tempfile.TemporaryDirectory(prefix="secrets-") as tmp:
        run_and_search(Path(tmp), plant, in_this_process(capfd))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_planted_secrets_with_a_tracking_server_reached_through_user_info(tmp_path):
    from tests.mlflow_server import MlflowServer

    @settings(max_examples=SERVER_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              phases=E2E_PHASES)
    @given(plant=planted(with_server=True))
    def one(plant):
        folder = Path(tempfile.mkdtemp(dir=tmp_path, prefix="example-"))
        with MlflowServer(folder / "server") as server:
            run_and_search(folder, plant, in_processes, server.uri)

    one()
