"""The suite's lanes keep their promises about where tests run.

Tests that share one resource (the built wheel and its venvs, the emulated Slurm cluster, one PostgreSQL
cluster, the Megatron dataset) carry `xdist_group` marks, and scripts/test.sh runs pytest-xdist with
`--dist loadgroup` so that each group runs on one worker. pytest 9.2 with pytest-xdist 3.8 dropped the marks
silently (the wheel was built twice and two Slurm tests shared the cluster at once): this runs a small
session the way scripts/test.sh does and checks the grouping itself, and that a crashed worker ends such a session
(pytest-xdist 3.8's loadgroup waits forever after replacing one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

MODULE = '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("{module_group}")


def _note(request):
    with open(os.environ["WHERE_TESTS_RAN"], "a") as out:
        out.write(f"{{request.node.nodeid}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")


@pytest.mark.parametrize("i", range(6))
def test_in_the_module_group(i, request):
    _note(request)
'''

UNGROUPED = '''
import os
import time
import pytest


@pytest.mark.xdist_group("by_decorator")
@pytest.mark.parametrize("i", range(6))
def test_in_a_decorated_group(i, request):
    with open(os.environ["WHERE_TESTS_RAN"], "a") as out:
        out.write(f"{request.node.nodeid} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.parametrize("i", range(12))
def test_ungrouped(i):
    time.sleep(0.05)
'''


def _xdist_arguments() -> list[str]:
    """The xdist arguments of scripts/test.sh, read from it (three workers: the whole suite's on two cores)."""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "test.sh").read_text()
    assert 'XDIST=(-n "${TEST_WORKERS:-$WORKERS}" --dist loadgroup --max-worker-restart=0)' in script
    return ["-n", "3", "--dist", "loadgroup", "--max-worker-restart=0"]


def test_the_whole_suite_runs_one_worker_more_than_the_cpus():
    """The count as the script computes it, after it has exported OMP_NUM_THREADS=1 (which nproc obeys: the first
    version of this line gave 1 + 1 workers on 2 cores)."""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "test.sh").read_text()
    (line,) = [x for x in script.splitlines() if x.startswith("WORKERS=$((")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(["bash", "-c", f"{line}\necho $WORKERS"], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == len(os.sched_getaffinity(0)) + 1, out.stdout


def test_each_xdist_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_wheel_like.py").write_text(MODULE.format(module_group="wheel_like"))
    (tmp_path / "test_mixed.py").write_text(UNGROUPED)
    where = tmp_path / "where.txt"
    env = {**os.environ, "WHERE_TESTS_RAN": str(where)}
    out, err, returncode = _run_session(tmp_path, env)
    assert returncode == 0, out[-3000:] + err[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for line in where.read_text().splitlines():
        nodeid, worker = line.rsplit(" ", 1)
        assert "@" in nodeid, f"xdist did not mark {nodeid} with its group"
        workers[nodeid.rsplit("@", 1)[1]].add(worker)
    assert set(workers) == {"wheel_like", "by_decorator"}
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)


def _run_session(folder: Path, env: dict[str, str], bound_s: int = 300) -> tuple[str, str, int]:
    """A pytest session of the test files in `folder` with scripts/test.sh's xdist arguments: (stdout, stderr,
    exit code). It takes about 3 s (under four busy loops too); once, in a CI run, it had not finished after 120 s,
    with no output telling where it stood. Past the bound every process of the session is sent SIGABRT, on which
    pytest's faulthandler (controller and workers) writes each thread's stack to stderr, and the test fails with
    those stacks."""
    argv = [sys.executable, "-m", "pytest", *_xdist_arguments(), "-q", "-p", "no:cacheprovider",
            "-p", "no:hydra_pytest", "-p", "no:anyio", "--rootdir", str(folder), str(folder)]
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the session had not finished after {bound_s} s; its output and stacks:\n"
                    f"{out[-3000:]}\n{err[-12000:]}")
    return out, err, proc.returncode


CRASHING = '''
import os
import pytest

pytestmark = pytest.mark.xdist_group("crashing")


@pytest.mark.parametrize("i", range(4))
def test_in_a_group(i):
    if i == 1:
        os._exit(1)
'''


def test_a_crashed_worker_ends_the_run_naming_its_test(tmp_path):
    """With the script's arguments a worker that dies fails the run at once, with the test it was running named,
    instead of being replaced (after which loadgroup can wait forever)."""
    (tmp_path / "test_crashing.py").write_text(CRASHING)
    (tmp_path / "test_mixed.py").write_text(UNGROUPED)
    out, err, returncode = _run_session(tmp_path, {**os.environ, "WHERE_TESTS_RAN": os.devnull})
    assert returncode != 0, out[-3000:]
    assert "crashed while running 'test_crashing.py::test_in_a_group[1]" in out, out[-3000:]
    assert "replacing crashed worker" not in out, out[-3000:]
