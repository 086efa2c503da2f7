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
follows it could still make that one write; the fence is read right before each group of Optuna writes and
before every single MLflow call that writes, orchestrator/tracking.py's _FencedClient.) Within half the timeout
of the driver's own write of the lease no rival can have taken it, and the fence reads nothing: a sweep pays one
read per heartbeat there, not one per write.

Taking a lease is write-then-verify: write our token and the next epoch, wait `SETTLE_S`, read it back. Two
drivers that both found the lease free both write; the storage keeps the last write, so after the wait exactly
one of them reads its own token back and the other refuses.

Test-only settings (environment): MOE_AUTOTUNE_LEASE_TIMEOUT_S shortens the lease timeout (the heartbeat
follows at a quarter of it); MOE_AUTOTUNE_LEASE_HOST names the host the driver claims to run on, so that two
drivers on one machine can play two hosts; MOE_AUTOTUNE_LEASE_SETTLE_S shortens the settle wait (the test suite
sets 0 for sweeps that have no rival driver; tests/conftest.py keeps the real wait for the tests about rivals).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import optuna

from orchestrator.errors import LeaseLost, StorageError
from orchestrator.records import StudyRecord

STALE_AFTER_S = 120.0  # longer than anything the loop blocks on (an MLflow request times out in 30 s)
HEARTBEAT_EVERY_S = 10.0
SETTLE_S = 1.0
TIMEOUT_ENV = "MOE_AUTOTUNE_LEASE_TIMEOUT_S"  # tests only
HOST_ENV = "MOE_AUTOTUNE_LEASE_HOST"  # tests only
SETTLE_ENV = "MOE_AUTOTUNE_LEASE_SETTLE_S"  # tests only


def stale_after_s() -> float:
    """The lease timeout: STALE_AFTER_S, or a test's shorter one."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return STALE_AFTER_S
    return value if 0 < value < STALE_AFTER_S else STALE_AFTER_S


def settle_s() -> float:
    """The wait between writing a lease and reading it back: SETTLE_S, or a test's shorter one (0 or more)."""
    try:
        value = float(os.environ.get(SETTLE_ENV, ""))
    except ValueError:
        return SETTLE_S
    return value if 0 <= value < SETTLE_S else SETTLE_S


def heartbeat_every_s() -> float:
    return min(HEARTBEAT_EVERY_S, stale_after_s() / 4)


def this_host() -> str:
    return os.environ.get(HOST_ENV) or socket.gethostname()


@dataclass(frozen=True)
class Holder:
    """The driver holding a study (StudyRecord.driver_lease, stored as a dict of these fields)."""
    token: str
    """This driver's random token: a lease read back with another token is another driver's."""
    epoch: int
    """1 + the epoch of the lease it took (a later driver's is higher)."""
    host: str
    pid: int
    heartbeat: float
    """time.time() of its last heartbeat."""

    @classmethod
    def of(cls, study: Any) -> "Holder | None":
        """The study's lease holder, read from the storage now; None when released (or not a lease)."""
        data = StudyRecord.lease_of(study)
        try:
            return cls(**{f: data[f] for f in cls.__dataclass_fields__}) if data else None
        except (KeyError, TypeError):
            return None

    def to_attr(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def alive(self) -> bool:
        """Is its driver still running? Its process on this host; its heartbeat elsewhere."""
        if self.host == this_host():
            try:
                os.kill(int(self.pid), 0)
            except ProcessLookupError:
                return False
            except PermissionError:  # another user's process: alive
                return True
            except (TypeError, ValueError, OverflowError):
                return False
            return int(self.pid) > 0
        try:
            return time.time() - float(self.heartbeat) < stale_after_s()
        except (TypeError, ValueError):
            return False

    def __str__(self) -> str:
        try:
            age = f"{time.time() - float(self.heartbeat):.0f} s ago"
        except (TypeError, ValueError):
            age = "unknown"
        return f"pid {self.pid} on {self.host} (heartbeat {age})"


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
        holder = Holder.of(self.study)
        if holder and holder.token != self.token and holder.alive:
            raise StorageError(f"study {self.study.study_name!r} is being run by {holder}; wait for it to "
                               f"finish or stop it (a lease whose driver died is taken over after "
                               f"{stale_after_s():.0f} s without a heartbeat, at once on its own host)")
        self.epoch = max(_epoch(holder), StudyRecord.of(self.study).driver_lease_epoch or 0) + 1
        self._write()
        time.sleep(settle_s())
        now = Holder.of(self.study)
        if not now or now.token != self.token:
            # the same refusal as above, in the same words: another driver took the lease as this one did
            raise StorageError(f"study {self.study.study_name!r} is being run by {now or 'another driver'}, which "
                               f"took it at the same moment as this driver")
        StudyRecord.write(self.study, driver_lease_epoch=self.epoch)

    def fence(self) -> None:
        """Before a write: raise LeaseLost when this driver no longer holds the lease. Within half the lease
        timeout of this driver's own last write of the lease, no rival can have taken it (a rival takes a lease
        from another host only once its heartbeat is older than the timeout, from this host only when our process
        is gone): the storage is not read again there (the monotonic clock runs on through a SIGSTOP, so a driver
        paused past that reads it; the other half is the margin for clocks of two hosts that disagree)."""
        if self.lost:
            raise self._lost(None)
        if self._beat and time.monotonic() - self._beat < stale_after_s() / 2:
            return
        now = Holder.of(self.study)
        if not now or now.token != self.token:
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
        now = Holder.of(self.study)
        if now and now.token == self.token:
            StudyRecord.write(self.study, driver_lease=None)

    def _lost(self, now: Holder | None) -> LeaseLost:
        by = f"by {now} (epoch {now.epoch})" if now else "and released by another driver"
        return LeaseLost(f"study {self.study.study_name!r} was taken over {by} while this driver (epoch "
                         f"{self.epoch}) was paused or cut off for longer than the {stale_after_s():.0f} s lease; "
                         f"it stops without writing anything more")

    def _write(self) -> None:
        holder = Holder(self.token, self.epoch, self.host, self.pid, time.time())
        StudyRecord.write(self.study, driver_lease=holder.to_attr())
        self._beat = time.monotonic()


def _epoch(holder: Holder | None) -> int:
    try:
        return int(holder.epoch or 0) if holder else 0
    except (TypeError, ValueError):
        return 0
