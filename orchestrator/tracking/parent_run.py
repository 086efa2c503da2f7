"""What a sweep's parent run holds: its spec, environment, calibration and packed-length files and, where the spec's
model is a config.json, how it was read (as `moe-autotune model` shows it) when it is made; the sweep's summary,
best figures and views (leaderboard, Pareto plot, report) at the end. Each is logged through the tracker's client
(orchestrator/tracking/client.py: every write behind the sweep's fence)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterable

from mlflow.entities import Metric, Param, RunTag

from orchestrator.redact import redact_mapping, redact_text
from orchestrator.tracking.client import FencedClient
from orchestrator.tracking.environment import recorded_environment
from orchestrator.tracking.views import now_ms

LEADERBOARD_TABLE = "leaderboard.json"
MODEL_READING = "model_reading.json"  # and model_reading.txt: the reading as data and as `moe-autotune model` prints it
READING_PARAMS = ("total_params", "active_params", "layers", "moe_layers", "experts", "topk")
PATTERN_TAG_MAX = 5000


def safe_environment() -> dict[str, Any]:
    """environment.json: the software's versions and the allow-listed variables, redacted
    (orchestrator/tracking/environment.py)."""
    return recorded_environment()


def log_parent_files(client: FencedClient, run_id: str, spec: dict[str, Any]) -> None:
    """A new parent run's files: the spec, the environment, the model's reading (a config.json's), the calibration
    file and the packed lengths it used."""
    client.log_text(run_id, json.dumps(redact_mapping(spec), indent=2), "spec.json")
    client.log_dict(run_id, safe_environment(), "environment.json")
    _log_model_reading(client, run_id, spec)
    if spec.get("calibration"):
        _log_calibration(client, run_id, Path(spec["calibration"]))
    if (spec.get("packing") or {}).get("mode") == "packed":
        _log_packing(client, run_id, Path(spec["packing"]["lengths"]))


def model_reading(spec: dict[str, Any]) -> dict[str, Any] | None:
    """How the spec's model was read (search_spaces.catalog.reading.describe, `moe-autotune model --json`) as the
    sweep tunes it, its model_overrides applied; None where the model is a catalog name, not a config.json."""
    from search_spaces.catalog.models import MODEL_NAMES, load_model
    from search_spaces.catalog.reading import describe

    name = str(spec.get("model") or "").strip()
    if not name or name in MODEL_NAMES:  # no model (a tracker's own tests) or a catalog name: nothing was read
        return None
    model, overrides = load_model(name), spec.get("model_overrides") or {}
    if overrides.get("num_layers") is not None or overrides.get("hidden_size") is not None:
        model = model.with_overrides(num_layers=overrides.get("num_layers"), hidden_size=overrides.get("hidden_size"))
    return describe(model)


def _log_model_reading(client: FencedClient, run_id: str, spec: dict[str, Any]) -> None:
    """A config.json's reading: model_reading.json (the data) and model_reading.txt (the lines `moe-autotune model`
    prints) as artifacts; the figures a run list compares as params (model.total_params, model.active_params,
    model.layers, model.moe_layers, model.experts, model.topk) and the layers by kind, compressed, as the tag
    model.pattern (`12 × [dense+chunked, MoE+chunked, dense+chunked, MoE+global]`)."""
    from search_spaces.catalog.reading import reading_lines

    reading = model_reading(spec)
    if reading is None:
        return
    reading = redact_mapping(reading)
    client.log_dict(run_id, reading, MODEL_READING)
    client.log_text(run_id, "\n".join(reading_lines(reading)) + "\n", "model_reading.txt")
    pattern = reading["pattern"]  # whole in the artifacts; a tag holds 5,000 characters on older servers
    pattern = pattern if len(pattern) <= PATTERN_TAG_MAX else pattern[:PATTERN_TAG_MAX - 1] + "…"
    client.log_batch(run_id, params=[Param(f"model.{k}", str(reading[k])) for k in READING_PARAMS],
                     tags=[RunTag("model.pattern", pattern)])


def _log_calibration(client: FencedClient, run_id: str, path: Path) -> None:
    """The calibration file the cost model used: a param (its name and content hash) and the file itself."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    client.log_param(run_id, "calibration", redact_text(f"{path.name} sha256:{digest[:16]}"))
    client.log_artifact(run_id, str(path), "calibration")


