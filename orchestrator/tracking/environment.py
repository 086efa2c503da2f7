"""What a sweep records of the machine it ran on (MLflow's environment.json): an allow-list, never the whole
environment minus a deny-list. A variable is recorded only when a group below names it (by name or by its
tuning namespace's prefix), its name does not look like a secret's (orchestrator.redact.SECRET_NAME), and its
value is then redacted (orchestrator.redact.redact_text): a credential in another shape (a DSN, a header, a
token) that a tuning variable should never hold is masked anyway.

Nothing outside the groups is recorded: not the shell's settings, not cloud or CI credentials, not MLflow's or
Ray's addresses (the run knows where it is), whatever their names.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Mapping

from orchestrator.redact import SECRET_NAME, redact_text


@dataclass(frozen=True)
class Recorded:
    """A group of environment variables recorded with a run, and why they are worth recording."""
    why: str
    """What the variables change in a measurement (the reason they are recorded)."""
    names: tuple[str, ...] = ()
    """Variables recorded by their exact name."""
    prefixes: tuple[str, ...] = ()
    """Tuning namespaces recorded whole (every variable whose name starts with one)."""

    def allows(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


# the scheduler's fields of the job a sweep runs in (Slurm's output environment variables)
SLURM_JOB_FIELDS = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                    "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
                    "SLURM_CPUS_PER_TASK", "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE",
                    "SLURM_JOB_GPUS", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT",
                    "SLURM_CLUSTER_NAME", "SLURM_STEP_ID", "MOE_AUTOTUNE_SLURM_JOB_ID")

RECORDED = (
    Recorded("NCCL's settings (algorithms, protocols, channels, network interfaces, debug level) change how fast "
             "collectives run: a measurement cannot be reproduced without them",
             prefixes=("NCCL_", "TORCH_NCCL_")),
    Recorded("CUDA's runtime settings (visible devices, device max connections, launch blocking, allocator) "
             "change what a trial runs on and how it overlaps",
             names=("PYTORCH_CUDA_ALLOC_CONF", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE"), prefixes=("CUDA_",)),
    Recorded("Transformer Engine's switches (NVTE_*) choose its kernels and fusions (attention backends, FP8)",
             prefixes=("NVTE_",)),
    Recorded("PyTorch's settings (TORCH_*: compile, distributed debug, CUDA architectures) change what is measured",
             prefixes=("TORCH_",)),
    Recorded("thread counts bound the CPU side of every rank (data loading, the CPU trainer)",
             names=("OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"), prefixes=("OMP_", "MKL_")),
    Recorded("the scheduler's job fields link a run to the Slurm job (and nodes) it ran in",
             names=SLURM_JOB_FIELDS),
    Recorded("moe-autotune's own switches that change a trial: injected faults, the trainer module",
             names=("MOE_AUTOTUNE_FAULT", "MOE_AUTOTUNE_FAULT_RANK", "MOE_AUTOTUNE_TRAINER_MODULE")),
)

# the software whose version a run records (looked up in the installed packages' metadata: nothing is imported)
SOFTWARE = ("moe-autotune", "optuna", "mlflow", "ray", "torch", "megatron-core", "transformer-engine",
            "numpy", "pydantic", "sqlalchemy")


def recorded_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed variables of `environ` (default: this process's), secret-named ones dropped, values redacted."""
    environ = os.environ if environ is None else environ
    return {name: redact_text(value) for name, value in sorted(environ.items())
            if any(group.allows(name) for group in RECORDED) and not SECRET_NAME.search(name)}


def software_versions() -> dict[str, str | None]:
    """Python, the platform and each of SOFTWARE's installed version (None when it is not installed)."""
    versions: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist in SOFTWARE:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def recorded_environment() -> dict[str, Any]:
    """environment.json: the software's versions and the allowed variables."""
    return {"versions": software_versions(), "variables": recorded_variables()}
