"""promote / export from the registry: picking the winner, refusals, the production alias and rollback.

Unit tests build an Optuna study in a tmp SQLite storage carrying the sweep's storage contract
(study/trial user_attrs), and use an MLflow SQLite tracking/registry URI in tmp_path.
The end-to-end test runs a small real sweep and goes through `moe-autotune promote` the way a user does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from search_spaces.cost.costmodel import estimate
from search_spaces.layouts.layout import Layout

from orchestrator.commands.cli import main
from orchestrator.outputs import export, registry, winner

MEMORY_LIMIT = 80.0
# (layout, status, tokens/s/GPU, peak GiB): trial 1 is the best that fits; 2 is faster but does not fit
TRIALS = [
    (dict(ep=4, gbs=8), "ok", 1000.0, 30.0),
    (dict(tp=2, ep=2, gbs=8), "ok", 1500.0, 50.0),
    (dict(ep=2, mbs=2, gbs=8), "ok", 2000.0, 90.0),
    (dict(gbs=8), "oom", None, None),
    (dict(tp=2, ep=4, etp=1, gbs=8, recompute="full"), "ok", 1200.0, 20.0),
    (dict(cp=2, ep=2, gbs=8), "error", None, None),
]


def make_study(tmp_path: Path, name: str = "fake", backend: str = "local", parent_run_id: str | None = None,
               tracking_uri: str | None = None, trials: list = TRIALS,
               costmodel: bool = False) -> tuple[str, optuna.Study]:
    """A finished sweep as the sweep writes it (contract in the shared context / orchestrator/storage/studies.py).

    costmodel: each trial's prediction is the real cost model's estimate, and its measured memory breakdown
    a copy of the predicted one (as the analytic backend records it, counts of parameters included)."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(storage=storage, study_name=name, directions=["maximize", "minimize"])
    spec = {"model": "tiny-moe", "seq_len": 4096, "gpu": "h100", "nodes": 1, "gpus_per_node": 4,
            "backend": backend}
    for key, value in dict(spec=spec, model="tiny-moe", seq_len=4096, gpu="h100", num_gpus=4, backend=backend,
                           memory_limit_gib=MEMORY_LIMIT, tracking_uri=tracking_uri,
                           mlflow_parent_run_id=parent_run_id).items():
        if value is not None:
            study.set_user_attr(key, value)
    dists = {"tp": optuna.distributions.CategoricalDistribution([1, 2]),
             "ep": optuna.distributions.CategoricalDistribution([1, 2, 4]),
             "mbs": optuna.distributions.CategoricalDistribution([1, 2])}
    for fields, status, tps, mem in trials:
        layout = Layout.from_dict(fields)
        result = {"status": status, "tokens_per_sec_per_gpu": tps, "peak_memory_gib": mem,
                  "memory_gib": {"weights": 1.0, "gradients": 1.0, "optimizer_states": 2.0,
                                 "activations_per_microbatch": 3.0} if tps else {},
                  "extra": {"source": "costmodel"} if backend == "analytic" else {}}
        prediction = {"legal": True, "fits": (mem or 0) <= MEMORY_LIMIT,
                      "tokens_per_sec_per_gpu": (tps or 900.0) * 1.1, "peak_memory_gib": (mem or 85.0) * 0.9,
                      "breakdown": {"memory_gib": {"weights": 1.2, "gradients": 1.1, "optimizer_states": 2.1,
                                                   "activations": 4.0},
                                    "time_s": {"compute": 0.5, "tp_comm": 0.1, "ep_comm": 0.2}}}
        if costmodel:
            prediction = estimate(spec["model"], spec["gpu"], 4, spec["seq_len"], layout).to_dict()
            result["memory_gib"] = dict(prediction["breakdown"]["memory_gib"]) if tps else {}
        study.add_trial(optuna.trial.create_trial(
            params={"tp": layout.tp, "ep": layout.ep, "mbs": layout.mbs}, distributions=dists,
            values=[tps or 0.0, mem or 0.0],
            user_attrs={"layout": layout.to_dict(), "layout_key": layout.key(), "status": status,
                        "result": result, "prediction": prediction, "backend": backend,
                        "reason": None if status == "ok" else f"{status} at step 2"},
            system_attrs={"constraints:memory_over_limit_gib": (mem or 0.0) - MEMORY_LIMIT,
                          "constraints:not_measured_ok": 0.0 if status == "ok" else 1.0}))
    return storage, study


def layout_of(number: int) -> Layout:
    return Layout.from_dict(TRIALS[number][0])


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # mlflow's default artifact root and any relative paths stay in tmp
    return uri


def test_pick_takes_best_fitting_and_refuses_with_reasons(tmp_path):
    _, study = make_study(tmp_path)
    assert winner.pick(study).number == 1
    assert winner.pick(study, 4).layout == layout_of(4)
    with pytest.raises(winner.SpecError, match="trial 2 does not fit: 90.0 GiB exceeds 80 GiB"):
        winner.pick(study, 2)
    with pytest.raises(winner.SpecError, match="trial 3 did not succeed: status oom"):
        winner.pick(study, 3)
    with pytest.raises(winner.SpecError, match="no finished trial 42"):
        winner.pick(study, 42)


