"""The suite's lanes keep their promises about where tests run.

Tests that share one resource (the built wheel and its venvs, the emulated Slurm cluster, one PostgreSQL
cluster, the Megatron dataset) carry `xdist_group` marks, and scripts/test.sh runs pytest-xdist with
`--dist loadgroup` so that each group runs on one worker. pytest 9.2 with pytest-xdist 3.8 dropped the marks
silently (the wheel was built twice and two Slurm tests shared the cluster at once): this runs a small
session the way scripts/test.sh does and checks the grouping itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

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
    assert 'XDIST=(-n "${TEST_WORKERS:-$WORKERS}" --dist loadgroup)' in script
    return ["-n", "3", "--dist", "loadgroup"]


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
    proc = subprocess.run([sys.executable, "-m", "pytest", *_xdist_arguments(), "-q", "-p", "no:cacheprovider",
                           "-p", "no:hydra_pytest", "-p", "no:anyio", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for line in where.read_text().splitlines():
        nodeid, worker = line.rsplit(" ", 1)
        assert "@" in nodeid, f"xdist did not mark {nodeid} with its group"
        workers[nodeid.rsplit("@", 1)[1]].add(worker)
    assert set(workers) == {"wheel_like", "by_decorator"}
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)
