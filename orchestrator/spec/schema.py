"""The sweep spec: one YAML file, validated by pydantic; every field has a default.

Bad input becomes one `SpecError` line naming the field and, where it helps, the allowed values.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from search_spaces.bounded import loads_yaml
from search_spaces.errors import SpecError
from search_spaces.inputs import (
    MAX_GBS,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_LAYERS,
    MAX_MODEL_WIDTH,
    MAX_SEQ_LEN,
    check_name,
    read_text_file,
)
from search_spaces.layouts.layout import BY_NAME, DEFAULT_FREE, FIELD_NAMES, SEARCH_DIMENSIONS
from search_spaces.pydantic_line import one_line, short

from orchestrator.dispatch import BACKENDS, DEFAULT_BACKEND, canonical_backend
from orchestrator.search.table import DEFAULT_SEARCH
from orchestrator.spec.economics import Cost
from orchestrator.spec.stopping import Stopping

OBJECTIVES = ("tokens_per_sec_per_gpu", "peak_memory_gib")
# backends whose trials are predictions or recordings, not measurements of this cluster
WHAT_IF_BACKENDS = tuple(name for name, kind in BACKENDS.items() if kind.what_if)
# the choices of `backend:` and `search:` written out, so that the type checker sees them too; a conformance test
# (tests/orchestrator/test_conformance.py) holds them equal to their tables, BACKENDS and SEARCH_KINDS
BackendName = Literal["ray", "analytic", "replay"]
SearchName = Literal["calibrated", "tpe", "random", "grid"]
# What defines the situation a study measures: `--resume` refuses a spec that changes one of these (the
# budget, the search and its seed, where MLflow or Ray live, timeouts ... may change between runs).
SITUATION_FIELDS = ("model", "seq_len", "gpu", "nodes", "gpus_per_node", "gbs", "model_overrides", "backend",
                    "replay_table")
MAX_SEED = 2 ** 32 - 1  # numpy's and Optuna's samplers take seeds in [0, 2**32 - 1]

# the embedded default Optuna storage: a journal file in the working folder. A finished trial is one appended line
# there, where SQLite's RDBStorage runs ~96 statements (bench/sweep_speed.py); SQLite stays one --storage away.
DEFAULT_STORAGE = "journal:///optuna.journal"


class _Strict(BaseModel):
    # the string under each field below is its documentation (shown by `SweepSpec.model_fields[name].description`);
    # defaults are given as `default=`, the only form mypy's dataclass_transform reads as one
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class Budget(_Strict):
    n_trials: int = Field(default=8, ge=1, strict=True)
    """Trials that run, counted over the study's life (--resume adds up to it); cost-model rejections are free."""
    wall_time_s: float | None = Field(default=None, gt=0, strict=True, allow_inf_nan=False)
    """Stop proposing after this many seconds (running trials finish)."""
    max_concurrent: int = Field(default=1, ge=1, strict=True)
    """Trials in flight at once."""
    max_proposals_per_trial: int = Field(default=20, ge=1, strict=True)
    """Proposals allowed per counted trial before the sweep gives up finding new layouts."""
    converge_below: float | None = Field(default=0.05, gt=0, lt=1, allow_inf_nan=False)
    """Stop once the calibrated search finds the chance that a layout beats its answer (the measured layout it believes
    fastest) by more than `converge_margin` below this; `n_trials` stays the ceiling, and a sweep that reaches it
    first says how likely a better layout still is. None: run to n_trials. The calibrated search only (on the
    search-efficiency landscapes 0.05 ended 1 sweep in 30 more than 2% off the optimum: bench/gpu_hours.py)."""
    converge_margin: float = Field(default=0.02, gt=0, lt=1, allow_inf_nan=False)
    """How much better (relative tokens/s/GPU) a layout must be to count for `converge_below`."""


class ModelOverrides(_Strict):
    num_layers: int | None = Field(default=None, ge=1, le=MAX_LAYERS, strict=True)
    """Fewer (or more) decoder layers than the catalog model: a smaller model for CPU runs."""
    hidden_size: int | None = Field(default=None, ge=1, le=MAX_MODEL_WIDTH, strict=True)
    """Another width than the catalog model (heads and head_dim kept)."""