def test_analytic_trials_need_allow_estimated(tmp_path):
    _, study = make_study(tmp_path, backend="analytic")
    with pytest.raises(winner.SpecError, match="only analytic estimates.*--allow-estimated"):
        winner.pick(study)
    with pytest.raises(winner.SpecError, match="analytic backend"):
        winner.pick(study, 1)
    assert winner.pick(study, allow_estimated=True).number == 1


FORCED = [(dict(ep=4, gbs=8, routing="forced_balance"), "ok", 3000.0, 30.0),
          (dict(ep=4, gbs=8, routing="capacity:1.25"), "ok", 2500.0, 30.0),
          (dict(ep=4, gbs=8), "ok", 1000.0, 30.0)]


def test_forced_balance_is_benchmark_only(tmp_path):
    """Forced-balance routing is the fastest trial (it would win by cheating): production gets the best trial with
    a production routing, and the forced-balance one only when asked for explicitly."""
    _, study = make_study(tmp_path, trials=FORCED)
    assert winner.pick(study).number == 1  # token dropping (capacity) is a production choice
    with pytest.raises(winner.SpecError, match="routing=forced_balance, a benchmark-only setting.*--allow-benchmark"):
        winner.pick(study, 0)
    assert winner.pick(study, allow_benchmark=True).number == 0
    (tmp_path / "only").mkdir()
    _, only = make_study(tmp_path / "only", trials=FORCED[:1])
    with pytest.raises(winner.SpecError, match="routing=forced_balance did: pass --allow-benchmark"):
        winner.pick(only)


