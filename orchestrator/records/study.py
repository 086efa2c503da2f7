"""StudyRecord: what the sweep stores of the study (its situation, spec, budget, MLflow ids, lease)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from orchestrator.records.stored import TABLE, Stored, stored
from orchestrator.redact import without_masked_userinfo
from orchestrator.spec.economics import Cost

# the spec's fields that hold a URI (stored without credentials)
URI_FIELDS = ("tracking_uri", "storage", "ray_address")


@dataclass(frozen=True)
class StudyRecord(Stored):
    """What the sweep stores of the study (its user attrs); the context falls back to the spec for older studies."""
    name: str = ""
    """The study's name (Optuna's)."""
    model: str | None = stored("The model swept (catalog name or config.json path).", TABLE)
    gpu: str | None = stored("The GPU (hardware catalog name).", TABLE)
    num_gpus: int | None = stored("GPUs of the target cluster (nodes x gpus_per_node).", TABLE)
    seq_len: int | None = stored("Tokens per sequence.", TABLE)
    spec: dict[str, Any] = stored("The sweep spec as run (SweepSpec in JSON), redacted (orchestrator.redact).",
                                  factory=dict)
    situation: dict[str, Any] | None = stored("The fields that define what the study measures (SITUATION_FIELDS); "
                                              "--resume refuses a spec that changes one.")
    backend: str | None = stored("The backend of the study's trials (BACKENDS; `local` before it was `ray`).")
    memory_limit_gib: float | None = stored("The GPU memory a layout must fit in (GiB).")
    tracking_uri: str | None = stored("The MLflow tracking URI, or none; stored without credentials (a client reads "
                                      "them from its own settings: MLFLOW_TRACKING_USERNAME/PASSWORD, PGPASSWORD).")
    family: str | None = stored("The MLflow experiment (a length family's name, shared by its lengths).")
    budget: dict[str, Any] = stored("The spec's budget (Budget.model_dump()), as last run.", factory=dict)
    mlflow_experiment_id: str | None = stored("The sweep's MLflow experiment.")
    mlflow_parent_run_id: str | None = stored("The sweep's MLflow parent run.")
    driver_lease: dict[str, Any] | None = stored("The driver holding the study (orchestrator.sweep.lease): token, "
                                                 "epoch, host, pid, heartbeat; None when released.")
    driver_lease_epoch: int | None = stored("The last lease epoch taken (a later driver's is higher).")
    answer: int | None = stored("The trial the sweep chose as its answer when it stopped: the measured layout its "
                                "search believes fastest (the calibrated search's posterior, not the luckiest run); "
                                "None: the best measured trial is the answer.")
    stopped: str | None = stored("Why the sweep's last run stopped, in words: converged (with the chance that a layout "
                                 "beats the answer), its budget reached (with that chance where the search tells "
                                 "it), every layout tried, its proposals cap. None: it has not stopped on its own.")

    @classmethod
    def of(cls, study: Any) -> "StudyRecord":
        """The record of an Optuna study (or a study summary), the context filled from the spec where an older
        study did not record it."""
        attrs = study.user_attrs
        read = cls._read(attrs)
        spec = read.get("spec") or {}
        if spec:  # URIs were stored without their credentials (orchestrator.redact): read back usable
            read["spec"] = spec = {k: without_masked_userinfo(v) if k in URI_FIELDS else v for k, v in spec.items()}
        if "tracking_uri" in read:
            read["tracking_uri"] = without_masked_userinfo(read["tracking_uri"])
        fallbacks = {"model": spec.get("model"), "seq_len": spec.get("seq_len"), "gpu": spec.get("gpu"),
                     "backend": spec.get("backend"), "tracking_uri": spec.get("tracking_uri"),
                     "num_gpus": (spec.get("nodes") or 1) * (spec.get("gpus_per_node") or 1) if spec else None}
        for key, value in cls._read(fallbacks).items():
            read.setdefault(key, value)
        return cls(name=study.study_name, **read)

    @classmethod
    def lease_of(cls, study: Any) -> dict[str, Any]:
        """The study's `driver_lease` and `driver_lease_epoch` alone, read from the storage now: what the driver's
        fence asks before each group of writes (orchestrator/sweep/lease.py), without reading the rest back."""
        attrs = study.user_attrs
        read = cls._read({name: attrs.get(name) for name in ("driver_lease", "driver_lease_epoch")})
        return {name: read.get(name) for name in ("driver_lease", "driver_lease_epoch")}

    @property
    def gpus_per_node(self) -> int:
        return int(self.spec.get("gpus_per_node") or min(8, int(self.num_gpus or 1)))

    @property
    def model_overrides(self) -> dict[str, Any]:
        return self.spec.get("model_overrides") or {}

    @property
    def cost(self) -> Cost:
        """The spec's `cost:` (dollars per GPU-hour, tokens to train); empty when it has none (or a bad one)."""
        try:
            return Cost.model_validate(self.spec.get("cost") or {})
        except ValidationError:
            return Cost()

    @property
    def n_trials(self) -> int | None:
        """The budget's trials, as last run."""
        n = self.budget.get("n_trials")
        return n if isinstance(n, int) else None

    @property
    def track_rejected(self) -> bool | None:
        return self.spec.get("track_rejected")

    @property
    def stored_situation(self) -> dict[str, Any]:
        """The situation recorded; a study from before situations were recorded: what its spec said."""
        return self.situation if self.situation is not None else dict(self.spec)
