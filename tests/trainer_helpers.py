"""Run the real trainer (trainers.megatron_moe) as processes from tests: torchrun for several ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from search_spaces.result import TrialResult

from tests.workers import exclusive, run_temp_root

REPO = Path(__file__).resolve().parents[1]
# Small enough for 2 shared cores: tiny model, short sequence, one warm-up and two measured steps.
FAST = ["--seq-len", "64", "--warmup", "1", "--steps", "2"]




def trainer_command(nproc: int, flags: list[str]) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "trainers.megatron_moe", *flags]
    # --standalone: the rendezvous store binds port 0 itself, as the orchestrator's single-node trials do. A port
    # chosen here and bound by torchrun seconds later was taken in between once (CI: EADDRINUSE).
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "-m", "trainers.megatron_moe", *flags]


def run_trainer(tmp_path: Path, nproc: int, *flags: str, model: str = "tiny-moe", env: dict | None = None,
                timeout: float = 480, fast: bool = True) -> tuple[TrialResult, subprocess.CompletedProcess]:
    """Run one trial; return its result file and the finished process (stdout+stderr in .stdout). `timeout`
    only guards against a hang: two xdist workers may each run a trainer on the same 2 cores."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    result_path = tmp_path / "result.json"
    argv = ["--model", model, *(FAST if fast else []), *flags, "--result", str(result_path)]
    proc_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(trainer_command(nproc, argv), cwd=REPO, env=proc_env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result_path.exists(), f"no result written (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
    return TrialResult.read(result_path), proc


def assert_ok(result: TrialResult, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert result.status == "ok", result.error
    assert result.loss_finite
    assert result.tokens_per_sec_per_gpu and result.tokens_per_sec_per_gpu > 0


# Runs shared between test modules (test_trainer_cpu and test_memory_match need the same layouts):
# each distinct run happens once per pytest run, whichever xdist worker needs it first, in one launch with the
# other runs on as many ranks (shared_run).
_SHARED: dict[str, tuple[TrialResult, subprocess.CompletedProcess]] = {}

# The layouts the memory and parallelism tests share: name -> (ranks, flags, model).
SAME_DATA = ["--mbs", "2", "--gbs", "4"]
LAYOUTS = {
    "single": (1, SAME_DATA, "tiny-moe"),
    "dp2": (2, ["--mbs", "1", "--gbs", "4"], "tiny-moe"),
    "tp2_sp": (2, ["--tp", "2", *SAME_DATA], "tiny-moe"),
    "cp2": (2, ["--cp", "2", *SAME_DATA], "tiny-moe"),
    "ep2_allgather": (2, ["--ep", "2", "--dispatcher", "allgather", "--mbs", "1", "--gbs", "2"], "tiny-moe"),
    # 5 layers over 2 stages: placed as the cost model places them (an explicit pipeline_model_parallel_layout)
    "pp2_uneven": (2, ["--pp", "2", "--num-layers", "5", "--mbs", "1", "--gbs", "4"], "tiny-moe"),
    "pp2_vpp2": (2, ["--pp", "2", "--vpp", "2", "--mbs", "1", "--gbs", "4"], "tiny-moe"),
    "ep2_pp2_recompute": (4, ["--ep", "2", "--pp", "2", "--mbs", "1", "--gbs", "4", "--recompute", "moe_act,layernorm"],
                          "tiny-moe"),
}
# The families with other layer kinds: tiny-qwen3-next (gated delta-net layers between gated full-attention
# layers, a gated shared expert) and tiny-gpt-oss (sliding-window layers, attention sinks, linear biases).
# 128 tokens: two delta-net chunks and four 32-token windows, so CP chunks cross both.
FAMILY_DATA = ["--seq-len", "128", "--mbs", "2", "--gbs", "4"]
FAMILY_MODELS = {"qwen3_next": "tiny-qwen3-next", "gpt_oss": "tiny-gpt-oss"}
for _family, _model in FAMILY_MODELS.items():
    LAYOUTS.update({
        f"{_family}_single": (1, FAMILY_DATA, _model),
        f"{_family}_cp2": (2, [*FAMILY_DATA, "--cp", "2"], _model),
        f"{_family}_tp2": (2, [*FAMILY_DATA, "--tp", "2"], _model),
        f"{_family}_ep2_pp2_seq512": (4, ["--seq-len", "512", "--ep", "2", "--pp", "2", "--mbs", "1", "--gbs", "4"],
                                      _model),
    })
# tiny-mla-moe has every kind of module (MLA, a dense first layer, shared and routed experts): one single-rank
# run per recompute choice.
RECOMPUTE_CHOICES = ("none", "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "full")
LAYOUTS.update({f"mla_recompute_{choice}": (1, ["--mbs", "2", "--gbs", "2", "--recompute", choice], "tiny-mla-moe")
                for choice in RECOMPUTE_CHOICES})
# Wider and longer than the defaults (the memory model must hold beyond hidden 64 and 64 tokens): widths 64,
# 256, 512 and sequence lengths 64, 512, 1024 together (bench/memory_accuracy.py covers many more).
LAYOUTS.update({
    "wide_cp2": (2, ["--hidden-size", "256", "--seq-len", "512", "--cp", "2", "--mbs", "2", "--gbs", "2"], "tiny-moe"),
    "wide_long_mla": (1, ["--hidden-size", "512", "--seq-len", "1024", "--mbs", "1", "--gbs", "1",
                          "--recompute", "moe_act,layernorm"], "tiny-mla-moe"),
})

# The routing modes test_trainer_cpu runs (EP2 of tiny-moe under each of Megatron-Core's router options): shared
# runs as well, in the two-rank launch, but not LAYOUTS (the memory tests do not check them).
ROUTINGS = [("dropless", "alltoall"), ("capacity:1.5", "alltoall"), ("capacity:1.5", "allgather"),
            ("forced_balance", "alltoall")]


def routing_run(routing: str, dispatcher: str) -> str:
    return f"routing_{routing.replace(':', '')}_{dispatcher}"


ROUTING_RUNS = {routing_run(r, d): (2, ["--ep", "2", "--mbs", "1", "--gbs", "2", "--dispatcher", d, "--routing", r],
                                    "tiny-moe") for r, d in ROUTINGS}
# Every shared run: name -> (ranks, flags, model).
RUNS = {**LAYOUTS, **ROUTING_RUNS}


def shared_command(nproc: int, cells_json: Path) -> list[str]:
    """trainers.cells over CELLS.json on `nproc` ranks (one rank: a plain process, as trainer_command runs one)."""
    if nproc == 1:
        return [sys.executable, "-m", "trainers.cells", str(cells_json)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "-m", "trainers.cells", str(cells_json)]


def _run_group(folder: Path, names: list[str], timeout: float = 480) -> dict[str, dict]:
    """Run the RUNS `names` (all on the same number of ranks) one after another in one trainers.cells launch;
    per name, its launch (args, output), the exit status it answers for and whether it wrote a result. A failing
    trial ends a launch (trainers/cells.py): the runs after it go on in a next one, so one run's failure fails
    its own tests only, as when each had a launch of its own."""
    nproc = RUNS[names[0]][0]
    records: dict[str, dict] = {}
    pending = list(names)
    for launch in range(len(names)):
        if not pending:
            break
        cells = [{"name": n, "argv": ["--model", RUNS[n][2], *FAST, *RUNS[n][1],
                                      "--result", str(folder / n / "result.json")]} for n in pending]
        cells_json = folder / f"cells-{launch}.json"
        cells_json.write_text(json.dumps(cells, indent=1))
        # the timeout only guards against a hang: run_trainer's, once per trial
        proc = subprocess.run(shared_command(nproc, cells_json), cwd=REPO, timeout=timeout * len(pending),
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        wrote = [n for n in pending if (folder / n / "result.json").exists()]
        ran = len(wrote)  # trials run in order: the first that fails ends the launch, later ones write nothing
        for name in pending[:ran]:  # each that the launch went past ended as a process of its own would: exit 0
            records[name] = {"args": proc.args, "returncode": 0, "stdout": proc.stdout, "result": True}
        if ran == len(pending):  # the last trial answers for the launch's exit (the process group's teardown)
            records[pending[-1]]["returncode"] = proc.returncode
            break
        if ran and TrialResult.read(folder / pending[ran - 1] / "result.json").status in ("error", "oom"):
            records[pending[ran - 1]]["returncode"] = proc.returncode  # it failed, and ended the launch
        else:  # the next one ended it without a result (flags refused, a crash)
            records[pending[ran]] = {"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout,
                                     "result": False}
            ran += 1
        pending = pending[ran:]
    return records


def shared_run(tmp_path_factory, name: str) -> tuple[TrialResult, subprocess.CompletedProcess]:
    """The run of RUNS[name], made once per pytest run in a folder all xdist workers see. All the runs on
    the same number of ranks run in one trainers.cells launch (each rank's start-up and Megatron's import once per
    rank count, not once per run): the first worker to need one of them runs them all, holding their lock; the
    others wait and read the result files and output. Each result is its own trial's: only its peak resident set
    and wall time include the trials before it (`extra.shared_process`), and no test here reads those."""
    if name not in _SHARED:
        nproc = RUNS[name][0]
        folder = run_temp_root(tmp_path_factory) / "shared-trainer-runs" / f"ranks{nproc}"
        record = folder / "process.json"
        with exclusive(folder.with_name(f"ranks{nproc}.lock")):
            if record.exists():
                records = json.loads(record.read_text())
            else:
                shutil.rmtree(folder, ignore_errors=True)  # a run whose worker died before it was recorded
                folder.mkdir(parents=True)
                records = _run_group(folder, [n for n, (ranks, _, _) in RUNS.items() if ranks == nproc])
                record.write_text(json.dumps(records))
        done = records[name]
        proc = subprocess.CompletedProcess(done["args"], done["returncode"], stdout=done["stdout"])
        assert done["result"], f"no result written (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
        _SHARED[name] = (TrialResult.read(folder / name / "result.json"), proc)
    return _SHARED[name]
