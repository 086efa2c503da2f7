"""Fencing tokens kept by the store itself: a write of a driver that lost its study's lease is refused by the store,
not only by the driver's own look before it writes.

The lease (orchestrator/sweep/lease.py) gives each driver that takes a study a higher epoch. Taking it, the driver
raises the study's fence in the store to its epoch (`fence_writes`); from then on every write that driver's storage
commits is checked, in the same transaction or under the same lock as the write, against the fence: a fence raised
past its epoch refuses the write with LeaseLost (exit 5), and the write does not land. A driver paused between its
own look at the lease and the write after it (the gap the lease alone cannot close: Optuna's storages have no
compare-and-set) is refused here.

- SQL (SQLite, PostgreSQL): a table of the study's fence epochs, `moe_autotune_fence`, beside Optuna's. A session
  that wrote flushes its writes, then reads the fence before it commits (PostgreSQL: FOR SHARE, so a rival's raise
  waits for the commit or is seen by it; SQLite: the write lock is already held after the flush).
- A journal file: the fence epochs in `<journal>.fence`, read before each append and raised only under a lock of
  their own (`<journal>.fence.lock`), held around the read and the append (always before the journal's own lock).

Readers and other commands (status, check, report) open storages without a fence: only a sweep's driver is fenced.
"""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path
from typing import Any, Callable

import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from sqlalchemy import event

from orchestrator.errors import LeaseLost

FENCE_TABLE = "moe_autotune_fence"
FENCE_SUFFIX = ".fence"  # beside a journal: its studies' fence epochs
_CREATE = sqlalchemy.text(f"CREATE TABLE IF NOT EXISTS {FENCE_TABLE} (study_name VARCHAR(512) PRIMARY KEY, "
                          "epoch INTEGER NOT NULL)")
# a driver's storage object -> the fences of the studies it holds (a driver holds one; a process may hold several)
_SQL_FENCES: "weakref.WeakKeyDictionary[Any, dict[str, _SqlFence]]" = weakref.WeakKeyDictionary()
_JOURNAL_BACKENDS: "weakref.WeakKeyDictionary[Any, FencedJournalBackend]" = weakref.WeakKeyDictionary()


def fence_writes(storage: optuna.storages.BaseStorage, study_name: str, epoch: int) -> None:
    """Raise `study_name`'s fence in the store to `epoch` (LeaseLost when it is already past it: a later driver took
    the study), and from now on refuse every write of `storage` once the fence has moved past `epoch` (a driver that
    lost a study writes nothing more, to any study). A storage kept in memory has no other writer: nothing to fence."""
    if isinstance(storage, optuna.storages.RDBStorage):
        fence = _SqlFence(storage, study_name, epoch)
        fence.raise_epoch()
        if storage not in _SQL_FENCES:
            fence.listen()
        _SQL_FENCES.setdefault(storage, {})[study_name] = fence
    elif storage in _JOURNAL_BACKENDS:
        _JOURNAL_BACKENDS[storage].fence(study_name, epoch)


def superseded(study_name: str, epoch: int, stored: int) -> LeaseLost:
    return LeaseLost(f"study {study_name!r} was taken over by a driver of epoch {stored} while this driver (epoch "
                     f"{epoch}) was paused or cut off: the store refused its write; it stops without writing anything "
                     "more")


