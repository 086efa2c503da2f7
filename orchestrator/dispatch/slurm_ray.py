"""Steps the Ray-on-Slurm batch script runs inside the job (`moe-autotune slurm wait-ray|ray-check|link-run`).

Each connects to the job's Ray cluster or stores; none starts anything on its own.
"""

from __future__ import annotations

import logging
import os
import time

from search_spaces.errors import SpecError

from orchestrator.redact import redact_uri


def _connect(ray_address: str):
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address=ray_address, logging_level=logging.ERROR, log_to_driver=False)
    return ray


def wait_for_nodes(ray_address: str, nodes: int, timeout_s: float) -> int:
    """Block until `nodes` Ray nodes are alive; returns how many are. Raises SpecError on timeout."""
    ray = _connect(ray_address)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = sum(1 for n in ray.nodes() if n.get("Alive"))
            if alive >= nodes or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        ray.shutdown()
    if alive < nodes:
        raise SpecError(f"only {alive} of {nodes} Ray nodes joined within {timeout_s:.0f} s")
    return alive


def ray_check(ray_address: str, nodes: int) -> dict:
    """One task pinned to every alive node; returns {node_ip_and_id: SLURMD_NODENAME}."""
    ray = _connect(ray_address)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        @ray.remote(num_cpus=0)
        def where() -> str:
            return os.environ.get("SLURMD_NODENAME", "?")

        alive = [n for n in ray.nodes() if n.get("Alive")]
        refs = {n["NodeID"][:8]: where.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote() for n in alive}
        seen = {node_id: ray.get(ref, timeout=120) for node_id, ref in refs.items()}
        resources = ray.cluster_resources()
    finally:
        ray.shutdown()
    if len(seen) < nodes:
        raise SpecError(f"Ray check: {len(seen)} nodes answered, expected {nodes}")
    return {"nodes": seen, "resources": resources}


def link_run(storage: str, study_name: str, tags: dict[str, str]) -> str | None:
    """Tag the study's MLflow parent run with the Slurm job and Ray address; returns the run id.

    A resumed study runs in several jobs: `slurm_job_ids` keeps them all, `slurm_job_id` the latest.
    """
    import optuna

    from orchestrator.records import StudyRecord
    from orchestrator.storage import open_mlflow
    from orchestrator.storage.studies import open_existing_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:  # both stores bounded (orchestrator/storage/connections.py): a server that does not answer is one line
        # a missing store is one line, never an empty one created in its place
        study = optuna.load_study(study_name=study_name, storage=open_existing_storage(storage))
    except KeyError:
        raise SpecError(f"no study {study_name!r} in {redact_uri(storage)}") from None
    context = StudyRecord.of(study)
    run_id, tracking_uri = context.mlflow_parent_run_id, context.tracking_uri
    if not run_id or not tracking_uri or not tags:  # no MLflow run recorded (tracking_uri none): nothing to tag
        return None
    client = open_mlflow(tracking_uri)
    run = client.get_run(run_id)
    job_ids = [j for j in run.data.tags.get("slurm_job_ids", "").split(",") if j]
    if tags.get("slurm_job_id") and tags["slurm_job_id"] not in job_ids:
        job_ids.append(tags["slurm_job_id"])
    for key, value in {**tags, "slurm_job_ids": ",".join(job_ids)}.items():
        client.set_tag(run_id, key, value)
    return run_id
