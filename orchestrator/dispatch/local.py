"""The real trainer through Ray: one Ray task per node runs torchrun in its own process tree.

A trial reserves its resources in Ray (GPUs on GPU clusters, CPU processes on CPU-only machines), so
several trials run at once when they fit. A multi-node trial reserves one bundle per node
(STRICT_SPREAD) and starts one torchrun per node with a shared c10d rendezvous at the first node.
A hang is killed with its whole process tree (status timeout); a lost Ray worker or node is retried once.

Every trial first waits for its placement group (one bundle per node, for single-node trials too), so that "never
started" and "started and hung" are told apart: a trial the cluster has not placed within `placement_timeout_s`
(counted while none of the sweep's own trials holds a placement and none asked before it still waits: queueing
behind them is no fault) is given up as
`unschedulable`; one that asks for more than the cluster has is refused before it waits (`unplaceable`). A stop
(`stop`, `close`: Ctrl-C, SIGTERM) ends every wait within POLL_S and each trial's process tree within STOP_GRACE_S.

What runs on each node (its argv, environment, process tree and the trial's result) is trainer_process.py; what is
asked of the Ray cluster beside the trials' tasks (what its nodes have, in words; a stop's cancel) is ray_cluster.py.
While a trial runs, its thread tails the steps its trainer reports (progress.jsonl in the trial folder, where the result
is read from too) into the trial's StepFeed, and a stop through that feed (the sweep's cannot-win rule) kills the trial
as a sweep's stop does and answers with a pruned result (steps.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from search_spaces.result import TrialResult

from orchestrator.dispatch.base import TrialRequest, stamp
from orchestrator.dispatch.ray_cluster import (
    alive_nodes,
    cancel_tasks,
    cluster_free,
    cluster_has,
    free_port_and_address,
    local_node,
    placeable_now,
    ray_env,
    refusal,
    trial_asks,
)
from orchestrator.dispatch.steps import PROGRESS_FILE, ProgressTail, StepFeed
from orchestrator.dispatch.trainer_process import run_process_tree, trainer_argv, trainer_env, trial_result
from orchestrator.errors import ClusterError

POLL_S = 0.2  # how often a trial's thread looks up from its waits (the sweep stopping, its placement)
STOPPED = "the sweep stopped before the trial ended"


class LocalRayBackend:
    name = "ray"
    reports_steps = True  # its trainers report each step (steps.py): submit takes a StepFeed

    def __init__(self, spec):
        self.spec = spec
        self.module = os.environ.get("MOE_AUTOTUNE_TRAINER_MODULE") or spec.trainer_module
        self.use_gpus = spec.gpu != "cpu"
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=spec.budget.max_concurrent,
                                                              thread_name_prefix="trial")
        self._started_ray = False
        self._stopping = threading.Event()  # set by stop(): every trial's wait ends, its tasks are cancelled
        self._placed = 0  # trials of this backend holding a placement now (their resources reserved)
        self._waiting: list[object] = []  # this backend's trials awaiting placement, in the order they asked
        self._lock = threading.Lock()
        if not spec.ray_address:
            self._refuse_before_start()
        self._init_ray()
        import ray
        self._run_node = ray.remote(max_retries=0)(run_process_tree)
        self._probe = ray.remote(max_retries=0)(free_port_and_address)

    def _local_cpus(self) -> int:
        """The logical CPUs a local Ray cluster advertises: CPU ranks mostly wait on gloo, so enough for
        max_concurrent trials."""
        return max(self.spec.gpus_per_node * self.spec.budget.max_concurrent, os.cpu_count() or 1)

    def _refuse_before_start(self) -> None:
        """A local cluster's one node is known before Ray starts (its start takes seconds on a small machine): a
        sweep whose smallest trial it cannot place is refused without it (the check once Ray runs is the same)."""
        node = local_node(self._local_cpus())
        if node is not None:
            reason = refusal([node], self.spec.smallest_trial[0], self._bundle(self.spec.smallest_trial[1]))
            if reason:
                raise ClusterError.no_trial(self.spec.name, reason)

    def _init_ray(self) -> None:
        ray_env()
        import ray
        if ray.is_initialized():
            return
        # Any: ray.init annotates logging_level as int, though it takes a level name too
        common: dict[str, Any] = {"log_to_driver": False, "configure_logging": True, "logging_level": "WARNING"}
        # ray.init takes SIGTERM over (its handler drains for up to 30 s, kills Ray's processes under the connected
        # driver, whose C++ side then prints stack lines, and exits 1): the command's own handler
        # (orchestrator/commands/interrupts.py) is put back, so that SIGTERM stops the sweep as Ctrl-C does. Not on a
        # cluster
        # joined by address (a Slurm job's): scancel sends SIGTERM to the driver and to every Ray node at once, and the
        # stop's calls to a cluster going away held the driver (and its lease) past the job's end; Ray's handler ends it
        previous = signal.getsignal(signal.SIGTERM)
        try:
            if self.spec.ray_address:
                ray.init(address=self.spec.ray_address, **common)
            else:
                ray.init(address="local", num_cpus=self._local_cpus(), include_dashboard=False,
                         _node_ip_address="127.0.0.1", **common)
        finally:
            own_cluster = not self.spec.ray_address
            if own_cluster and callable(previous) and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
        self._started_ray = True

    # ---- Backend ---------------------------------------------------------------------------------
    def submit(self, request: TrialRequest,
               feed: StepFeed | None = None) -> "concurrent.futures.Future[TrialResult]":
        """Run the trial in a thread of ours; `feed` gets its steps as they are reported, and stops it (pruned)."""
        return self._threads.submit(self._run_with_retry, request, feed)

    def stop(self) -> None:
        """The sweep stops (Ctrl-C, SIGTERM): trials still waiting are given up, running ones have their process
        trees killed (by their threads, at once: `close` waits for them)."""
        self._stopping.set()

    def close(self) -> None:
        self.stop()
        self._threads.shutdown(wait=True, cancel_futures=True)
        if self._started_ray and not self.spec.ray_address:
            import ray
            ray.shutdown()
            self._started_ray = False

    def unplaceable(self, nodes: int, gpus_per_node: int) -> str | None:
        """Why a trial of `nodes` x `gpus_per_node` can never be placed on this Ray cluster, or None when it can: it
        needs `nodes` distinct alive nodes, each with the resources of one of its bundles."""
        return refusal(alive_nodes(), nodes, self._bundle(gpus_per_node))

    def _bundle(self, gpus_per_node: int) -> dict[str, float]:
        """What one node of a trial reserves (its placement-group bundle)."""
        return {"GPU": gpus_per_node, "CPU": 1} if self.use_gpus else {"CPU": gpus_per_node}

    # ---- one trial -------------------------------------------------------------------------------
    def _run_with_retry(self, request: TrialRequest, feed: StepFeed | None = None) -> TrialResult:
        import ray.exceptions as rex
        infra = (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.ObjectLostError,
                 rex.OwnerDiedError, rex.RaySystemError)
        errors: list[str] = []
        for attempt in range(2):  # infrastructure failures: retried once
            try:
                result = self._run_once(request, attempt, feed)
                result.extra["attempts"] = attempt + 1
                if errors:
                    result.extra["infrastructure_errors"] = errors
                return stamp(result, request)
            except infra as exc:
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return stamp(TrialResult(status="interrupted", error="Ray infrastructure failed twice: " + " | ".join(errors),
                                 extra={"attempts": 2}), request)

    def _run_once(self, request: TrialRequest, attempt: int, feed: StepFeed | None = None) -> TrialResult:
        from ray.util.placement_group import placement_group, remove_placement_group

        trial_dir = Path(request.workdir).resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        result_path = trial_dir / "result.json"
        result_path.unlink(missing_ok=True)
        (trial_dir / PROGRESS_FILE).unlink(missing_ok=True)  # a retry's steps are its own
        # one bundle per node (a multi-node trial's on distinct nodes): placed before anything starts
        pg = placement_group([self._bundle(request.gpus_per_node)] * request.nodes,
                             strategy="STRICT_SPREAD" if request.nodes > 1 else "PACK")
        try:
            unplaced = self._await_placement(pg, request)
            if unplaced is not None:
                return unplaced
            with self._holding():
                launched = time.monotonic()
                commands, refs = self._launch(request, pg, result_path, trial_dir)
                watch = _Watch(feed, ProgressTail(trial_dir / PROGRESS_FILE)) if feed is not None else None
                nodes = self._await_nodes(refs, request, watch)
        finally:
            remove_placement_group(pg)
        if nodes is None and feed is not None and feed.stop_reason and not self._stopping.is_set():
            return feed.pruned(time.monotonic() - launched)  # the sweep stopped it: cannot win
        if nodes is None:
            return TrialResult(status="interrupted", error=STOPPED)
        return trial_result(request, result_path, nodes, commands)

    def _await_placement(self, pg, request: TrialRequest) -> TrialResult | None:
        """None once the trial's bundles are reserved; else its result: unschedulable after placement_timeout_s of
        waiting while none of this backend's trials held a placement or was ahead of it in the queue (queueing
        behind them is no fault of the cluster's) and the cluster's free resources could not place it (Ray's own
        latency is not either), interrupted when the sweep stops first."""
        import ray

        ready, bound, waited, turn = pg.ready(), self.spec.placement_timeout_s, 0.0, object()
        bundle = self._bundle(request.gpus_per_node)
        with self._lock:
            self._waiting.append(turn)
        try:
            while not self._stopping.is_set():
                began = time.monotonic()
                done, _ = ray.wait([ready], timeout=POLL_S)
                if done:
                    return None
                if self._cluster_is_to_blame(turn) and not placeable_now(request.nodes, bundle):
                    waited += time.monotonic() - began
                if waited >= bound:
                    asks = trial_asks(request.nodes, bundle)
                    return TrialResult(status="unschedulable", error=(
                        f"not placed within placement_timeout_s ({bound:g} s), never started: a trial asks for "
                        f"{asks}; the Ray cluster has {cluster_has(alive_nodes())}, {cluster_free()}"))
            return TrialResult(status="interrupted", error=STOPPED)
        finally:
            with self._lock:
                self._waiting.remove(turn)

    def _cluster_is_to_blame(self, turn: object) -> bool:
        """Does this wait count against the cluster: none of the sweep's trials holds a placement, and none that
        asked earlier still waits for one (a loaded machine can take over a second to place the first)?"""
        with self._lock:
            return not self._placed and self._waiting[0] is turn

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """The trial holds its placement (counted: the others' placement clocks stand still meanwhile)."""
        with self._lock:
            self._placed += 1
        try:
            yield
        finally:
            with self._lock:
                self._placed -= 1

    def _launch(self, request: TrialRequest, pg, result_path: Path, trial_dir: Path) -> tuple[list[list[str]], list]:
        """One task per node in its bundle (a multi-node trial's nodes meet at the first one's rendezvous); the
        commands are written to command.json."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        env = trainer_env(request)
        per_node = {"num_gpus": request.gpus_per_node} if self.use_gpus else {"num_cpus": request.gpus_per_node}
        rdzv = None
        if request.nodes > 1:
            first = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
            addr, port = ray.get(self._probe.options(num_cpus=0, scheduling_strategy=first).remote())
            rdzv = f"{addr}:{port}"
        commands: list[list[str]] = []
        refs = []
        for rank in range(request.nodes):
            argv = trainer_argv(request, self.module, self.spec.launcher, result_path, rank, rdzv)
            commands.append(argv)
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=rank)
            refs.append(self._run_node.options(scheduling_strategy=strategy, **per_node).remote(
                argv, env, os.getcwd(), str(trial_dir / f"node-{rank}.log"), request.timeout_s))
        (trial_dir / "command.json").write_text(json.dumps(commands, indent=1))
        return commands, refs

    def _await_nodes(self, refs: list, request: TrialRequest, watch: "_Watch | None" = None) -> list[dict] | None:
        """Each node's report (run_process_tree's); None when the sweep stopped first, or stopped this trial through
        its feed (the tasks interrupted, their trees killed). A task kills its own tree at timeout_s: the 120 s more
        are the net for a lost one. `watch`: the trial's progress file is read into its feed at every look."""
        import ray

        deadline = time.monotonic() + request.timeout_s + 120
        pending = list(refs)
        while pending:
            if watch is not None:
                watch.feed.put(watch.tail.read())
            if self._stopping.is_set() or (watch is not None and watch.feed.stop_reason):
                cancel_tasks(refs)
                return None
            if time.monotonic() > deadline:
                for ref in refs:
                    ray.cancel(ref, force=True)
                return [{"returncode": None, "timed_out": True, "log_tail": "", "wall_time_s": None}]
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        if watch is not None:  # the last steps, written before the trainer ended
            watch.feed.put(watch.tail.read())
        return ray.get(refs)


@dataclass(frozen=True)
class _Watch:
    """A running trial's feed and the progress file it is filled from."""
    feed: StepFeed
    tail: ProgressTail