def _log_packing(client: FencedClient, run_id: str, path: Path) -> None:
    """Packed documents: the distribution's summary as params and the histogram file as an artifact."""
    from search_spaces.cost.packing import load_histogram

    summary = load_histogram(path).describe()
    client.log_param(run_id, "packing", "packed")
    for key in ("documents", "mean_tokens", "median_tokens", "p90_tokens", "longest_tokens",
                "token_weighted_median"):
        client.log_param(run_id, f"packing.{key}", summary[key])
    client.log_dict(run_id, redact_mapping(summary), "packing/summary.json")
    client.log_artifact(run_id, str(path), "packing")


def log_summary(client: FencedClient, run_id: str | None, summary: dict[str, Any], pareto_csv: str | None,
                status: str) -> None:
    """The sweep's end: its best trial's figures and layout, the summary and Pareto CSV; the run closed."""
    best = summary.get("best") or {}
    metrics = [Metric(f"best_{k}", float(v), now_ms(), 0) for k, v in (best.get("measured") or {}).items()
               if _finite(v)]
    tags = [RunTag(f"best.{k}", str(v)) for k, v in (best.get("layout") or {}).items()]
    tags += [RunTag("best_layout_key", str(best.get("layout_key", ""))),
             RunTag("n_trials", str(summary.get("n_trials", "")))]
    if "rejected_by_model" in summary:
        metrics.append(Metric("rejected_by_model", float(len(summary["rejected_by_model"])), now_ms(), 0))
    # the trials by lifecycle state (trials_finished, trials_failed, trials_rejected, ...) and the GPU-hours spent
    metrics += [Metric(f"trials_{state}", float(n), now_ms(), 0)
                for state, n in (summary.get("trials_by_state") or {}).items()]
    metrics += [Metric(key, float(summary[key]), now_ms(), 0) for key in ("gpu_hours", "gpu_hours_to_best")
                if _finite(summary.get(key))]
    if summary.get("gpu_hours_predicted"):
        tags.append(RunTag("gpu_hours", "predicted: a what-if backend's trials, nothing ran"))
    client.log_batch(run_id, metrics=metrics, tags=tags)
    client.log_dict(run_id, redact_mapping(summary), "summary.json")
    if pareto_csv is not None:
        client.log_text(run_id, redact_text(pareto_csv), "pareto.csv")
    client.set_terminated(run_id, status)


def log_views(client: FencedClient, run_id: str | None, leaderboard: Any, pareto_figure: Any,
              report_files: Iterable[Path]) -> None:
    """The sweep's views: the leaderboard (a DataFrame) as an MLflow table and a CSV, the Pareto plot (a plotly
    figure, opens offline) and the report's files (under report/)."""
    if LEADERBOARD_TABLE in {a.path for a in client.list_artifacts(run_id)}:
        # log_table would append to a resumed sweep's table: the whole table replaces it instead
        client.log_text(run_id, leaderboard.to_json(orient="split", index=False, date_format="iso"),
                        LEADERBOARD_TABLE)
    else:
        client.log_table(run_id, leaderboard, LEADERBOARD_TABLE)
    client.log_text(run_id, leaderboard.to_csv(index=False), "leaderboard.csv")
    client.log_figure(run_id, pareto_figure, "pareto.html",
                      save_kwargs={"include_plotlyjs": True})  # inlined: MLflow's default is a CDN
    for path in report_files:
        client.log_artifact(run_id, str(path), "report")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
