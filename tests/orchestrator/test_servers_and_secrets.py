"""Servers we start listen on 127.0.0.1 (or are not started); secrets in the environment never reach MLflow."""

from __future__ import annotations

import secrets
from pathlib import Path

import psutil
import pytest

LOOPBACK = ("127.0.0.1", "::1")


def _listening(procs) -> list[tuple[int, str, str, int]]:
    found = []
    for proc in procs:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((proc.pid, proc.name(), conn.laddr.ip, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.slow  # end to end, over ~3 s: the full suite runs it, the fast lane does not (issue 33)
@pytest.mark.timeout(300)
def test_mlflow_server_helper_listens_on_loopback_only(tmp_path):
    from tests.mlflow_server import MlflowServer

    with MlflowServer(tmp_path / "mlflow") as server:
        assert server.uri.startswith("http://127.0.0.1:")
        tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        sockets = _listening(tree)
        assert any(port == server.port for _, _, _, port in sockets), sockets
        exposed = [s for s in sockets if s[2] not in LOOPBACK]
        assert not exposed, f"the MLflow server listens beyond loopback: {exposed}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_local_ray_runs_without_a_dashboard(tmp_path, monkeypatch):
    """Ray's GCS/raylet listen on the host's address (Ray turns 127.0.0.1 into the routable IP on purpose);
    the dashboard, the one HTTP server that runs jobs, must not be started at all."""
    import ray

    from orchestrator.dispatch.local import LocalRayBackend
    from tests.sweep_helpers import FAKE_TRAINER, make_spec

    spec = make_spec(tmp_path, "ray-bind", **FAKE_TRAINER, gpus_per_node=1, seq_len=128, gbs=4, tracking_uri="none")
    assert not ray.is_initialized()
    backend = LocalRayBackend(spec)
    try:
        node = ray._private.worker.global_worker.node
        assert not node.address_info.get("webui_url"), "the Ray dashboard was started"
        ours = psutil.Process().children(recursive=True)
        # include_dashboard=False still runs dashboard.py --minimal (GCS bookkeeping): it must serve nothing
        heads = [p for p in ours if p.is_running() and "dashboard/dashboard.py" in " ".join(p.cmdline())]
        for head in heads:
            assert "--minimal" in head.cmdline(), "the full Ray dashboard was started"
        assert not _listening(heads), f"the Ray dashboard listens: {_listening(heads)}"
        http = [s for s in _listening(ours) if s[3] in (8265, 8266)]
        assert not http, f"something listens on the dashboard ports: {http}"
        # and it is our own private instance, not someone else's cluster on this machine
        assert any("gcs_server" in p.name() for p in ours if p.is_running()), \
            "joined a Ray cluster that this sweep did not start"
    finally:
        backend.close()


SECRET_NAMES = ("MOE_AUTOTUNE_HF_TOKEN", "MOE_AUTOTUNE_API_KEY", "MLFLOW_TEST_SECRET", "RAY_TEST_PASSWORD",
                "NCCL_TEST_SECRET_KEY", "HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_DB_PASSWORD")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_secret_looking_environment_never_reaches_mlflow(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from orchestrator.sweep import run_sweep
    from tests.sweep_helpers import FAKE_TRAINER, make_spec, prior_for

    values = {name: f"s3cr3t-{secrets.token_hex(8)}" for name in SECRET_NAMES}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NCCL_DEBUG", "visible-setting")  # the (allowed) environment *is* recorded...
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    spec = make_spec(tmp_path, "secrets", **{**FAKE_TRAINER, "gpus_per_node": 1, "seq_len": 128, "gbs": 4,
                                             "budget": {"n_trials": 2, "max_concurrent": 2}, "seed": 2, "steps": 2,
                                             "free": ["mbs", "recompute"]})
    outcome = run_sweep(spec, prior=prior_for(spec), show_progress=False)
    assert outcome.n_measured == 2

    client = MlflowClient(spec.tracking_uri)
    exp = client.get_experiment_by_name("secrets")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    assert len(runs) >= 3  # parent + one child per trial
    texts: list[str] = []
    for run in runs:
        texts += [f"{k}={v}" for k, v in run.data.params.items()]
        texts += [f"{k}={v}" for k, v in run.data.tags.items()]
        texts += list(run.data.metrics)
        folder = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts" / run.info.run_id)))
        for path in folder.rglob("*"):
            if path.is_file():
                texts.append(path.read_text(errors="replace"))
    blob = "\n".join(texts)
    assert "visible-setting" in blob, "the environment is not recorded at all: this test would prove nothing"
    leaked = [name for name, value in values.items() if value in blob]
    assert not leaked, f"secret values logged to MLflow: {leaked}"

    # the Optuna storage (read by promote/report/export) must not carry them either
    attrs = [str(outcome.study.user_attrs)] + [str(t.user_attrs) for t in outcome.study.trials]
    leaked = [name for name, value in values.items() if any(value in a for a in attrs)]
    assert not leaked, f"secret values stored in Optuna: {leaked}"


# ---- secrets in URIs and in variables named like passwords (issue 15, item 7) -------------------------
URI_PASSWORD = "pw-" + secrets.token_hex(6)
ENV_SECRETS = {"MOE_AUTOTUNE_DB_PASSWD": "passwd-" + secrets.token_hex(6),
               "MOE_AUTOTUNE_DB_PWD": "pwd-" + secrets.token_hex(6),
               "RAY_TLS_PASSPHRASE": "phrase-" + secrets.token_hex(6),
               "NCCL_PROXY_PASS": "pass-" + secrets.token_hex(6),
               "MLFLOW_TRACKING_PASSWORD": "mlpw-" + secrets.token_hex(6)}


def _set_secret_environment(monkeypatch) -> list[str]:
    for name, value in ENV_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"https://alice:{URI_PASSWORD}@mlflow.example.com:5000/base")
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", f"https://:{URI_PASSWORD}x@registry.example.com/")  # password only
    monkeypatch.setenv("NCCL_DEBUG", "visible-setting")  # an allowed (tuning) variable
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", f"https://alice:{URI_PASSWORD}@x")  # allowed, its value redacted
    return [URI_PASSWORD, *ENV_SECRETS.values()]


def test_safe_environment_strips_passwords_from_names_and_uris(monkeypatch):
    from orchestrator.tracking.parent_run import safe_environment

    values = _set_secret_environment(monkeypatch)
    env = safe_environment()
    blob = repr(env)
    assert not [v for v in values if v in blob], env
    variables = env["variables"]
    assert variables["NCCL_DEBUG"] == "visible-setting"
    assert variables["NCCL_SOCKET_IFNAME"] == "https://***@x"
    assert "MLFLOW_TRACKING_URI" not in variables  # not on the allow-list at all


def test_spec_and_environment_logged_to_mlflow_carry_no_credentials(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from orchestrator.spec.schema import parse_spec
    from orchestrator.tracking.tracker import Tracker

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands in tmp_path
    values = _set_secret_environment(monkeypatch)
    spec = parse_spec({"name": "creds", "storage": f"postgresql://optuna:{URI_PASSWORD}@db.example.com:5432/optuna",
                       "tracking_uri": f"https://bob:{URI_PASSWORD}@mlflow.example.com/",
                       "ray_address": f"ray://carol:{URI_PASSWORD}@head:10001"})
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "creds", tmp_path / "spool.jsonl")
    run_id = tracker.start(spec.model_dump(mode="json"), "creds", resume=False)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    folder = Path(client.download_artifacts(run_id, "", str(tmp_path / "artifacts")))
    logged = {p.name: p.read_text() for p in folder.rglob("*.json")}
    assert {"spec.json", "environment.json"} <= set(logged)
    leaked = [v for v in values if any(v in text for text in logged.values())]
    assert not leaked, f"secret values logged to MLflow: {leaked}"
    assert "postgresql://***@db.example.com:5432/optuna" in logged["spec.json"]  # the URI is still useful
    assert "visible-setting" in logged["environment.json"]


def _cli_error(argv, capsys) -> str:
    from orchestrator.commands.cli import main

    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_error_lines_never_echo_storage_or_tracking_passwords(tmp_path, monkeypatch, capsys):
    import yaml

    from tests.mlflow_server import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    storage = f"postgresql://optuna:{URI_PASSWORD}@127.0.0.1:1/optuna"
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "creds", "model": "tiny-moe", "gpu": "h100", "seq_len": 1024, "gbs": 16,
                                    "backend": "analytic", "workdir": str(tmp_path / "runs"),
                                    "storage": f"sqlite:///{tmp_path / 'o.db'}", "tracking_uri": "none"}))
    lines = [_cli_error(["status", "--storage", storage], capsys),
             _cli_error(["sweep", str(spec), "--storage", storage], capsys),
             _cli_error(["sweep", str(spec), "--study-name", "creds2",
                         "--tracking-uri", f"http://bob:{URI_PASSWORD}@127.0.0.1:{free_port()}"], capsys)]
    assert "storage" in lines[0] and "127.0.0.1:1/optuna" in lines[0]
    assert not [ln for ln in lines if URI_PASSWORD in ln], lines


def test_study_errors_name_the_storage_without_its_password(monkeypatch):
    import optuna

    from search_spaces.errors import SpecError

    from orchestrator.records import queries
    from orchestrator.storage import studies

    memory = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=memory, study_name="there", directions=queries.DIRECTIONS)
    monkeypatch.setattr(studies, "open_storage", lambda url, attempts=10: memory)
    url = f"postgresql://optuna:{URI_PASSWORD}@db.example.com/optuna"
    for call in (lambda: studies.create_or_resume(memory, url, "there", None, resume=False),
                 lambda: studies.create_or_resume(memory, url, "absent", None, resume=True),
                 lambda: studies.load_study(url, "absent")):
        with pytest.raises(SpecError) as info:
            call()
        assert URI_PASSWORD not in str(info.value) and "db.example.com/optuna" in str(info.value)