class _SqlFence:
    """The fence of one study in an Optuna RDBStorage's database, checked before each commit that wrote."""

    def __init__(self, storage: optuna.storages.RDBStorage, study_name: str, epoch: int):
        self.storage, self.study_name, self.epoch = storage, study_name, epoch
        self.share = " FOR SHARE" if storage.engine.dialect.name == "postgresql" else ""

    def listen(self) -> None:
        """Every commit of the storage's sessions that wrote is checked against its current fence (_SQL_FENCES)."""
        sessions = self.storage.scoped_session
        event.listen(sessions, "after_flush", _mark_flushed)
        event.listen(sessions, "do_orm_execute", _mark_executed)  # Optuna's upserts bypass the flush
        event.listen(sessions, "before_commit", _checker(self.storage))

    def raise_epoch(self) -> None:
        self._create_table()
        self._raise()

    def _create_table(self) -> None:
        try:
            with self.storage.engine.begin() as conn:
                conn.execute(_CREATE)
        except sqlalchemy.exc.IntegrityError:  # PostgreSQL: two drivers creating the table at once, the other won
            pass

    def _raise(self) -> None:
        """The fence raised to this epoch in one statement; refused when a later driver's epoch is stored."""
        with self.storage.engine.begin() as conn:
            if conn.execute(sqlalchemy.text(f"UPDATE {FENCE_TABLE} SET epoch = :e WHERE study_name = :n AND "
                                            "epoch <= :e"), {"n": self.study_name, "e": self.epoch}).rowcount:
                return
            stored = self._read(conn)
            if stored is not None:
                raise superseded(self.study_name, self.epoch, stored)
            conn.execute(sqlalchemy.text(f"INSERT INTO {FENCE_TABLE} (study_name, epoch) VALUES (:n, :e)"),
                         {"n": self.study_name, "e": self.epoch})

    def _read(self, conn: Any) -> int | None:
        row = conn.execute(sqlalchemy.text(f"SELECT epoch FROM {FENCE_TABLE} WHERE study_name = :n{self.share}"),
                           {"n": self.study_name}).first()
        return None if row is None else int(row[0])

    def check(self, session: Any) -> None:
        """Before a commit that wrote (flushed): refused once the study's fence has moved past this epoch."""
        stored = self._read(session.connection())
        if stored is not None and stored != self.epoch:
            raise superseded(self.study_name, self.epoch, stored)


def _checker(storage: optuna.storages.RDBStorage) -> Callable[[Any], None]:
    """The before-commit check of `storage`'s sessions: a commit that wrote meets the storage's current fence."""
    owner = weakref.ref(storage)

    def check(session: Any) -> None:
        if not (session.new or session.dirty or session.deleted or session.info.pop("fence_written", False)):
            return  # a read: nothing to refuse
        fenced = owner()
        fences = _SQL_FENCES.get(fenced, {}) if fenced is not None else {}
        if fences:
            session.flush()  # the write lock taken (SQLite) before the fence is read: no raise can come between
            session.info.pop("fence_written", None)
        for fence in fences.values():
            fence.check(session)

    return check


def _mark_flushed(session: Any, _flush_context: Any) -> None:
    session.info["fence_written"] = True


def _mark_executed(state: Any) -> None:
    if state.is_insert or state.is_update or state.is_delete:
        state.session.info["fence_written"] = True


class FencedJournalBackend(JournalFileBackend):
    """Optuna's journal file backend whose appends, once fenced, first check the study's fence epoch under the
    fence's own lock (`fence_writes`); unfenced, it is Optuna's backend."""

    def __init__(self, file_path: str):
        super().__init__(file_path)
        self.fence_path = Path(file_path + FENCE_SUFFIX)
        self.fenced: dict[str, int] = {}  # the studies this driver holds, by the epoch it holds each at

    def register(self, storage: optuna.storages.BaseStorage) -> optuna.storages.BaseStorage:
        """The journal storage over this backend, known to `fence_writes`."""
        _JOURNAL_BACKENDS[storage] = self
        return storage

    def fence(self, study_name: str, epoch: int) -> None:
        with self._fence_lock():
            epochs = self._epochs()
            if epochs.get(study_name, 0) > epoch:
                raise superseded(study_name, epoch, epochs[study_name])
            epochs[study_name] = epoch
            fresh = self.fence_path.with_name(self.fence_path.name + f".{os.getpid()}")
            fresh.write_text(json.dumps(epochs))
            os.replace(fresh, self.fence_path)  # a reader sees the old epochs or the new, never half
        self.fenced[study_name] = epoch

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        if not self.fenced:
            super().append_logs(logs)
            return
        with self._fence_lock():
            stored = self._epochs()
            for name, epoch in self.fenced.items():
                if stored.get(name, 0) != epoch:
                    raise superseded(name, epoch, stored.get(name, 0))
            super().append_logs(logs)

    def _epochs(self) -> dict[str, int]:
        try:
            return {str(k): int(v) for k, v in json.loads(self.fence_path.read_text()).items()}
        except FileNotFoundError:
            return {}

    def _fence_lock(self) -> "_Held":
        return _Held(JournalFileSymlinkLock(str(self.fence_path)))


class _Held:
    """An Optuna journal lock held for a `with` block."""

    def __init__(self, lock: JournalFileSymlinkLock):
        self.lock = lock

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()
