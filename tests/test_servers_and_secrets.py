"""Servers we start listen on 127.0.0.1 (or are not started); secrets in the environment never reach MLflow."""

from __future__ import annotations

import os
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

    from orchestrator.backends.local import LocalRayBackend
    from orchestrator.spec import parse_spec

    spec = parse_spec({"name": "ray-bind", "model": "tiny-moe", "gpu": "cpu", "gpus_per_node": 1, "seq_len": 128,
                       "gbs": 4, "backend": "local", "launcher": "python", "trainer_module": "tests.fake_trainer",
                       "storage": f"sqlite:///{tmp_path / 'o.db'}", "tracking_uri": "none",
                       "workdir": str(tmp_path / "runs")})
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
    from orchestrator.spec import parse_spec
    from tests.sweep_helpers import prior_for

    values = {name: f"s3cr3t-{secrets.token_hex(8)}" for name in SECRET_NAMES}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MOE_AUTOTUNE_HARMLESS", "visible-setting")  # the environment *is* recorded...
    monkeypatch.delenv("MOE_AUTOTUNE_TRAINER_MODULE", raising=False)
    spec = parse_spec({"name": "secrets", "model": "tiny-moe", "gpu": "cpu", "gpus_per_node": 1, "seq_len": 128,
                       "gbs": 4, "backend": "local", "launcher": "python", "trainer_module": "tests.fake_trainer",
                       "budget": {"n_trials": 2, "max_concurrent": 2}, "seed": 2, "steps": 2, "warmup": 1,
                       "fixed": {"precision": "fp32"}, "free": ["mbs", "recompute"],
                       "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
                       "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "workdir": str(tmp_path / "runs")})
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
