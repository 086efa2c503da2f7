"""One move of a registered model's `production` alias at a time (`promote`, `promote --rollback`).

A move reads where `production` points, records it on the version it moves to (`previous_production`: what a
rollback goes back to), then moves the alias. Two moves interleaved would both record the same previous version,
and a rollback would skip the one overwritten. MLflow's registry has no compare-and-set on an alias, but creating a
registered model is atomic (its name is a unique key, in a SQL store and behind a tracking server): the turn to move
model X's alias is the registered model `X.promote-lock`, created by the move that holds it and deleted when it is
done; the others wait (`turn`). The lock's description names its holder (pid, host, a random token).

A holder that died mid-move (a second or so) leaves its lock behind. On its own host, a holder whose process is gone
is taken over at once: the lock is renamed to a name of its own (`X.promote-lock.stale-<token>`), which succeeds for
one waiter only (a registered model is renamed atomically, and never onto a name that exists), then deleted. A
holder on another host is waited for WAIT_S, then named in one line with what to do.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from mlflow.exceptions import MlflowException

from search_spaces.errors import SpecError

log = logging.getLogger("moe_autotune")
LOCK_SUFFIX = ".promote-lock"
WAIT_S = 120.0  # a move takes a few registry calls: a lock held this long is held by a promote that hangs or is gone
# what MLflow answers to a create or rename onto a name that exists, and to a name that is gone meanwhile
_TAKEN, _GONE = "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"


@dataclass(frozen=True)
class Mover:
    """The process holding a model's turn (the lock's description, as JSON)."""
    token: str
    pid: int
    host: str

    @classmethod
    def me(cls) -> "Mover":
        return cls(uuid.uuid4().hex, os.getpid(), socket.gethostname())

    @classmethod
    def read(cls, client: Any, lock: str) -> "Mover | None":
        """The holder of `lock` now; None when it is gone (or holds no description of ours)."""
        try:
            text = client.get_registered_model(lock).description or ""
        except MlflowException as exc:
            if exc.error_code == _GONE:
                return None
            raise
        try:
            data = json.loads(text)
            return cls(str(data["token"]), int(data["pid"]), str(data["host"]))
        except (ValueError, KeyError, TypeError):
            return cls("", 0, "an unknown host")

    def gone(self) -> bool:
        """Its process has ended (known on this host only; a holder elsewhere may be alive)."""
        if self.host != socket.gethostname() or self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except (PermissionError, OverflowError):
            return False
        return False

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"


@contextmanager
def turn(client: Any, name: str) -> Iterator[None]:
    """Hold the turn to move `name`'s alias (waiting for another move to finish) for the `with` block."""
    lock, me = name + LOCK_SUFFIX, Mover.me()
    deadline = time.monotonic() + WAIT_S
    while not _create(client, lock, me):
        holder = Mover.read(client, lock)
        if holder is None:  # released as we looked: try again at once
            continue
        if holder.gone():
            _take_over(client, lock, holder)
            continue
        if time.monotonic() > deadline:
            raise SpecError(f"another promote or rollback of {name} has held its turn for over {WAIT_S:.0f} s "
                            f"({holder}); if that process is gone, delete the registered model {lock!r} (MLflow UI "
                            "or MlflowClient().delete_registered_model) and rerun")
        time.sleep(random.uniform(0.05, 0.25))  # jitter: waiters do not retry in step
    try:
        yield
    finally:
        _release(client, lock, me)


def _create(client: Any, lock: str, me: Mover) -> bool:
    try:
        client.create_registered_model(lock, description=json.dumps(asdict(me)))
    except MlflowException as exc:
        if exc.error_code in (_TAKEN, _GONE):  # GONE: MLflow looked the holder up as it released the lock
            return False
        raise
    return True


def _release(client: Any, lock: str, me: Mover) -> None:
    holder = Mover.read(client, lock)
    if holder is None or holder.token != me.token:  # not ours (never taken from a live holder): leave it
        log.warning("the registry lock %s was no longer this promote's when it finished", lock)
        return
    client.delete_registered_model(lock)


def _take_over(client: Any, lock: str, dead: Mover) -> None:
    """Remove the lock of a holder whose process is gone. The rename onto a name made of the dead holder's token
    succeeds for one waiter only; a waiter that renamed a newer holder's lock (it read the dead one just before another
    waiter took over and a third took the turn) puts it back at once."""
    stale = f"{lock}.stale-{dead.token[:16] or 'unknown'}"
    try:
        client.rename_registered_model(lock, stale)
    except MlflowException as exc:
        if exc.error_code in (_TAKEN, _GONE):
            return  # another waiter removed it
        raise
    renamed = Mover.read(client, stale)
    if renamed is not None and renamed.token != dead.token:
        client.rename_registered_model(stale, lock)
        return
    log.warning("took over the registry lock %s of %s, whose process is gone", lock, dead)
    client.delete_registered_model(stale)
