"""Load: 1,000 analytic trials from 8 concurrent sweep processes on one SQLite storage; two sweeps racing
for one study name. No trial lost, none doubled, none left RUNNING.

The SQLite file lives in /dev/shm when there is one: on a busy shared disk each commit costs an fsync
(~15 ms here), which measures the disk, not us. Locking between processes is the same on tmpfs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

from orchestrator.records import queries
from tests.sweep_helpers import TO_THE_END, write_spec

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 8
TRIALS_PER_WORKER = 125  # 8 x 125 = 1,000


# a space where nearly every proposal is legal, so the trials (not rejections) dominate; each sweep adds its
# storage, budget and seed (sweep_spec: tests/conftest.py)
LOAD = {"seq_len": 1024, "gpu": "b200", "gpus_per_node": 8, "gbs": 64,
        "free": ["mbs", "recompute", "cuda_graphs", "dispatcher", "optimizer_offload"],
        "fixed": {"tp": 1, "cp": 1, "ep": 4, "etp": 1, "pp": 1, "vpp": 1, "precision": "bf16"}, "tracking_uri": "none"}


@pytest.fixture
def fast_storage(tmp_path):
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="moe-autotune-load-", dir=shm)) if shm.is_dir() else tmp_path
    yield f"sqlite:///{folder / 'optuna.db'}"
    if folder != tmp_path:
        shutil.rmtree(folder, ignore_errors=True)


def _start(spec: Path, cwd: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("moe-autotune")
    return subprocess.Popen([str(exe), "sweep", str(spec), "--quiet"], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _check_study(storage: str, name: str, n_trials: int) -> None:
    study = optuna.load_study(study_name=name, storage=storage)
    ran = queries.measured_trials(study)
    assert len(ran) == n_trials, f"{name}: {len(ran)} trials measured, wanted {n_trials}"
    keys = Counter(t.user_attrs["layout_key"] for t in ran)
    assert max(keys.values()) == 1, f"{name}: layouts measured twice: {[k for k, n in keys.items() if n > 1]}"
    numbers = [t.number for t in study.trials]
    assert sorted(numbers) == list(range(len(numbers))), f"{name}: trial numbers lost or doubled"
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,)), f"{name}: trials left RUNNING"
    for t in ran:
        assert t.user_attrs["status"] == "ok" and t.values[0] > 0
        assert t.user_attrs["result"]["layout"] == t.user_attrs["layout"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_thousand_analytic_trials_from_eight_concurrent_sweeps(tmp_path, sweep_spec, fast_storage):
    start = time.monotonic()
    specs = {name: write_spec(tmp_path / f"{name}.yaml", sweep_spec(
        name, LOAD, budget={"n_trials": TRIALS_PER_WORKER, "max_concurrent": 8, **TO_THE_END}, storage=fast_storage,
        seed=abs(hash(name)) % 1000)) for name in (f"load-{i}" for i in range(WORKERS))}
    procs = {name: _start(spec, tmp_path) for name, spec in specs.items()}
    outputs = {name: proc.communicate(timeout=1700) for name, proc in procs.items()}
    elapsed = time.monotonic() - start
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}: {outputs[name][1][-2000:]}"
    names = {s.study_name for s in optuna.get_all_study_summaries(fast_storage, include_best_trial=False)}
    assert names == set(procs)
    for name in procs:
        _check_study(fast_storage, name, TRIALS_PER_WORKER)
    total = sum(len(queries.measured_trials(optuna.load_study(study_name=n, storage=fast_storage))) for n in procs)
    assert total == WORKERS * TRIALS_PER_WORKER
    print(f"\n{total} analytic trials from {WORKERS} concurrent sweeps in {elapsed:.0f} s")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_sweeps_racing_for_one_study_name(tmp_path, sweep_spec, fast_storage):
    """Started at the same moment with the same name: one runs, the other is refused; never both in one study."""
    n_trials = 20
    spec = write_spec(tmp_path / "contested.yaml", sweep_spec(
        "contested", LOAD, budget={"n_trials": n_trials, "max_concurrent": 8, **TO_THE_END}, storage=fast_storage,
        seed=abs(hash("contested")) % 1000))
    procs = [_start(spec, tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=800) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], f"exit codes {codes}: {[o[1][-1500:] for o in outs]}"
    refused = outs[[p.returncode for p in procs].index(2)][1]
    assert "already exists" in refused
    _check_study(fast_storage, "contested", n_trials)
