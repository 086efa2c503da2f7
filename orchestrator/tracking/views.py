"""How a sweep's MLflow records are named and shown: the tags and params that mark its runs, the experiment's
model-training kind and its saved trials view, the runs page's address, a layout as params."""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

from mlflow import MlflowClient

from search_spaces.bounded import loads_json
from search_spaces.layouts.layout import PARALLEL_SIZES, Layout

from orchestrator.records import TRIAL_TAG, VIEW_METRICS
from orchestrator.redact import redact_uri
from orchestrator.storage import connections
from orchestrator.tracking.client import FencedClient

PARENT_TAG = "moe_autotune.role"
STUDY_TAG = "moe_autotune.study"
SUPERSEDED_TAG = "moe_autotune.superseded_trial"
PROXY_PARAM = "proxy."  # params of the layout a proxy trial ran (its world, layers, changed fields)
# MLflow 3's experiment kind: "custom_model_development" is its model-training view (runs, not traces)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
# a saved view of the runs page (MLflow's "Views" menu), opened by `?viewStateShareKey=<id>`
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
TRIALS_VIEW = "moe-autotune-trials"


def now_ms() -> int:
    """Now, as MLflow's timestamps count it (milliseconds since the epoch)."""
    return int(time.time() * 1000)


def trials_view(free: Iterable[str] | None = None) -> dict[str, Any]:
    """The runs page as the sweep is read: trials ranked by tokens/s/GPU (a metric order lists child runs
    flat, not collapsed under the parent), measured beside predicted, then the searched layout fields."""
    columns = [f"metrics.`{k}`" for k in VIEW_METRICS]
    columns += [f"params.`{k}`" for k in (free or PARALLEL_SIZES)]
    columns += ["tags.`status`", "tags.`fidelity`"]
    # columnOrder puts them first, in this order: the tokens/s column stays in sight on a narrow window
    # trials only: the parent run and a promotion's run (tag moe_autotune.promotion) have no trial number
    return {"searchFilter": f"tags.`{TRIAL_TAG}` LIKE '%'", "orderByKey": "metrics.`tokens_per_sec_per_gpu`",
            "orderByAsc": False, "startTime": "ALL", "lifecycleFilter": "Active", "modelVersionFilter": "All Runs",
            "datasetsFilter": [],
            "selectedColumns": columns, "columnOrder": columns, "runsExpanded": {}}


def mark_training_experiment(client: MlflowClient | connections.BoundedClient | FencedClient, experiment_id: str,
                             free: Iterable[str] | None = None) -> None:
    """Tag the sweep's experiment as a model-training one and give it the trials view (idempotent).

    With `free` (the spec's searched fields) the view shows those params; without, an existing view is kept."""
    tags = client.get_experiment(experiment_id).tags
    if tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    key = VIEW_TAG_PREFIX + TRIALS_VIEW
    old = _saved_view(tags.get(key))
    if old is not None and free is None:
        return
    state = json.dumps(trials_view(free))
    if old is None or old.get("state") != state:
        # the envelope of MLflow 3's saved views: a name in the Views menu, the page state as JSON text
        created = old.get("createdAt", now_ms()) if old else now_ms()
        client.set_experiment_tag(experiment_id, key, json.dumps(
            {"name": "moe-autotune: trials by tokens/s/GPU", "createdAt": created, "updatedAt": now_ms(),
             "state": state}))


def _saved_view(value: str | None) -> dict[str, Any] | None:
    """A saved view's envelope, or None when there is none (or it is not one: it is rewritten)."""
    try:
        view = loads_json(value, "saved view") if value else None  # a tag read back: bounded
    except ValueError:
        return None
    return view if isinstance(view, dict) else None


def runs_page_url(base_url: str, experiment_id: str) -> str:
    """The experiment's runs page in the model-training view, opened on the trials view.

    MLflow 3.17's UI picks the view from `workflowType` in the URL (else the browser's last choice, GenAI by
    default), not from the experiment's tag; later MLflow sources also follow the tag."""
    base_url = redact_uri(base_url)  # printed: a server reached through user-info keeps its password out of it
    return (f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
            f"?workflowType=machine_learning&viewStateShareKey={TRIALS_VIEW}")


def layout_params(layout: Layout) -> dict[str, str]:
    """The layout as MLflow params: every field, encoded as the CSV and Optuna params encode it."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in layout.params().items()}
