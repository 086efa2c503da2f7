"""The real trainer through Ray: one Ray task per node runs torchrun in its own process tree.

A trial reserves its resources in Ray (GPUs on GPU clusters, CPU processes on CPU-only machines), so
several trials run at once when they fit. A multi-node trial reserves one bundle per node
(STRICT_SPREAD) and starts one torchrun per node with a shared c10d rendezvous at the first node.
A hang is killed with its whole process tree (status timeout); a lost Ray worker or node is retried once.

Every trial first waits for its placement group (one bundle per node, for single-node trials too), so that "never
started" and "started and hung" are told apart: a trial the cluster has not placed within `placement_timeout_s`
(counted while none of the sweep's own trials holds a placement: queueing behind them is no fault) is given up as
`unschedulable`; one that asks for more than the cluster has is refused before it waits (`unplaceable`). A stop
(`stop`, `close`: Ctrl-C, SIGTERM) ends every wait within POLL_S and each trial's process tree within STOP_GRACE_S.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import psutil

from search_spaces import failures
from search_spaces.result import TrialResult

from orchestrator.dispatch.base import TrialRequest, stamp
from orchestrator.errors import ClusterError

# Passed from the orchestrator's environment into the trainer's (fault hooks, thread counts, ...).
_PASS_ENV_PREFIXES = ("MOE_AUTOTUNE_", "OMP_NUM_THREADS", "PYTHONPATH", "CUDA_", "NCCL_", "GLOO_")
_LOG_TAIL_CHARS = 4000
POLL_S = 0.2  # how often a trial's thread looks up from its waits (the sweep stopping, its placement)
STOP_GRACE_S = 3.0  # a stopped trial's tasks are interrupted (their finally kills the tree), then forced after this
STOPPED = "the sweep stopped before the trial ended"


def ray_env() -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


TRIAL_GPUS_ENV = "MOE_AUTOTUNE_TRIAL_GPUS"


def trainer_argv(request: TrialRequest, module: str, launcher: str, result_path: Path,
                 node_rank: int = 0, rdzv: str | None = None) -> list[str]:
    """The exact launch command of one node (argv list; never a shell string)."""
    args = request.layout.to_flags() + [
        "--model", request.model, "--seq-len", str(request.seq_len), "--gpu", request.gpu,
        "--steps", str(request.steps), "--warmup", str(request.warmup), "--result", str(result_path)]
    if request.num_layers:
        args += ["--num-layers", str(request.num_layers)]
    if request.hidden_size:
        args += ["--hidden-size", str(request.hidden_size)]
    if request.lengths:
        args += ["--lengths", request.lengths]
    if launcher == "python":
        return [sys.executable, "-m", module, *args]
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(request.gpus_per_node)]
    if request.nodes == 1:
        run += ["--standalone", "--nnodes", "1"]
    else:
        if rdzv is None:  # every node of a multi-node trial meets at the first one's endpoint
            raise ValueError(f"trial {request.trial_number} spans {request.nodes} nodes but has no rendezvous endpoint")
        run += ["--nnodes", str(request.nodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rdzv, "--rdzv-id", f"trial-{request.trial_number}",
                # the first node hosts the rendezvous store even when its hostname does not resolve to
                # the address Ray advertises (torchrun would otherwise guess from the hostname and wait)
                "--rdzv-conf", f"is_host={1 if node_rank == 0 else 0}"]
    return [*run, "-m", module, *args]


def run_process_tree(argv: list[str], env: dict[str, str], cwd: str, log_path: str,
                     timeout_s: float) -> dict[str, Any]:
    """Run argv in a new session; on timeout (or if we are interrupted) kill the whole group."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True, preexec_fn=_die_with_parent)
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(proc.pid)
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                _kill_tree(proc.pid)
                proc.wait()
            # ranks that escaped torchrun's wait still belong to the group
            _kill_tree(proc.pid)
    return {"returncode": rc, "timed_out": timed_out, "wall_time_s": time.monotonic() - start,
            "log_tail": _tail(log_path), "host": socket.gethostname()}


