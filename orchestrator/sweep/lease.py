"""One driver per study: a lease with a heartbeat, kept in the study's own storage (a study user attr).

A second `sweep --resume` (or `confirm`) of a study whose driver is alive refuses with one line naming
that driver. A driver that died leaves its lease behind; its successor takes it over when the holder's
process is gone (same host) or its heartbeat is older than `STALE_AFTER_S` (another host).

Optuna's storage has no compare-and-set, so taking a lease is write-then-verify: write our token, wait
`SETTLE_S`, read it back. Two drivers that both found the lease free both write; the storage keeps the last
write, so after the wait exactly one of them reads its own token back and the other refuses. A holder that
finds another token at a heartbeat has been taken over (it was presumed dead) and stops.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import optuna

from orchestrator.errors import StorageError

LEASE_ATTR = "driver_lease"
STALE_AFTER_S = 120.0  # longer than anything the loop blocks on (an MLflow request times out in 30 s)
HEARTBEAT_EVERY_S = 10.0
SETTLE_S = 1.0


@dataclass
class Lease:
    study: optuna.Study
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    _beat: float = 0.0

    def acquire(self) -> None:
        holder = self.study.user_attrs.get(LEASE_ATTR)
        if holder and holder.get("token") != self.token and _alive(holder):
            raise StorageError(f"study {self.study.study_name!r} is being run by {_who(holder)}; wait for it to "
                               f"finish or stop it (a lease whose driver died is taken over after "
                               f"{STALE_AFTER_S:.0f} s, at once on its own host)")
        self._write()
        time.sleep(SETTLE_S)
        now = self._read()
        if not now or now.get("token") != self.token:
            raise StorageError(f"study {self.study.study_name!r} was taken by {_who(now or {})} at the same moment")

    def heartbeat(self, force: bool = False) -> None:
        """Renew the lease (at most every HEARTBEAT_EVERY_S); a lease taken over stops this driver."""
        if not force and time.monotonic() - self._beat < HEARTBEAT_EVERY_S:
            return
        now = self._read()
        if now and now.get("token") != self.token:
            raise StorageError(f"study {self.study.study_name!r} was taken over by {_who(now)} "
                               f"(this driver's heartbeat was older than {STALE_AFTER_S:.0f} s); stopping")
        self._write()

    def release(self) -> None:
        now = self._read()
        if now and now.get("token") == self.token:
            self.study.set_user_attr(LEASE_ATTR, None)

    def _write(self) -> None:
        self.study.set_user_attr(LEASE_ATTR, {"token": self.token, "host": self.host, "pid": self.pid,
                                              "heartbeat": time.time()})
        self._beat = time.monotonic()

    def _read(self) -> dict[str, Any] | None:
        return self.study.user_attrs.get(LEASE_ATTR)  # read from the storage on every access


def _alive(holder: dict[str, Any]) -> bool:
    """Is the holder's driver still running? Its process on this host; its heartbeat elsewhere."""
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder.get("pid", 0)), 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: alive
            return True
        return int(holder.get("pid", 0)) > 0
    return time.time() - float(holder.get("heartbeat", 0.0)) < STALE_AFTER_S


def _who(holder: dict[str, Any]) -> str:
    age = time.time() - float(holder.get("heartbeat", time.time()))
    return f"pid {holder.get('pid')} on {holder.get('host')} (heartbeat {age:.0f} s ago)"
