"""The suite's template MLflow stores (tests/store_templates.py) are the stores MLflow's migrations make: a store
opened through the template has the same schema, Alembic revision and behaviour as one MLflow migrated itself."""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy
from mlflow import MlflowClient

from tests import store_templates

CONSTRAINT_WORDS = ("CONSTRAINT ", "CHECK ", "FOREIGN KEY", "UNIQUE ", "PRIMARY KEY")


def _statement(sql: str | None) -> tuple:
    """A CREATE statement: its columns in order, its table constraints as a set. MLflow's batch migrations
    rebuild tables with the constraints in set order (hash order: it differs between two processes that both
    migrate), so two stores MLflow itself made can list the same constraints in another order."""
    if sql is None:
        return (None,)
    lines = [line.strip().rstrip(",") for line in sql.splitlines()]
    constraints = frozenset(line for line in lines if line.startswith(CONSTRAINT_WORDS))
    return tuple(line for line in lines if not line.startswith(CONSTRAINT_WORDS)), constraints


def _schema(path) -> tuple[list, list]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        revision = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    finally:
        conn.close()
    return [(kind, name, table, _statement(sql)) for kind, name, table, sql in rows], revision


def test_a_store_made_from_the_template_is_the_one_mlflow_migrates(tmp_path):
    assert store_templates.installed(), "tests/conftest.py installs the template for the session"
    migrated = tmp_path / "migrated.db"
    engine = store_templates.scratch_engine(migrated)
    try:
        store_templates._real_initialize(engine)  # MLflow's own migrations, as without the suite's template
    finally:
        engine.dispose()
    copied = tmp_path / "copied.db"
    client = MlflowClient(f"sqlite:///{copied}")  # through the template
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "tokens_per_sec", 1.5)
    assert _schema(copied) == _schema(migrated)
    assert _schema(copied)[1]  # an Alembic revision was recorded (the store is at MLflow's head)
    assert client.get_run(run.info.run_id).data.metrics == {"tokens_per_sec": 1.5}


def test_a_template_copy_fails_like_mlflow_where_the_store_cannot_be_written(tmp_path):
    """A database file that refuses writes: the copy gives way to MLflow's own migration, which fails as it would."""
    target = tmp_path / "readonly.db"
    sqlite3.connect(target).close()
    engine = sqlalchemy.create_engine(f"sqlite:///file:{target}?mode=ro&uri=true",
                                      poolclass=sqlalchemy.pool.NullPool)
    try:
        with pytest.raises(sqlalchemy.exc.OperationalError, match="readonly"):
            store_templates._initialize_tables(engine)
    finally:
        engine.dispose()
