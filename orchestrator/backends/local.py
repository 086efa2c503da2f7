"""The real trainer through Ray: one Ray task per node runs torchrun in its own process tree.

A trial reserves its resources in Ray (GPUs on GPU clusters, CPU processes on CPU-only machines), so
several trials run at once when they fit. A multi-node trial reserves one bundle per node
(STRICT_SPREAD) and starts one torchrun per node with a shared c10d rendezvous at the first node.
A hang is killed with its whole process tree (status timeout); a lost Ray worker or node is retried once.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from search_spaces.result import TrialResult

from orchestrator.backends.base import TrialRequest, stamp

# Passed from the orchestrator's environment into the trainer's (fault hooks, thread counts, ...).
_PASS_ENV_PREFIXES = ("MOE_AUTOTUNE_", "OMP_NUM_THREADS", "PYTHONPATH", "CUDA_", "NCCL_", "GLOO_")
_LOG_TAIL_CHARS = 4000


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
        self._init_ray()
        import ray
        self._run_node = ray.remote(max_retries=0)(run_process_tree)
        self._probe = ray.remote(max_retries=0)(_free_port_and_address)

    def _init_ray(self) -> None:
        ray_env()
        import ray
        if ray.is_initialized():
            return
        # Any: ray.init annotates logging_level as int, though it takes a level name too
        common: dict[str, Any] = {"log_to_driver": False, "configure_logging": True, "logging_level": "WARNING"}
        if self.spec.ray_address:
            ray.init(address=self.spec.ray_address, **common)
        else:
            # CPU ranks mostly wait on gloo: advertise enough logical CPUs for max_concurrent trials
            need = self.spec.gpus_per_node * self.spec.budget.max_concurrent
            ray.init(address="local", num_cpus=max(need, os.cpu_count() or 1), include_dashboard=False,
                     _node_ip_address="127.0.0.1", **common)
        self._started_ray = True

    # ---- Backend ---------------------------------------------------------------------------------
    def submit(self, request: TrialRequest) -> "concurrent.futures.Future[TrialResult]":
        return self._threads.submit(self._run_with_retry, request)

    def close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
        if self._started_ray and not self.spec.ray_address:
            import ray
            ray.shutdown()

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
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        trial_dir = Path(request.workdir).resolve()
        trial_dir.mkdir(parents=True, exist_ok=True)
        result_path = trial_dir / "result.json"
        result_path.unlink(missing_ok=True)
        env = self._env(request)
        per_node = {"num_gpus": request.gpus_per_node} if self.use_gpus else {"num_cpus": request.gpus_per_node}
        bundle = {"GPU": request.gpus_per_node, "CPU": 1} if self.use_gpus else {"CPU": request.gpus_per_node}
        pg = None
        commands: list[list[str]] = []
        refs = []
        try:
            if request.nodes == 1:
                argv = trainer_argv(request, self.module, self.spec.launcher, result_path)
                commands.append(argv)
                refs.append(self._run_node.options(**per_node).remote(
                    argv, env, os.getcwd(), str(trial_dir / "node-0.log"), request.timeout_s))
            else:
                pg = placement_group([bundle] * request.nodes, strategy="STRICT_SPREAD")
                ray.get(pg.ready(), timeout=request.timeout_s)
                first = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
                addr, port = ray.get(self._probe.options(num_cpus=0, scheduling_strategy=first).remote())
                for rank in range(request.nodes):
                    argv = trainer_argv(request, self.module, self.spec.launcher, result_path, rank,
                                        f"{addr}:{port}")
                    commands.append(argv)
                    strategy = PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                placement_group_bundle_index=rank)
                    refs.append(self._run_node.options(scheduling_strategy=strategy, **per_node).remote(
                        argv, env, os.getcwd(), str(trial_dir / f"node-{rank}.log"), request.timeout_s))
            (trial_dir / "command.json").write_text(json.dumps(commands, indent=1))
            try:
                nodes = ray.get(refs, timeout=request.timeout_s + 120)
            except ray.exceptions.GetTimeoutError:
                for ref in refs:
                    ray.cancel(ref, force=True)
                nodes = [{"returncode": None, "timed_out": True, "log_tail": "", "wall_time_s": None}]
        finally:
            if pg is not None:
                remove_placement_group(pg)
        return self._result(request, result_path, nodes, commands)

    def _result(self, request: TrialRequest, result_path: Path, nodes: list[dict], commands) -> TrialResult:
        tail = "\n".join(n.get("log_tail") or "" for n in nodes)[-_LOG_TAIL_CHARS:]
        info = {"command": commands[0] if len(commands) == 1 else commands,
                "returncodes": [n.get("returncode") for n in nodes], "log_tail": tail,
                "launch_wall_s": max((n.get("wall_time_s") or 0.0) for n in nodes)}
        if any(n.get("timed_out") for n in nodes):
            return TrialResult(status="timeout", extra=info,
                               error=f"no result after {request.timeout_s:g} s; killed the whole process tree",
                               wall_time_s=max((n.get("wall_time_s") or 0) for n in nodes))
        if result_path.is_file():
            try:
                result = TrialResult.read(result_path)
            except (ValueError, TypeError) as exc:
                return TrialResult(status="error", error=f"unreadable result file: {exc}", extra=info)
            keep = ("command", "launch_wall_s") if result.status == "ok" else tuple(info)
            result.extra.update({k: info[k] for k in keep})
            return result
        rcs = [n.get("returncode") for n in nodes]
        last = next((ln for ln in reversed(tail.strip().splitlines()) if ln.strip()), "")
        return TrialResult(status="error", extra=info,
                           error=f"trainer exited {rcs} without a result: {last[-300:]}",
                           wall_time_s=max((n.get("wall_time_s") or 0) for n in nodes))

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
