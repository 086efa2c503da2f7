"""`sqlite:///path`: the study in a SQLite file (made whole at its first opening, waited for while another process
holds it locked; orchestrator/storage/sqlite_files.py)."""

from __future__ import annotations

from pathlib import Path

import optuna

from orchestrator.storage.base import OPTUNA, StudyStore
from orchestrator.storage.files import require_writable
from orchestrator.storage.rdb import open_rdb, optuna_schema
from orchestrator.storage.sqlite_files import create_sqlite, require_table, require_unlocked, sqlite_file
from orchestrator.storage.write_guard import guard

OPTUNA_TABLE = "studies"  # the table every Optuna store has from its first opening


class SqliteStudyStore(StudyStore):
    kind = "SQLite file"

    @property
    def path(self) -> Path | None:
        return sqlite_file(self.url)  # None for an in-memory database

    def check(self, resume: bool) -> None:
        if resume:
            self.require_existing("nothing to resume")
        path = self.path
        if path is not None:
            require_writable(path, self.url, OPTUNA)
            if path.exists():
                require_unlocked(path, OPTUNA, self.shown)

    def may_be_held(self) -> bool:
        """Only while some connection has it open: then its write-ahead log lies beside it (a file nobody has open
        is not read early, which would leave -wal and -shm beside a file that may refuse them)."""
        path = self.path
        return path is not None and path.with_name(path.name + "-wal").exists()

    def require_existing(self, hint: str) -> None:
        self.path  # noqa: B018 -- a path no file can have: one line before the file system is asked
        require_table(self.url, OPTUNA_TABLE, OPTUNA, self.shown, f" ({hint})")

    def open(self, create: bool = True, attempts: int = 10) -> optuna.storages.BaseStorage:
        path = self.path
        if create and path is not None:
            try:
                create_sqlite(path, optuna_schema)
            except Exception as exc:  # noqa: BLE001 -- a full disk, a folder that refuses the file
                raise self.failure(exc, "cannot create") from None
        storage = open_rdb(self, attempts, schema_races=False)
        if create and path is not None:  # a sweep's: its WAL would take writes on past a read-only file
            assert isinstance(storage, optuna.storages.RDBStorage)
            guard(storage.engine, path)
        return storage
