"""What the local backend asks of Ray beside its trials' tasks: Ray's environment, what the cluster's alive nodes have
(and so whether a trial can ever be placed there, in words a user reads), a free port for a multi-node trial's
rendezvous, and how a stopped trial's tasks are ended (orchestrator/dispatch/local.py)."""

from __future__ import annotations

import os
import socket
from collections import Counter

STOP_GRACE_S = 3.0  # a stopped trial's tasks are interrupted (their finally kills the tree), then forced after this


def ray_env() -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def cancel_tasks(refs: list) -> None:
    """Interrupt each task (a KeyboardInterrupt in its worker: run_process_tree's finally kills the process tree),
    then force those left after STOP_GRACE_S (the worker killed: its launcher dies with it and each rank with
    the launcher, PR_SET_PDEATHSIG: search_spaces/ownership.py)."""
    import ray

    for ref in refs:
        ray.cancel(ref)
    _, left = ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE_S)
    for ref in left:  # only those still running: forcing a finished one trips a check in Ray's core worker
        ray.cancel(ref, force=True)


def alive_nodes() -> list[dict[str, float]]:
    """The resources of each alive node of the Ray cluster."""
    import ray

    return [dict(node.get("Resources") or {}) for node in ray.nodes() if node.get("Alive")]


def local_node(num_cpus: int) -> dict[str, float] | None:
    """The resources a local Ray node started with `num_cpus` advertises (GPUs as Ray detects them), resolved as
    ray.init resolves them, without starting it; None where Ray's internal API differs (then only the check once
    Ray runs answers)."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        node = ResourceAndLabelSpec(num_cpus=num_cpus).resolve(is_head=True, node_ip_address="127.0.0.1")
        return {name: float(amount) for name, amount in node.to_resource_dict().items()}
    except Exception:  # noqa: BLE001 -- a private API of Ray's, read for speed only
        return None


def refusal(alive: list[dict[str, float]], nodes: int, bundle: dict[str, float]) -> str | None:
    """Why a trial of `nodes` bundles (on distinct nodes) can never be placed on nodes with the resources `alive`."""
    fitting = sum(1 for have in alive if all(have.get(name, 0.0) >= amount for name, amount in bundle.items()))
    if fitting >= nodes:
        return None
    return f"a trial asks for {trial_asks(nodes, bundle)}; the Ray cluster has {cluster_has(alive)}"


def _count(amount: float, noun: str) -> str:
    return f"{amount:g} {noun}{'' if amount == 1 else 's'}" if amount else f"no {noun}"


def trial_asks(nodes: int, bundle: dict[str, float]) -> str:
    """What a trial asks for: `1 node with 8 GPUs and 1 CPU`, `2 nodes, each with 4 CPUs`."""
    what = " and ".join(_count(amount, name) for name, amount in bundle.items())
    return f"1 node with {what}" if nodes == 1 else f"{nodes} nodes, each with {what}"


def cluster_has(alive: list[dict[str, float]]) -> str:
    """What the cluster has: `1 node with no GPU and 2 CPUs`, `3 nodes: 2 with 8 GPUs and 64 CPUs, 1 with ...`."""
    if not alive:
        return "no alive node"
    kinds = Counter((have.get("GPU", 0.0), have.get("CPU", 0.0)) for have in alive)
    each = [(n, f"{_count(gpus, 'GPU')} and {_count(cpus, 'CPU')}") for (gpus, cpus), n in kinds.items()]
    if len(each) == 1:
        return f"1 node with {each[0][1]}" if len(alive) == 1 else f"{len(alive)} nodes, each with {each[0][1]}"
    return f"{len(alive)} nodes: " + ", ".join(f"{n} with {what}" for n, what in each)


def placeable_now(nodes: int, bundle: dict[str, float]) -> bool:
    """Could the cluster's free resources place the trial now (then a wait is Ray's own placement latency, which a
    loaded machine stretches past a second, not a cluster too busy or too small)? Per node where Ray tells it, else
    on the cluster's total."""
    import ray

    try:
        from ray._private.state import available_resources_per_node

        free = list(available_resources_per_node().values())
    except Exception:  # noqa: BLE001 -- a private API of Ray's: the public total is the weaker fallback
        total = ray.available_resources()
        return all(total.get(name, 0.0) >= amount * nodes for name, amount in bundle.items())
    return refusal(free, nodes, bundle) is None


def cluster_free() -> str:
    """What the cluster has free now (GPUs and CPUs)."""
    import ray

    free = ray.available_resources()
    return f"{_count(free.get('GPU', 0.0), 'GPU')} and {_count(free.get('CPU', 0.0), 'CPU')} free now"


def free_port_and_address() -> tuple[str, int]:
    """This node's address and a free port on it (run as a Ray task on a multi-node trial's first node)."""
    import ray
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address(), port