@pytest.mark.timeout(120)
def test_cli_refuses_forced_balance_for_production_unless_allowed(tmp_path, tracking, capsys):
    storage, _ = make_study(tmp_path, trials=FORCED)
    for command in (["promote", "fake"], ["export", "fake"]):
        assert main([*command, "--storage", storage, "--trial", "0"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "benchmark-only" in err and err.count("\n") == 1, err
    assert main(["export", "fake", "--storage", storage, "--trial", "0", "--allow-benchmark"]) == 0
    assert "--moe-router-force-load-balancing" in capsys.readouterr().out
    assert main(["promote", "fake", "--storage", storage]) == 0  # the best production routing: trial 1
    assert "trial 1" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_cli_promotes_analytic_only_when_allowed(tmp_path, tracking, capsys):
    storage, _ = make_study(tmp_path, backend="analytic")
    assert main(["promote", "fake", "--storage", storage]) == 2
    assert "--allow-estimated" in capsys.readouterr().err
    assert main(["promote", "fake", "--storage", storage, "--allow-estimated"]) == 0
    assert "estimated" in capsys.readouterr().out
    import mlflow

    version = mlflow.MlflowClient().get_model_version("tiny-moe-4096-layout", "1")
    assert version.tags["moe_autotune.estimated"] == "true" and version.tags["moe_autotune.backend"] == "analytic"


def _production(name: str) -> str:
    return str(registry.current_production(name).version)


@pytest.mark.timeout(300)
def test_promote_alias_rollback_and_export(tmp_path, tracking, capsys):
    import mlflow

    storage, _ = make_study(tmp_path)
    name = "tiny-moe-4096-layout"
    assert main(["promote", "fake", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert f"models:/{name}@production: version 1" in out and "trial 1" in out

    # loaded back through MLflow: the same layout, and all the artifacts
    folder = Path(mlflow.artifacts.download_artifacts(f"models:/{name}@production", dst_path=str(tmp_path / "dl")))
    assert sorted(p.name for p in folder.iterdir()) == sorted(registry.FILES)
    assert Layout.from_dict(yaml.safe_load((folder / "layout.yaml").read_text())) == layout_of(1)
    assert export.layout_from_megatron_args((folder / "megatron-args.txt").read_text()) == layout_of(1)
    assert registry.load_layout(f"{name}@production") == layout_of(1)
    version = mlflow.MlflowClient().get_model_version(name, "1")
    assert version.tags["moe_autotune.trial"] == "1" and version.tags["moe_autotune.estimated"] == "false"

    # a second promotion moves the alias; the first stays reachable by number
    assert main(["promote", "fake", "--storage", storage, "--trial", "4"]) == 0
    assert "version 2 (was version 1)" in capsys.readouterr().out
    assert _production(name) == "2"
    assert registry.load_layout(f"{name}@production") == layout_of(4)
    assert registry.load_layout(f"{name}/1") == layout_of(1)

    # export prints what was registered, from the registry or straight from the study
    assert main(["export", f"models:/{name}@production", "--format", "megatron-args"]) == 0
    printed = capsys.readouterr().out
    assert export.layout_from_megatron_args(printed) == layout_of(4)
    assert main(["export", "fake", "--storage", storage, "--format", "bridge-yaml"]) == 0
    bridge = yaml.safe_load(capsys.readouterr().out)
    assert bridge["model"]["tensor_model_parallel_size"] == 2 and bridge["train"]["global_batch_size"] == 8
    assert main(["export", f"{name}@production", "--format", "sbatch"]) == 0
    assert capsys.readouterr().out.startswith("#!/bin/bash")

    # rollback moves production back to version 1; there is nothing before version 1
    assert main(["promote", "fake", "--storage", storage, "--rollback"]) == 0
    assert "version 2 -> 1" in capsys.readouterr().out
    assert _production(name) == "1"
    assert registry.load_layout(f"models:/{name}@production") == layout_of(1)
    assert main(["promote", "--rollback", "--name", name]) == 2
    assert "first production version" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_refusals_are_one_line_errors(tmp_path, tracking, capsys):
    storage, _ = make_study(tmp_path)
    for argv, message in [
        (["promote", "fake", "--storage", storage, "--trial", "2"], "does not fit"),
        (["promote", "fake", "--storage", storage, "--trial", "5"], "status error (error at step 2)"),
        (["promote", "nope", "--storage", storage], "no study 'nope'"),
        (["export", "fake", "--storage", storage, "--format", "pdf"], "unknown export format 'pdf'"),
        # a read on a registry that was never written is refused before MLflow can create it (issue 21)
        (["promote", "--rollback", "--name", "never-promoted-4096-layout"], "no MLflow store"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    # once the registry exists, a rollback of a name never promoted says so
    import mlflow
    mlflow.MlflowClient(tracking).search_experiments()  # opening the store creates its schema
    assert main(["promote", "--rollback", "--name", "never-promoted-4096-layout"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no production version" in err and err.count("\n") == 1, err


# ---- end to end: a small real sweep, then promote through the CLI ---------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_sweep_promote_load_rollback(tmp_path, monkeypatch, mlflow_server):
    """One real CPU trial of tiny-moe (the Megatron-Core trainer, 2 ranks), a real MLflow server.

    (Promoting two different layouts, and rolling back between them, is covered by the unit test above.)
    """
    import mlflow

    tracking = mlflow_server.uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    spec = {"name": "e2e", "model": "tiny-moe", "seq_len": 128, "gpu": "cpu", "nodes": 1, "gpus_per_node": 2,
            "gbs": 4, "fixed": {"precision": "fp32", "cuda_graphs": "none", "optimizer_offload": 0,
                                "dispatcher": "alltoall", "tp": 1, "cp": 1, "pp": 1, "ep": 1},
            "free": ["mbs", "recompute"], "budget": {"n_trials": 1, "max_concurrent": 1}, "steps": 2,
            "warmup": 1, "trial_timeout_s": 240, "backend": "local", "seed": 3, "storage": storage,
            "tracking_uri": tracking, "workdir": str(tmp_path / "runs")}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    # RAY_ADDRESS=local: a Ray of its own, even if another `ray start` cluster runs on this machine
    env = dict(os.environ, MLFLOW_TRACKING_URI=tracking, RAY_ADDRESS="local")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator.commands.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=480)

    swept = cli("sweep", str(tmp_path / "sweep.yaml"), "--quiet")
    assert swept.returncode == 0, swept.stderr[-2000:]
    study = winner.load(storage, "e2e")
    promotable = sorted((v for v in winner.views(study) if v.refusal() is None),
                        key=lambda v: -v.tokens_per_sec_per_gpu)
    assert promotable, [(v.number, v.status, v.reason) for v in winner.views(study)]
    best = promotable[0]

    first = cli("promote", "e2e", "--storage", storage)
    assert first.returncode == 0, first.stderr[-2000:]
    name = "tiny-moe-128-layout"
    mlflow.set_tracking_uri(tracking)
    mlflow.set_registry_uri(tracking)
    folder = Path(mlflow.artifacts.download_artifacts(f"models:/{name}@production", dst_path=str(tmp_path / "a")))
    assert Layout.from_dict(yaml.safe_load((folder / "layout.yaml").read_text())) == best.layout
    assert export.layout_from_megatron_args((folder / "megatron-args.txt").read_text()) == best.layout
    assert _production(name) == "1"

    # a second promotion (of the runner-up when there is one) is a new version, and the alias moves
    second_view = promotable[1] if len(promotable) > 1 else best
    second = cli("promote", "e2e", "--storage", storage, "--trial", str(second_view.number))
    assert second.returncode == 0, second.stderr[-2000:]
    assert _production(name) == "2"
    assert registry.load_layout(f"{name}@production") == second_view.layout

    back = cli("promote", "e2e", "--storage", storage, "--rollback")
    assert back.returncode == 0, back.stderr[-2000:]
    assert _production(name) == "1"
    assert registry.load_layout(f"{name}@production") == best.layout

    # the report of the real sweep lands beside it, on the sweep's parent run
    reported = cli("report", "e2e", "--storage", storage, "--out", str(tmp_path / "report"))
    assert reported.returncode == 0, reported.stderr[-2000:]
    parent = study.user_attrs["mlflow_parent_run_id"]
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(parent, "report")}
    assert "report/report.html" in logged and "report/pareto.png" in logged
