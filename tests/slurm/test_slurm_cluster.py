"""The Slurm path against a real Slurm: Debian's slurmctld + slurmd as an emulated 4-node cluster
(slurm/ci-cluster.sh), the real batch template, a real Ray cluster across the allocation's nodes, and real
Megatron-Core CPU trials spanning 2 nodes (one torchrun per node)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MOE_AUTOTUNE = str(Path(sys.executable).with_name("moe-autotune"))

# one emulated cluster for the run: its tests share one xdist worker (scripts/test.sh: --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.xdist_group("slurm")]


@pytest.fixture(scope="module")
def slurm():
    """A running Slurm: the emulated cluster (started here when we may), or the one SLURM_CONF points at."""
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch not on PATH: install slurmctld slurmd slurm-client munge (scripts/setup.sh does)")
    local_conf = REPO / ".slurm-cluster" / "slurm.conf"
    if "SLURM_CONF" not in os.environ and os.geteuid() == 0:
        subprocess.run(["bash", str(REPO / "slurm" / "ci-cluster.sh"), "start"], check=True, timeout=120)
        os.environ["SLURM_CONF"] = str(local_conf)
    assert _idle_nodes() >= 2, "the Slurm tests need at least 2 idle nodes"
    return os.environ.get("SLURM_CONF")


def _idle_nodes() -> int:
    out = subprocess.run(["sinfo", "-h", "-t", "idle", "-o", "%D"], capture_output=True, text=True).stdout
    return sum(int(x) for x in out.split() if x.isdigit())


def _all_nodes() -> int:
    out = subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True).stdout
    return sum(int(x) for x in out.split() if x.isdigit())


def _wait_nodes_idle(timeout_s: float = 90.0) -> float:
    """Seconds until every node is idle again (the job's Ray steps did not linger in completing). The bound is the
    emulated cluster's KillWait (30 s: a step that outlives its job gets SIGTERM, then SIGKILL 30 s later) plus
    a loaded machine's slurmd round trips; 30 s alone failed once at the end of a full suite."""
    t0 = time.monotonic()
    while _idle_nodes() < _all_nodes():
        assert time.monotonic() - t0 < timeout_s, subprocess.run(
            ["sinfo", "-N", "-o", "%N %T"], capture_output=True, text=True).stdout
        time.sleep(0.5)
    return time.monotonic() - t0


def _submit(workdir: Path, spec: Path, *args: str, wait: bool = True, timeout: float = 600) -> str:
    argv = [MOE_AUTOTUNE, "slurm", "submit", str(spec), "--workdir", str(workdir), "--cpus-per-task", "1",
            *(["--wait"] if wait else []), *args]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    job_id = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    log = _job_log(workdir, job_id) if job_id else ""
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-3000:]}\n--- job log ---\n{log[-6000:]}"
    assert job_id.isdigit(), proc.stdout
    return job_id


def _job_log(workdir: Path, job_id: str) -> str:
    logs = list((workdir / "runs" / "slurm").glob(f"*-{job_id}.out"))
    return logs[0].read_text(errors="replace") if logs else ""


def _write_spec(tmp_path: Path, name: str, n_trials: int) -> Path:
    # 2 nodes x 1 "GPU" (one CPU rank per node): every trial is one torchrun on each of 2 Slurm nodes.
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"""\
name: {name}
model: tiny-moe
seq_len: 128
gpu: cpu
nodes: 2
gpus_per_node: 1
gbs: 4
fixed: {{precision: fp32, cuda_graphs: none, optimizer_offload: 0, dispatcher: alltoall, recompute: none, mbs: 1}}
free: [tp, ep, pp]
budget: {{n_trials: {n_trials}, max_concurrent: 1}}
steps: 2
warmup: 1
trial_timeout_s: 240
seed: 1
storage: sqlite:///{tmp_path}/optuna.db
tracking_uri: sqlite:///{tmp_path}/mlflow.db
workdir: {tmp_path}/runs
""")
    return spec


def _multinode_rendezvous_missing() -> str | None:
    """Two torchruns on one host (the emulated nodes) need the rendezvous host named explicitly."""
    from search_spaces.layouts.layout import Layout

    from orchestrator.dispatch.base import TrialRequest
    from orchestrator.dispatch.trainer_process import trainer_argv

    request = TrialRequest(layout=Layout(ep=2), model="tiny-moe", seq_len=128, gpu="cpu", num_gpus=2, nodes=2,
                           gpus_per_node=1, steps=2, warmup=1, timeout_s=60, workdir=Path("."), trial_number=0)
    argv = trainer_argv(request, "trainers.megatron_moe", "torchrun", Path("r.json"), 0, "10.0.0.1:1234")
    if not any("is_host" in a for a in argv):
        return ("orchestrator/dispatch/trainer_process.py trainer_argv does not pass `--rdzv-conf is_host=1|0`: on a "
                "host whose name does not resolve to its Ray node IP no torchrun hosts the c10d store (requested)")
    return None


