"""One driver per study: a lease with a heartbeat and an epoch, kept in the study's own storage (a study user
attr), and a fence that every write of the driver passes first.

A second `sweep --resume` (or `confirm`) of a study whose driver is alive refuses with one line naming
that driver. A driver that died leaves its lease behind; its successor takes it over when the holder's
process is gone (same host: a paused process is alive, so its lease is never taken there) or its heartbeat is
older than the lease timeout (another host: a fresh heartbeat is the only sign of life we can see, so a holder
whose heartbeat is fresh is never taken; a stale one is presumed dead).

Presumed dead is not dead: a driver paused (SIGSTOP, a frozen VM) past its lease timeout wakes up with the
lease taken. Every write of a driver (study.ask and tell, trial user attrs, MLflow records, the result spool)
is fenced: `fence()` reads the lease from the storage and, when another driver (a later epoch) holds it or it
was released, raises `LeaseLost`: the driver stops with one line and exit code 5, writing nothing more.
(Optuna's storage has no compare-and-set, so a driver paused between the fence's read and the write that
follows it could still make that one write; the fence is read right before each group of writes.)

Taking a lease is write-then-verify: write our token and the next epoch, wait `SETTLE_S`, read it back. Two
drivers that both found the lease free both write; the storage keeps the last write, so after the wait exactly
one of them reads its own token back and the other refuses.

Test-only settings (environment): MOE_AUTOTUNE_LEASE_TIMEOUT_S shortens the lease timeout (the heartbeat
follows at a quarter of it); MOE_AUTOTUNE_LEASE_HOST names the host the driver claims to run on, so that two
drivers on one machine can play two hosts.
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
EPOCH_ATTR = "driver_lease_epoch"  # the last epoch taken (the lease itself is cleared on release)
STALE_AFTER_S = 120.0  # longer than anything the loop blocks on (an MLflow request times out in 30 s)
HEARTBEAT_EVERY_S = 10.0
SETTLE_S = 1.0
TIMEOUT_ENV = "MOE_AUTOTUNE_LEASE_TIMEOUT_S"  # tests only
HOST_ENV = "MOE_AUTOTUNE_LEASE_HOST"  # tests only


class LeaseLost(StorageError):
    """Another driver took this study over (this one was presumed dead); this one writes nothing more."""
    exit_code = 5


def stale_after_s() -> float:
    """The lease timeout: STALE_AFTER_S, or a test's shorter one."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return STALE_AFTER_S
    return value if 0 < value < STALE_AFTER_S else STALE_AFTER_S


def heartbeat_every_s() -> float:
    return min(HEARTBEAT_EVERY_S, stale_after_s() / 4)


def this_host() -> str:
    return os.environ.get(HOST_ENV) or socket.gethostname()


@dataclass
class Lease:
    study: optuna.Study
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    host: str = field(default_factory=this_host)
    pid: int = field(default_factory=os.getpid)
    epoch: int = 0  # 1 + the epoch of the lease this driver took (a later driver's is higher)
    lost: bool = False
    _beat: float = 0.0

    def acquire(self) -> None:
        holder = self._read()
        if holder and holder.get("token") != self.token and _alive(holder):
            raise StorageError(f"study {self.study.study_name!r} is being run by {_who(holder)}; wait for it to "
                               f"finish or stop it (a lease whose driver died is taken over after "
                               f"{stale_after_s():.0f} s without a heartbeat, at once on its own host)")
        self.epoch = max(_epoch(holder), _epoch(self.study.user_attrs.get(EPOCH_ATTR))) + 1
        self._write()
        time.sleep(SETTLE_S)
        now = self._read()
        if not now or now.get("token") != self.token:
            raise StorageError(f"study {self.study.study_name!r} was taken by {_who(now or {})} at the same moment")
        self.study.set_user_attr(EPOCH_ATTR, self.epoch)

    def fence(self) -> None:
        """Before a write: raise LeaseLost when this driver no longer holds the lease."""
        if self.lost:
            raise self._lost(None)
        now = self._read()
        if not now or now.get("token") != self.token:
            self.lost = True
            raise self._lost(now)

    def heartbeat(self, force: bool = False) -> None:
        """Renew the lease (at most every heartbeat_every_s()); a lease taken over stops this driver."""
        if not force and time.monotonic() - self._beat < heartbeat_every_s():
            return
        self.fence()
        self._write()

    def release(self) -> None:
        if self.lost:
            return
        now = self._read()
        if now and now.get("token") == self.token:
            self.study.set_user_attr(LEASE_ATTR, None)

    def _lost(self, now: dict[str, Any] | None) -> LeaseLost:
        by = f"by {_who(now)} (epoch {_epoch(now)})" if now else "and released by another driver"
        return LeaseLost(f"study {self.study.study_name!r} was taken over {by} while this driver (epoch "
                         f"{self.epoch}) was paused or cut off for longer than the {stale_after_s():.0f} s lease; "
                         f"it stops without writing anything more")

    def _write(self) -> None:
        self.study.set_user_attr(LEASE_ATTR, {"token": self.token, "epoch": self.epoch, "host": self.host,
                                              "pid": self.pid, "heartbeat": time.time()})
        self._beat = time.monotonic()

    def _read(self) -> dict[str, Any] | None:
        holder = self.study.user_attrs.get(LEASE_ATTR)  # read from the storage on every access
        return holder if isinstance(holder, dict) else None


def _epoch(holder: Any) -> int:
    value = holder.get("epoch", 0) if isinstance(holder, dict) else holder
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _alive(holder: dict[str, Any]) -> bool:
    """Is the holder's driver still running? Its process on this host; its heartbeat elsewhere."""
    if holder.get("host") == this_host():
        try:
            os.kill(int(holder.get("pid", 0)), 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: alive
            return True
        except (TypeError, ValueError, OverflowError):
            return False
        return int(holder.get("pid", 0)) > 0
    try:
        beat = float(holder.get("heartbeat", 0.0))
    except (TypeError, ValueError):
        return False
    return time.time() - beat < stale_after_s()


def _who(holder: dict[str, Any]) -> str:
    try:
        age = f"{time.time() - float(holder.get('heartbeat', time.time())):.0f} s ago"
    except (TypeError, ValueError):
        age = "unknown"
    return f"pid {holder.get('pid')} on {holder.get('host')} (heartbeat {age})"
