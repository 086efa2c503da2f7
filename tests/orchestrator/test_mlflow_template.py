"""A new SQLite MLflow store copied from a migrated template is the store MLflow's migrations make
(orchestrator/storage/mlflow_template.py), and without a usable cache folder the store is migrated in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each store in its own working folder (MLflow's Default experiment keeps its artifact location from there); how
# many times MLflow's migrations ran for it; its schema, schema version and experiments.
SCRIPT = textwrap.dedent("""
    import json, os, sqlite3, sys
    import mlflow.store.db.utils as db_utils
    from orchestrator.storage import sqlite_tuning
    from orchestrator.storage import tracking_store

    sqlite_tuning.install()  # every SQLite connection in WAL, as in a sweep's process

    runs = []
    real = db_utils._initialize_tables
    def counted(engine):
        runs.append(1)
        return real(engine)
    db_utils._initialize_tables = counted

    out = {}
    for folder, cache in json.loads(sys.argv[1]):
        os.environ["MOE_AUTOTUNE_CACHE_DIR"] = cache
        os.chdir(folder)
        before = len(runs)
        tracking_store(f"sqlite:///{folder}/mlflow.db").ready(create=True)
        db = sqlite3.connect(f"{folder}/mlflow.db")
        out[folder] = {"migrations": len(runs) - before,
                       "schema": sorted(sorted(line.strip().rstrip(",") for line in r[0].splitlines())
                                         for r in db.execute("SELECT sql FROM sqlite_master") if r[0]),
                       "version": db.execute("SELECT version_num FROM alembic_version").fetchall(),
                       "experiments": db.execute("SELECT experiment_id, name, artifact_location FROM experiments")
                                        .fetchall()}
    print(json.dumps(out))
""")


def _make_stores(plan: list[tuple[Path, Path]]) -> dict:
    for folder, _ in plan:
        folder.mkdir()
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([[str(f), str(c)] for f, c in plan])],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow  # three stores, two sets of MLflow migrations: about 10 s
def test_a_store_copied_from_the_template_is_the_store_the_migrations_make(tmp_path):
    cache = tmp_path / "cache"
    unusable = tmp_path / "a-file" / "cache"  # its parent is a file: no folder can be made there
    (tmp_path / "a-file").write_text("")
    first, second, in_place = tmp_path / "first", tmp_path / "second", tmp_path / "in-place"
    made = _make_stores([(first, cache), (second, cache), (in_place, unusable)])
    # the first store's migrations made the template, the second is a copy, the third migrated in place
    assert [made[str(f)]["migrations"] for f in (first, second, in_place)] == [1, 0, 1]
    assert [p.name for p in cache.iterdir()] == [next(cache.iterdir()).name]  # one template, nothing beside it
    assert next(cache.iterdir()).name.startswith("mlflow-") and not list(tmp_path.glob("a-file*/**/*.db"))
    # the same tables, columns, constraints, indexes and schema version (MLflow's own migrations order the statements,
    # and a table's constraints, differently from run to run: compared as sets)
    assert made[str(first)]["schema"] == made[str(second)]["schema"] == made[str(in_place)]["schema"]
    assert made[str(first)]["version"] == made[str(second)]["version"] == made[str(in_place)]["version"]
    for folder in (first, second, in_place):  # each store's Default experiment is its own, not the template's
        assert made[str(folder)]["experiments"] == [[0, "Default", f"{folder}/mlruns/0"]]


@pytest.mark.slow  # two sets of MLflow migrations: about 8 s
def test_a_damaged_or_foreign_template_is_made_again(tmp_path):
    import mlflow

    cache = tmp_path / "cache"
    cache.mkdir()
    template = cache / f"mlflow-{mlflow.__version__}-schema.db"
    template.write_bytes(b"not a database")
    made = _make_stores([(tmp_path / "store", cache), (tmp_path / "again", cache)])
    assert [made[str(tmp_path / f)]["migrations"] for f in ("store", "again")] == [1, 0]
    assert made[str(tmp_path / "store")]["schema"] == made[str(tmp_path / "again")]["schema"]
    assert template.read_bytes().startswith(b"SQLite format 3\x00")