def _kill_tree(pid: int) -> None:
    """Kill the launcher's process group and every descendant: torchrun starts each rank in a session of its
    own, so killing the group alone would leave hung ranks behind as orphans."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    _kill_group(pid)
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent() -> None:
    """Linux: the launcher gets SIGKILL if the Ray worker that started it dies."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux's libc: no parent-death signal; the hang timeout still kills it
        return


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - _LOG_TAIL_CHARS))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _cancel(refs: list) -> None:
    """Interrupt each task (a KeyboardInterrupt in its worker: run_process_tree's finally kills the process tree),
    then force those left after STOP_GRACE_S (the worker killed: its launcher dies with it, PR_SET_PDEATHSIG)."""
    import ray

    for ref in refs:
        ray.cancel(ref)
    _, left = ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE_S)
    for ref in left:  # only those still running: forcing a finished one trips a check in Ray's core worker
        ray.cancel(ref, force=True)


def _alive_nodes() -> list[dict[str, float]]:
    """The resources of each alive node of the Ray cluster."""
    import ray

    return [dict(node.get("Resources") or {}) for node in ray.nodes() if node.get("Alive")]


def _local_node(num_cpus: int) -> dict[str, float] | None:
    """The resources a local Ray node started with `num_cpus` advertises (GPUs as Ray detects them), resolved as
    ray.init resolves them, without starting it; None where Ray's internal API differs (then only the check once
    Ray runs answers)."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        node = ResourceAndLabelSpec(num_cpus=num_cpus).resolve(is_head=True, node_ip_address="127.0.0.1")
        return {name: float(amount) for name, amount in node.to_resource_dict().items()}
    except Exception:  # noqa: BLE001 -- a private API of Ray's, read for speed only
        return None


def _refusal(alive: list[dict[str, float]], nodes: int, bundle: dict[str, float]) -> str | None:
    """Why a trial of `nodes` bundles (on distinct nodes) can never be placed on nodes with the resources `alive`."""
    fitting = sum(1 for have in alive if all(have.get(name, 0.0) >= amount for name, amount in bundle.items()))
    if fitting >= nodes:
        return None
    return f"a trial asks for {_asks(nodes, bundle)}; the Ray cluster has {_has(alive)}"


def _count(amount: float, noun: str) -> str:
    return f"{amount:g} {noun}{'' if amount == 1 else 's'}" if amount else f"no {noun}"


def _asks(nodes: int, bundle: dict[str, float]) -> str:
    """What a trial asks for: `1 node with 8 GPUs and 1 CPU`, `2 nodes, each with 4 CPUs`."""
    what = " and ".join(_count(amount, name) for name, amount in bundle.items())
    return f"1 node with {what}" if nodes == 1 else f"{nodes} nodes, each with {what}"


def _has(alive: list[dict[str, float]]) -> str:
    """What the cluster has: `1 node with no GPU and 2 CPUs`, `3 nodes: 2 with 8 GPUs and 64 CPUs, 1 with ...`."""
    if not alive:
        return "no alive node"
    kinds = Counter((have.get("GPU", 0.0), have.get("CPU", 0.0)) for have in alive)
    each = [(n, f"{_count(gpus, 'GPU')} and {_count(cpus, 'CPU')}") for (gpus, cpus), n in kinds.items()]
    if len(each) == 1:
        return f"1 node with {each[0][1]}" if len(alive) == 1 else f"{len(alive)} nodes, each with {each[0][1]}"
    return f"{len(alive)} nodes: " + ", ".join(f"{n} with {what}" for n, what in each)


def _free() -> str:
    import ray

    free = ray.available_resources()
    return f"{_count(free.get('GPU', 0.0), 'GPU')} and {_count(free.get('CPU', 0.0), 'CPU')} free now"


def _free_port_and_address() -> tuple[str, int]:
    import ray
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address(), port


class LocalRayBackend:
    name = "ray"

    def __init__(self, spec):
        self.spec = spec
        self.module = os.environ.get("MOE_AUTOTUNE_TRAINER_MODULE") or spec.trainer_module
        self.use_gpus = spec.gpu != "cpu"
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=spec.budget.max_concurrent,
                                                              thread_name_prefix="trial")
        self._started_ray = False
        self._stopping = threading.Event()  # set by stop(): every trial's wait ends, its tasks are cancelled
        self._placed = 0  # trials of this backend holding a placement now (their resources reserved)
        self._lock = threading.Lock()
        if not spec.ray_address:
            self._refuse_before_start()
        self._init_ray()
        import ray
        self._run_node = ray.remote(max_retries=0)(run_process_tree)
        self._probe = ray.remote(max_retries=0)(_free_port_and_address)

    def _local_cpus(self) -> int:
        """The logical CPUs a local Ray cluster advertises: CPU ranks mostly wait on gloo, so enough for
        max_concurrent trials."""
        return max(self.spec.gpus_per_node * self.spec.budget.max_concurrent, os.cpu_count() or 1)

    def _refuse_before_start(self) -> None:
        """A local cluster's one node is known before Ray starts (its start takes seconds on a small machine): a
        sweep whose smallest trial it cannot place is refused without it (the check once Ray runs is the same)."""
        node = _local_node(self._local_cpus())
        if node is not None:
            reason = _refusal([node], self.spec.smallest_trial[0], self._bundle(self.spec.smallest_trial[1]))
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
    def submit(self, request: TrialRequest) -> "concurrent.futures.Future[TrialResult]":
        return self._threads.submit(self._run_with_retry, request)

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
        return _refusal(_alive_nodes(), nodes, self._bundle(gpus_per_node))

    def _bundle(self, gpus_per_node: int) -> dict[str, float]:
        """What one node of a trial reserves (its placement-group bundle)."""
        return {"GPU": gpus_per_node, "CPU": 1} if self.use_gpus else {"CPU": gpus_per_node}

    # ---- one trial -------------------------------------------------------------------------------
    def _run_with_retry(self, request: TrialRequest) -> TrialResult:
        import ray.exceptions as rex
        infra = (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.ObjectLostError,
                 rex.OwnerDiedError, rex.RaySystemError)
        errors: list[str] = []
        for attempt in range(2):  # infrastructure failures: retried once
            try:
                result = self._run_once(request, attempt)
                result.extra["attempts"] = attempt + 1
                if errors:
                    result.extra["infrastructure_errors"] = errors
                return stamp(result, request)
            except infra as exc:
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return stamp(TrialResult(status="interrupted", error="Ray infrastructure failed twice: " + " | ".join(errors),
                                 extra={"attempts": 2}), request)

    def _run_once(self, request: TrialRequest, attempt: int) -> TrialResult:
        from ray.util.placement_group import placement_group, remove_placement_group

        trial_dir = Path(request.workdir).resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        result_path = trial_dir / "result.json"
        result_path.unlink(missing_ok=True)
        # one bundle per node (a multi-node trial's on distinct nodes): placed before anything starts
        pg = placement_group([self._bundle(request.gpus_per_node)] * request.nodes,
                             strategy="STRICT_SPREAD" if request.nodes > 1 else "PACK")
        try:
            unplaced = self._await_placement(pg, request)
            if unplaced is not None:
                return unplaced
            with self._holding():
                commands, refs = self._launch(request, pg, result_path, trial_dir)
                nodes = self._await_nodes(refs, request)
        finally:
            remove_placement_group(pg)
        if nodes is None:
            return TrialResult(status="interrupted", error=STOPPED)
        return self._result(request, result_path, nodes, commands)

    def _await_placement(self, pg, request: TrialRequest) -> TrialResult | None:
        """None once the trial's bundles are reserved; else its result: unschedulable after placement_timeout_s of
        waiting while none of this backend's trials held a placement (queueing behind them is no fault of the
        cluster's), interrupted when the sweep stops first."""
        import ray

        ready, bound, waited = pg.ready(), self.spec.placement_timeout_s, 0.0
        while not self._stopping.is_set():
            began = time.monotonic()
            done, _ = ray.wait([ready], timeout=POLL_S)
            if done:
                return None
            if not self._placed:
                waited += time.monotonic() - began
            if waited >= bound:
                asks = _asks(request.nodes, self._bundle(request.gpus_per_node))
                return TrialResult(status="unschedulable", error=(
                    f"not placed within placement_timeout_s ({bound:g} s), never started: a trial asks for {asks}; "
                    f"the Ray cluster has {_has(_alive_nodes())}, {_free()}"))
        return TrialResult(status="interrupted", error=STOPPED)

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

        env = self._env(request)
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

    def _await_nodes(self, refs: list, request: TrialRequest) -> list[dict] | None:
        """Each node's report (run_process_tree's); None when the sweep stopped first (the tasks interrupted, their
        trees killed). A task kills its own tree at timeout_s: the 120 s more are the net for a lost one."""
        import ray

        deadline = time.monotonic() + request.timeout_s + 120
        pending = list(refs)
        while pending:
            if self._stopping.is_set():
                _cancel(refs)
                return None
            if time.monotonic() > deadline:
                for ref in refs:
                    ray.cancel(ref, force=True)
                return [{"returncode": None, "timed_out": True, "log_tail": "", "wall_time_s": None}]
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        return ray.get(refs)

    def _result(self, request: TrialRequest, result_path: Path, nodes: list[dict], commands) -> TrialResult:
        tail = "\n".join(n.get("log_tail") or "" for n in nodes)[-_LOG_TAIL_CHARS:]
        info = {"command": commands[0] if len(commands) == 1 else commands,
                "returncodes": [n.get("returncode") for n in nodes], "log_tail": tail,
                "launch_wall_s": max((n.get("wall_time_s") or 0.0) for n in nodes)}
        if any(n.get("timed_out") for n in nodes):
            error = f"no result after {request.timeout_s:g} s; killed the whole process tree"
            return TrialResult(status="timeout", extra=info, error=error, failure_class="timeout",
                               failure_reason=error, wall_time_s=max((n.get("wall_time_s") or 0) for n in nodes))
        if result_path.is_file():
            try:
                result = TrialResult.read(result_path)
            except (ValueError, TypeError) as exc:
                return _root_cause(TrialResult(status="error", error=f"unreadable result file: {exc}", extra=info),
                                   result_path, nodes)
            keep = ("command", "launch_wall_s") if result.status == "ok" else tuple(info)
            result.extra.update({k: info[k] for k in keep})
            return _root_cause(result, result_path, nodes)
        rcs = [n.get("returncode") for n in nodes]
        last = next((ln for ln in reversed(tail.strip().splitlines()) if ln.strip()), "")
        return _root_cause(TrialResult(status="error", extra=info,
                                       error=f"trainer exited {rcs} without a result: {last[-300:]}",
                                       wall_time_s=max((n.get("wall_time_s") or 0) for n in nodes)),
                           result_path, nodes)

    def _env(self, request: TrialRequest) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k in ("RAY_AUTH_MODE",)}
        env.update({k: v for k, v in os.environ.items() if k.startswith(_PASS_ENV_PREFIXES)})
        env.setdefault("OMP_NUM_THREADS", "1")
        # the trainer module must import from where the orchestrator runs (tests, source checkouts)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
        # the GPUs the trial stands for: a trainer started with launcher "python" (one process per node, no
        # torchrun) learns the world its per-GPU figures are for from it
        env[TRIAL_GPUS_ENV] = str(request.num_gpus)
        env.update(request.env)
        return env


def _root_cause(result: TrialResult, result_path: Path, nodes: list[dict]) -> TrialResult:
    """A failed trial's root cause, once its process tree has ended (search_spaces/failures.py): every rank's
    failure record, every node log (gloo and NCCL aborts, torchrun's summary of the ranks that ended by a signal)
    and the launchers' exit codes; the earliest failure that is not a symptom wins. Other results as they are."""
    logs = sorted(result_path.parent.glob("node-*.log"))
    return failures.settle(result, result_path, logs, [n.get("returncode") for n in nodes])