def _study(tmp_path: Path, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/optuna.db")


@pytest.mark.timeout(300)
def test_ray_cluster_on_two_slurm_nodes(slurm, tmp_path):
    spec = _write_spec(tmp_path, "ray-check", 1)
    t0 = time.monotonic()
    job_id = _submit(tmp_path, spec, "--ray-check", timeout=280)
    wall = time.monotonic() - t0
    log = _job_log(tmp_path, job_id)
    check = json.loads(next(ln for ln in log.splitlines() if ln.startswith("ray-check "))[len("ray-check "):])
    # one Ray node per Slurm node, each answering from its own slurmd
    assert len(check["nodes"]) == 2 and len(set(check["nodes"].values())) == 2, check
    assert check["resources"]["fake_gpu"] == 2.0
    assert check["resources"]["CPU"] >= 2.0
    idle_after = _wait_nodes_idle()
    up = float(log.split("Ray cluster of 2 node(s) up after ")[1].split(" s")[0])
    print(f"ray-check job {job_id}: {wall:.1f} s end to end, Ray up after {up:.1f} s, idle {idle_after:.1f} s after")


@pytest.mark.timeout(600)
def test_sweep_job_runs_two_node_trials_and_tags_mlflow(slurm, tmp_path):
    missing = _multinode_rendezvous_missing()
    if missing:
        pytest.skip(missing)
    from mlflow.tracking import MlflowClient

    spec = _write_spec(tmp_path, "slurm-e2e", 2)
    t0 = time.monotonic()
    job_id = _submit(tmp_path, spec, timeout=580)
    wall = time.monotonic() - t0
    _wait_nodes_idle()

    study = _study(tmp_path, "slurm-e2e")
    measured = [t for t in study.trials if t.state.name == "COMPLETE" and t.user_attrs.get("status") == "ok"]
    assert len(measured) == 2, [(t.number, t.state.name, t.user_attrs.get("status"), t.user_attrs.get("reason"))
                                for t in study.trials]
    for t in measured:
        trial_dir = tmp_path / "runs" / "slurm-e2e" / f"trial-{t.number:04d}"
        commands = json.loads((trial_dir / "command.json").read_text())
        # one torchrun per node, node ranks 0 and 1, a shared rendezvous
        assert len(commands) == 2
        ranks = sorted(c[c.index("--node-rank") + 1] for c in commands)
        assert ranks == ["0", "1"] and all(c[c.index("--nnodes") + 1] == "2" for c in commands)
        assert len({c[c.index("--rdzv-endpoint") + 1] for c in commands}) == 1
        assert t.user_attrs["result"]["tokens_per_sec_per_gpu"] > 0

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.tags["slurm_job_id"] == job_id
    head_address = _job_log(tmp_path, job_id).split("Ray head ")[1].split()[2]
    assert parent.data.tags["ray_address"] == head_address
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    numbers = sorted(int(r.data.tags["optuna_trial_number"]) for r in children
                     if r.data.tags.get("status") == "ok")
    assert numbers == sorted(t.number for t in measured)
    print(f"sweep job {job_id}: 2 two-node trials, {wall:.1f} s end to end")


@pytest.mark.timeout(900)
def test_cancelled_sweep_resumes_in_a_new_job(slurm, tmp_path):
    missing = _multinode_rendezvous_missing()
    if missing:
        pytest.skip(missing)
    from mlflow.tracking import MlflowClient

    n_trials = 2
    spec = _write_spec(tmp_path, "slurm-resume", n_trials)
    first = _submit(tmp_path, spec, wait=False)
    # cancel while the second trial runs, after the first has a result
    deadline = time.monotonic() + 420
    interrupted = None
    while interrupted is None:
        assert time.monotonic() < deadline, _job_log(tmp_path, first)[-4000:]
        time.sleep(2)
        try:
            trials = _study(tmp_path, "slurm-resume").trials
        except Exception:  # noqa: BLE001 -- study not created yet
            continue
        done = [t for t in trials if t.state.name == "COMPLETE" and t.user_attrs.get("status") == "ok"]
        running = [t for t in trials if t.state.name == "RUNNING" and t.user_attrs.get("layout_key")]
        if done and running:
            interrupted = running[0]
    subprocess.run(["scancel", first], check=True)
    t0 = time.monotonic()
    while subprocess.run(["squeue", "-h", "-j", first], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() - t0 < 60, "cancelled job did not end"
        time.sleep(0.5)
    _wait_nodes_idle()
    # no trainer of the cancelled job survives it
    time.sleep(2)
    leftovers = subprocess.run(["pgrep", "-f", f"{tmp_path}/runs"], capture_output=True, text=True).stdout
    assert not leftovers.strip(), leftovers

    second = _submit(tmp_path, spec, "--resume", timeout=600)
    _wait_nodes_idle()

    study = _study(tmp_path, "slurm-resume")
    measured = [t for t in study.trials if t.state.name == "COMPLETE" and t.user_attrs.get("status") == "ok"]
    keys = [t.user_attrs["layout_key"] for t in measured]
    # the budget is met exactly: the trial finished before the cancel is kept (not re-run), nothing is
    # measured twice
    assert len(measured) == n_trials and len(set(keys)) == n_trials, keys
    assert done[0].number in [t.number for t in measured]
    # the interrupted trial keeps its record, is not counted, and is re-run at most once
    assert study.trials[interrupted.number].state.name == "FAIL"
    assert study.trials[interrupted.number].user_attrs.get("reason")
    assert len([t for t in study.trials if t.user_attrs.get("retry_of") == interrupted.number]) <= 1

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.tags["slurm_job_id"] == second
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    ok_numbers = [int(r.data.tags["optuna_trial_number"]) for r in children if r.data.tags.get("status") == "ok"]
    assert sorted(ok_numbers) == sorted(t.number for t in measured)  # one MLflow result per counted trial
    assert interrupted.number not in ok_numbers
    print(f"cancelled job {first} at trial {interrupted.number}, resumed in job {second}")


@pytest.mark.timeout(240)
def test_wait_returns_the_jobs_exit_code(slurm, tmp_path):
    spec = _write_spec(tmp_path, "bad-venv", 1)
    argv = [MOE_AUTOTUNE, "slurm", "submit", str(spec), "--workdir", str(tmp_path), "--cpus-per-task", "1",
            "--venv", str(tmp_path / "no-such-venv"), "--wait"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stderr
    assert proc.returncode == 2  # the batch script's own "cannot source" exit code
    assert "cannot source" in _job_log(tmp_path, job_id)
    _wait_nodes_idle()