class Packing(_Strict):
    """How a training sample is built (search_spaces/cost/packing.py)."""
    mode: Literal["full", "packed"] = "full"
    """full: one document of seq_len tokens per sequence (causal attention over all of it); packed: whole
    documents of the `lengths` histogram packed into each sequence (Megatron-Core's THD format, attention causal
    within each document), ranked by real tokens/s."""
    lengths: str | None = None
    """The document-length histogram `moe-autotune lengths --out FILE` writes (needed by packed)."""

    @model_validator(mode="after")
    def _lengths_given(self) -> "Packing":
        if self.mode == "packed" and not self.lengths:
            raise ValueError("packing mode packed needs lengths: a document-length histogram file "
                             "(`moe-autotune lengths DATA --out FILE`)")
        if self.mode == "full" and self.lengths:
            raise ValueError("packing lengths is only read with mode: packed")
        if self.lengths:
            from search_spaces.cost.packing import load_histogram
            load_histogram(self.lengths)  # a missing or broken file is refused before anything starts
        return self

    def histogram(self, seq_len: int):
        """The histogram packed (None for full), its documents checked against seq_len."""
        if self.mode != "packed":
            return None
        from search_spaces.cost.packing import load_histogram
        assert self.lengths is not None, "packed needs lengths (_lengths_given)"
        hist = load_histogram(self.lengths)
        hist.check_fits(seq_len)
        return hist


