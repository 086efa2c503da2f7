"""The trainer's process tree on one node: how it is launched (argv, environment), run to its end or killed whole,
and what its trial's result is once every node's tree has ended.

`run_process_tree` runs inside a Ray task (orchestrator/dispatch/local.py): it needs nothing of Ray.

Who owns the tree (search_spaces/ownership.py): every process of a trial carries its mark (`MOE_AUTOTUNE_TRIAL`) and
its node's launch id (`MOE_AUTOTUNE_LAUNCH`). The launcher runs in a process group of its own and is SIGKILLed when
the Ray worker that started it dies (Linux's parent-death signal); each rank asks for the same on itself when torchrun
starts it, so it dies with its launcher. When the launcher ends, or is killed (timeout, a stop), its group, its
descendants and every process left with its launch id are killed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import psutil

from search_spaces import failures
from search_spaces.ownership import LAUNCH_ENV, TRIAL_ENV, parent_death_request
from search_spaces.result import TrialResult

from orchestrator.dispatch.base import TrialRequest
from orchestrator.dispatch.steps import PROGRESS_FILE

# Passed from the orchestrator's environment into the trainer's (fault hooks, thread counts, ...).
_PASS_ENV_PREFIXES = ("MOE_AUTOTUNE_", "OMP_NUM_THREADS", "PYTHONPATH", "CUDA_", "NCCL_", "GLOO_")
LOG_TAIL_CHARS = 4000
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
    args += stopping_flags(request, result_path)
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


def stopping_flags(request: TrialRequest, result_path: Path) -> list[str]:
    """Where the trainer reports its steps (beside its result: steps.py) and the rules it applies itself."""
    flags = ["--progress", str(result_path.with_name(PROGRESS_FILE))]
    if request.stop_within is not None:
        flags += ["--stop-within", f"{request.stop_within:g}", "--min-measured", str(request.min_measured)]
    if request.memory_limit_gib is not None:
        flags += ["--memory-limit-gib", f"{request.memory_limit_gib:g}"]
    return flags


def trainer_env(request: TrialRequest) -> dict[str, str]:
    """The trainer's environment: the orchestrator's (less Ray's own variables), the passed prefixes, the trial's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k in ("RAY_AUTH_MODE",)}
    env.update({k: v for k, v in os.environ.items() if k.startswith(_PASS_ENV_PREFIXES)})
    env.setdefault("OMP_NUM_THREADS", "1")
    # the trainer module must import from where the orchestrator runs (tests, source checkouts)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
    # the GPUs the trial stands for: a trainer started with launcher "python" (one process per node, no
    # torchrun) learns the world its per-GPU figures are for from it
    env[TRIAL_GPUS_ENV] = str(request.num_gpus)
    env.update(request.env)
    env[TRIAL_ENV] = trial_mark(request)
    return env


def trial_mark(request: TrialRequest) -> str:
    """`<study>/<number>`, the mark every process of the trial carries (its trial folder is
    `<workdir>/<study>/trial-NNNN`: orchestrator/sweep/session.py); a request without a number names its folder."""
    folder = Path(request.workdir)
    number = folder.name if request.trial_number is None else str(request.trial_number)
    return f"{folder.parent.name}/{number}"


def run_process_tree(argv: list[str], env: dict[str, str], cwd: str, log_path: str,
                     timeout_s: float) -> dict[str, Any]:
    """Run argv in a new session, as a launch of its own (a fresh launch id in its environment); on timeout (or if we
    are interrupted) kill the whole tree; once the launcher has ended, whatever still carries the launch id."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    launch = uuid.uuid4().hex
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**env, LAUNCH_ENV: launch},
                                cwd=cwd, start_new_session=True, preexec_fn=_die_with(os.getpid()))
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
            # ranks that escaped torchrun's wait still belong to the group; ranks orphaned by a launcher killed
            # from outside (each in a session of its own, no longer its descendants) still carry the launch id
            _kill_tree(proc.pid)
            kill_launch(launch)
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


def kill_launch(launch: str) -> int:
    """SIGKILL every process of ours whose environment carries launch id `launch`; how many were signalled."""
    killed = 0
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(LAUNCH_ENV) == launch:
                proc.kill()
                killed += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return killed


def _die_with(parent: int) -> Callable[[], None] | None:
    """The launcher's preexec_fn (Linux): it gets SIGKILL when `parent` (the Ray worker that starts it) dies, and
    ends at once if `parent` died before the request took effect. None where no parent-death signal can be asked for
    (not Linux's libc): the trial's timeout still kills the tree."""
    request = parent_death_request()  # looked up here, before the fork: the child only calls it
    if request is None:
        return None

    def preexec() -> None:
        if request() and os.getppid() != parent:
            os._exit(1)

    return preexec


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_CHARS))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def trial_result(request: TrialRequest, result_path: Path, nodes: list[dict], commands) -> TrialResult:
    """The trial's result from each node's report (run_process_tree's) and the result file the trainer wrote."""
    tail = "\n".join(n.get("log_tail") or "" for n in nodes)[-LOG_TAIL_CHARS:]
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


def _root_cause(result: TrialResult, result_path: Path, nodes: list[dict]) -> TrialResult:
    """A failed trial's root cause, once its process tree has ended (search_spaces/failures.py): every rank's
    failure record, every node log (gloo and NCCL aborts, torchrun's summary of the ranks that ended by a signal)
    and the launchers' exit codes; the earliest failure that is not a symptom wins. Other results as they are."""
    logs = sorted(result_path.parent.glob("node-*.log"))
    return failures.settle(result, result_path, logs, [n.get("returncode") for n in nodes])
