"""Test helpers for the sweep tests: the one small sweep spec they start from, and the prior."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from orchestrator.records import queries
from orchestrator.search.prior import Prior
from orchestrator.spec.schema import SweepSpec, parse_spec
from orchestrator.storage import studies

# the Ray backend with tests/fake_trainer.py: a real trainer process per trial that returns at once
FAKE_TRAINER: dict[str, Any] = {"backend": "ray", "launcher": "python", "trainer_module": "tests.fake_trainer",
                                "steps": 3, "warmup": 1}

# a budget that runs to n_trials: for tests that count the trials (convergence, on by default, may stop a long
# analytic sweep of tiny-moe after 56-72 trials)
TO_THE_END: dict[str, Any] = {"converge_below": None}


def spec_data(tmp_path: Path, name: str = "sweep", **changes: Any) -> dict[str, Any]:
    """A small sweep spec as data: tiny-moe on 4 CPU ranks with the analytic backend (seconds per sweep), its
    Optuna storage, MLflow store and trial directories in `tmp_path`; `changes` replace whole fields."""
    data: dict[str, Any] = {
        "name": name, "model": "tiny-moe", "gpu": "cpu", "gpus_per_node": 4, "seq_len": 256, "gbs": 8,
        "backend": "analytic", "budget": {"n_trials": 6}, "seed": 3, "fixed": {"precision": "fp32"},
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}", "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "workdir": str(tmp_path / "runs")}
    return {**data, **changes}


def make_spec(tmp_path: Path, name: str = "sweep", **changes: Any) -> SweepSpec:
    """spec_data, validated: the SweepSpec a sweep runs."""
    return parse_spec(spec_data(tmp_path, name, **changes))


def write_spec(path: Path, data: dict[str, Any]) -> Path:
    """A spec file (JSON is YAML) for the CLI."""
    path.write_text(json.dumps(data))
    return path


def finished_sweep(root: Path, study: str, n_trials: int = 3) -> dict[str, Any]:
    """A finished analytic sweep in `root` (SQLite storage, SQLite MLflow store), run through the CLI: the spec's data,
    its file and its storage URL, for tests that point commands at it (or away from its stores)."""
    from orchestrator.commands.cli import main

    data = spec_data(root, study, budget={"n_trials": n_trials})
    spec = write_spec(root / "spec.json", data)
    assert main(["sweep", str(spec), "--quiet"]) == 0
    return {"root": root, "spec": spec, "storage": data["storage"], "data": data}


def prior_for(spec) -> Prior:
    """The prior a sweep of `spec` uses (one place to swap in a stand-in if search_spaces breaks)."""
    return Prior(spec)


def direct_writes(monkeypatch) -> None:
    """Analytic sweeps store each write as it is made, as a sweep whose trials run does (not each trial whole once
    told: orchestrator/sweep/writes.py), for the tests of that contract whose analytic backend stands in for a
    trainer that measures (a result stored before its tell, a result the storage refuses at its tell)."""
    from orchestrator.sweep import session
    from orchestrator.sweep.writes import DirectWrites

    monkeypatch.setattr(session, "sweep_writes", lambda study, *args: DirectWrites(study))


def measured_count(storage: str, name: str) -> int:
    """The trials of study `name` that measured a result, read while its sweep runs in another process; 0 before
    that sweep has made its storage or study. The reader never creates the storage: Optuna would make a missing
    SQLite file itself, racing the sweep's own creation (CI saw both stamp the schema version: IntegrityError)."""
    path = studies.store_path(storage)
    if path is not None and not path.exists():
        return 0
    try:
        store = studies.open_storage(storage, create=False)
        return len(queries.measured_trials(optuna.load_study(study_name=name, storage=store)))
    except KeyError:  # the storage is made, the study not yet
        return 0


def start_held_sweep(tmp_path: Path, sweep_spec, name: str, env: dict[str, str]):
    """A `moe-autotune sweep` process of two fake-trainer trials whose second waits while the returned gate file
    exists: (spec data, the process, the gate, the file whose lines count the trials begun)."""
    import subprocess
    import sys

    data = sweep_spec(name, backend="local", launcher="python", trainer_module="tests.fake_trainer",
                      gpus_per_node=1, budget={"n_trials": 2}, free=["mbs", "recompute"])
    spec = write_spec(tmp_path / "spec.json", data)
    gate = tmp_path / "hold"
    gate.touch()
    cli = str(Path(sys.executable).with_name("moe-autotune"))
    proc = subprocess.Popen([cli, "sweep", str(spec), "--quiet"], cwd=tmp_path, start_new_session=True,
                            env={**env, "FAKE_TRAINER_HOLD": str(gate)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    return data, proc, gate, Path(f"{gate}.starts")