class SweepSpec(_Strict):
    name: str = "moe-autotune-sweep"
    """The study's name (Optuna) and the MLflow experiment's; letters, digits, '.', '_', '-'."""
    model: str = "tiny-moe"
    """A catalog model (search_spaces/catalog/hf_configs) or the path of a Hugging Face config.json."""
    seq_len: int = Field(default=4096, ge=1, le=MAX_SEQ_LEN, strict=True)
    """Tokens per sequence. A list (`seq_len: [32768, 65536]`) is a length family: one sub-sweep per length, in
    order, each seeded from the previous length's best layouts (it is stored in `lengths`)."""
    lengths: list[int] | None = None
    """The lengths of a length family (set from a seq_len list); None for one length."""
    gpu: str = "h100"
    """The GPU (hardware catalog: h100 h200 b200 b300 gb200 gb300, or cpu for the CPU trainer)."""
    nodes: int = Field(default=1, ge=1, le=MAX_GPUS, strict=True)
    """Nodes of the target cluster (the layouts are for nodes x gpus_per_node GPUs)."""
    gpus_per_node: int = Field(default=8, ge=1, le=MAX_GPUS_PER_NODE, strict=True)
    """GPUs per node (CPU ranks on cpu)."""
    gbs: int | None = Field(default=None, ge=1, le=MAX_GBS, strict=True)
    """Global batch in sequences; default ~16M tokens per step (8 sequences on cpu)."""
    free: list[str] = Field(default_factory=lambda: list(DEFAULT_FREE))
    """The layout dimensions the sweep varies; the others stay at the first rule of thumb's values. Default: every
    searchable dimension but the opt-in ones (routing: name it to search token dropping, capacity:1.0, beside
    dropless routing)."""
    fixed: dict[str, Any] = Field(default_factory=dict)
    """Layout fields held at a value (any field of search_spaces.layouts.layout.Layout)."""
    budget: Budget = Field(default_factory=Budget)
    """How many trials, for how long, how many at once."""
    objectives: list[str] = Field(default_factory=lambda: list(OBJECTIVES))
    """Maximise tokens/s/GPU, minimise peak memory (fixed for now)."""
    steps: int = Field(default=5, ge=1, strict=True)
    """Training steps per trial, warm-up included."""
    warmup: int = Field(default=2, ge=0, strict=True)
    """Steps not timed."""
    trial_timeout_s: float = Field(default=900.0, gt=0, strict=True, allow_inf_nan=False)
    """A trial still running after this many seconds is killed with its process tree (status timeout)."""
    placement_timeout_s: float = Field(default=300.0, gt=0, strict=True, allow_inf_nan=False)
    """backend ray: a trial whose GPUs (CPU ranks on cpu) the Ray cluster has not given it after this many seconds
    is given up, never started (status unschedulable, free like a rejection); time spent queued behind the sweep's
    own running trials does not count. A trial that asks for more than the cluster has is refused at once."""
    backend: BackendName = cast(BackendName, DEFAULT_BACKEND)
    """Where trials run (orchestrator.dispatch.BACKENDS): ray, the real trainer through Ray (`local` is accepted
    for it); analytic, the cost model; replay, a recorded table."""
    tracking_uri: str = "sqlite:///mlflow.db"
    """MLflow tracking URI, or none."""
    experiment: str | None = None
    """The MLflow experiment; default the study's name (a length family shares its family's)."""
    storage: str = DEFAULT_STORAGE
    """Optuna storage URL (the source of truth of the sweep): a journal file (`journal:///path`, the default:
    orchestrator/storage/journal.py), a SQLite file (`sqlite:///path`) or a database server (`postgresql://...`)."""
    model_overrides: ModelOverrides = Field(default_factory=ModelOverrides)
    """A smaller (or narrower) copy of the model."""
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, strict=True)
    """The sampler's seed: the same seed proposes the same layouts."""
    search: SearchName = cast(SearchName, DEFAULT_SEARCH)
    """How layouts are proposed (orchestrator.search.table.SEARCH_KINDS): calibrated (default), the cost model's
    ranking corrected from every measurement; tpe, random, grid: the baselines bench/search_efficiency.py
    compares."""
    ray_address: str | None = None
    """Join this Ray cluster (default: start a local one)."""
    workdir: str = "moe-autotune-runs"
    """Trial directories (logs, results) and the spools."""
    trainer_module: str = "trainers.megatron_moe"
    """The trainer module a trial runs."""
    launcher: Literal["torchrun", "python"] = "torchrun"
    """torchrun for the real trainer; python runs the module as one process (test trainers)."""
    replay_table: str | None = None
    """The CSV of backend replay (the columns `status --csv` writes)."""
    fidelity: Literal["auto", "full", "proxy"] = "auto"
    """full: every trial at the target size; proxy: on the fewest GPUs that reproduce its per-GPU work,
    composed back to full size (search_spaces/proxy.py); auto: full when it fits in trial_gpus."""
    trial_gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS, strict=True)
    """The most GPUs one trial may use (default: the whole target cluster); sizes the Slurm allocation."""
    cost: Cost = Field(default_factory=Cost)
    """Dollars per GPU-hour and the tokens to train: the time and money per layout and for the sweep."""
    track_rejected: bool | None = None
    """A child MLflow run (status KILLED, tag status infeasible) for each proposal the cost model rejected. Default
    no: a rejected proposal never ran, so it is a row of the parent run's `rejected_by_model` table, not a run that
    looks like a trial."""
    calibration: str | None = None
    """A calibration file (`moe-autotune calibrate --out FILE`) the cost model uses instead of the packaged
    constants: screening, ranking and the predictions beside each measurement; recorded in MLflow."""
    software: str | None = None
    """The NeMo / Megatron-Bridge container release the cluster runs ("25.11"): the cost model's predictions at the
    speed that release reached on this GPU in published rows (search_spaces/catalog/maturity.py); default: the
    newest."""
    packing: Packing = Field(default_factory=Packing)
    """How samples are built: full-length documents (default) or documents packed from a length histogram."""
    stopping: Stopping = Field(default_factory=Stopping)
    """When a running trial is decided and stopped: measured enough, cannot win, will not fit (each can be off)."""

    @field_validator("software")
    @classmethod
    def _software_release(cls, value: str | None) -> str | None:
        if value is not None:
            from search_spaces.catalog.maturity import parse_release
            parse_release(value)  # a release the maturity table cannot read is refused before anything starts
        return value

    @field_validator("calibration")
    @classmethod
    def _calibration_file(cls, value: str | None) -> str | None:
        if value is not None:
            from search_spaces.calibration.fit import load_calibration
            load_calibration(value)  # a missing or broken file is refused before anything starts
        return value

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict) and "study_name" in data:
            data = dict(data)
            if "name" in data:
                raise ValueError("give either name or study_name, not both")
            data["name"] = data.pop("study_name")
        if isinstance(data, dict) and isinstance(data.get("seq_len"), list):
            data = dict(data)
            lengths = data.pop("seq_len")
            if not lengths or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_SEQ_LEN
                                      for x in lengths):
                raise ValueError(f"seq_len: a length family is a list of integers in [1, {MAX_SEQ_LEN}], got "
                                 f"{short(lengths)}")
            if lengths != sorted(set(lengths)):
                raise ValueError(f"seq_len: a length family runs shortest first, each length once, got {lengths!r}")
            data.update(seq_len=lengths[0], lengths=lengths if len(lengths) > 1 else None)
        return data

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_name(cls, value: Any) -> Any:
        """An alias (`local`) is recorded as the backend's own name (`ray`); an unknown one is pydantic's error."""
        try:
            return canonical_backend(value) if isinstance(value, str) else value
        except SpecError:
            return value

    @field_validator("name", "experiment")
    @classmethod
    def _plain_name(cls, value: str | None, info) -> str | None:  # info: pydantic's ValidationInfo
        if value is not None:
            try:
                check_name(value, info.field_name)  # the one rule for names (search_spaces/inputs.py)
            except SpecError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("model", "gpu", "trainer_module")
    @classmethod
    def _no_shell_chars(cls, value: str) -> str:
        if not value or re.search(r"[\s;&|`$<>'\"\\*?(){}]", value):
            raise ValueError(f"{value!r} contains spaces or shell characters")
        return value

    @field_validator("free")
    @classmethod
    def _known_dims(cls, value: list[str]) -> list[str]:
        for dim in value:
            if dim not in SEARCH_DIMENSIONS:
                raise ValueError(f"unknown dimension {dim!r}; allowed: {', '.join(SEARCH_DIMENSIONS)}")
        return list(dict.fromkeys(value))

    @field_validator("fixed")
    @classmethod
    def _known_fixed(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key not in FIELD_NAMES:
                raise ValueError(f"unknown layout field {key!r}; allowed: {', '.join(FIELD_NAMES)}")
            parsed = BY_NAME[key].parse(value[key])  # SpecError names a bad value
            limit = MAX_GBS if key == "gbs" else MAX_GPUS  # a size no cluster has would only make loops long
            if type(parsed) is int and parsed > limit:
                raise ValueError(f"layout field {key} must be <= {limit:,}, got {short(parsed)}")
        return value

    @field_validator("objectives")
    @classmethod
    def _known_objectives(cls, value: list[str]) -> list[str]:
        if sorted(value) != sorted(OBJECTIVES):
            raise ValueError(f"objectives are fixed for now: {', '.join(OBJECTIVES)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "SweepSpec":
        if self.num_gpus > MAX_GPUS:
            raise ValueError(f"nodes x gpus_per_node ({self.nodes} x {self.gpus_per_node} = {self.num_gpus:,}) is "
                             f"more than {MAX_GPUS:,} GPUs (2**20), more than any cluster has")
        if self.packing.mode == "packed" and not self.lengths:  # a length family checks each length's sub-sweep
            self.packing.histogram(self.seq_len)
        if self.warmup >= self.steps:
            raise ValueError(f"warmup ({self.warmup}) must be smaller than steps ({self.steps})")
        if self.backend == "replay" and not self.replay_table:
            raise ValueError("backend replay needs replay_table")
        if self.trial_gpus is not None and self.trial_gpus > self.num_gpus:
            raise ValueError(f"trial_gpus ({self.trial_gpus}) is more than the target cluster's "
                             f"{self.num_gpus} GPUs (nodes x gpus_per_node)")
        if self.fidelity == "full" and self.trial_gpus is not None and self.trial_gpus < self.num_gpus:
            raise ValueError(f"fidelity full runs every trial on {self.num_gpus} GPUs, more than trial_gpus "
                             f"({self.trial_gpus}); use fidelity auto or proxy")
        return self

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def smallest_trial(self) -> tuple[int, int]:
        """(nodes, GPUs per node) of the smallest trial a sweep of this spec can ask a cluster for: the full size when
        every trial runs at full size (orchestrator/sweep/fidelity.py: trial_size), else one GPU (a proxy's size is
        known only with its layout)."""
        if self.fidelity == "full" or (self.fidelity == "auto" and self.num_gpus <= (self.trial_gpus or self.num_gpus)):
            return self.nodes, self.gpus_per_node
        return 1, 1

    @property
    def experiment_name(self) -> str:
        return self.experiment or self.name

    def at_length(self, seq_len: int) -> "SweepSpec":
        """One sub-sweep of a length family: its own study (`<name>-<seq_len>`) in the family's experiment."""
        return self.model_copy(update={"seq_len": seq_len, "lengths": None, "name": f"{self.name}-{seq_len}",
                                       "experiment": self.experiment_name})

    @property
    def tracks_rejections(self) -> bool:
        return bool(self.track_rejected)  # only when asked (issue 56: a rejection is not a trial)

    def situation(self) -> dict[str, Any]:
        """The fields that define what the study measures (SITUATION_FIELDS); a replay table by its content."""
        data = self.model_dump(mode="json")
        out = {name: data[name] for name in SITUATION_FIELDS}
        if self.packing.mode == "packed":  # a packed study's situation includes its documents (by content)
            assert self.packing.lengths is not None, "packed needs lengths (Packing._lengths_given)"
            with open(self.packing.lengths, "rb") as fh:
                out["packing"] = "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()
        if self.replay_table and Path(self.replay_table).is_file():
            with open(self.replay_table, "rb") as fh:  # streamed: the table is read whole (and bounded) elsewhere
                out["replay_table"] = "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()
        return out


def parse_spec(data: dict[str, Any] | None, overrides: dict[str, Any] | None = None) -> SweepSpec:
    """Validate a spec dict plus command-line overrides (None values mean "not given")."""
    data = dict(data or {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in ("n_trials", "max_concurrent", "wall_time_s"):
            data["budget"] = {**dict(data.get("budget") or {}), key: value}
        elif key == "study_name":
            data.pop("study_name", None)
            data["name"] = value
        else:
            data[key] = value
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(one_line(exc, SweepSpec, noun="spec field", whole="spec")) from None


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepSpec:
    """Read and validate a spec file (at most 1 MiB of UTF-8 YAML within search_spaces.bounded's bounds: no
    anchors/aliases or duplicate keys, nesting and integers bounded)."""
    path = Path(path)
    data = loads_yaml(read_text_file(path, "spec file"), f"spec {path}")
    if data is not None and not isinstance(data, dict):
        raise SpecError(f"spec {path}: top level must be a mapping of fields")
    return parse_spec(data, overrides)
