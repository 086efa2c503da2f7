"""One driver per study: a lease with a heartbeat and an epoch, kept in the study's own storage (a study user
attr), and a fence that every write of the driver passes first.

A second `sweep --resume` (or `confirm`) of a study whose driver is alive refuses with one line naming
that driver. A driver that died leaves its lease behind; its successor takes it over when the holder's
process is gone (same host: a paused process is alive, so its lease is never taken there) or its heartbeat has
not advanced for the lease timeout (another host: each heartbeat counts up `Holder.beat`, and the successor
watches that count for the timeout by its own monotonic clock; no two hosts' clocks are compared, so a host whose
clock runs ahead or behind can neither take a live lease nor keep a dead one; a silent holder is presumed dead).

Presumed dead is not dead: a driver paused (SIGSTOP, a frozen VM) past its lease timeout wakes up with the
lease taken. Every write of a driver (study.ask and tell, trial user attrs, MLflow records, the result spool)
is fenced: `fence()` reads the lease from the storage and, when another driver (a later epoch) holds it or it
was released, raises `LeaseLost`: the driver stops with one line and exit code 5, writing nothing more.
The fence is read right before each group of Optuna writes and before every single MLflow call that writes
(orchestrator/tracking/client.py's FencedClient). A driver paused between the fence's read and the write that follows
it is refused by the Optuna store itself: taking the lease raises the study's fencing epoch in the store, and the store
checks it in the same transaction (or under the same lock) as each write (orchestrator/storage/fencing.py). MLflow's
stores keep no such token: that one MLflow write can land, and a resume closes its run as orphaned. Within half the
timeout of the driver's own write of the lease no rival can have taken it, and the fence reads nothing: a sweep pays
one read per heartbeat there, not one per write.

Taking a lease is claim-then-write. A driver first creates the claim of the next epoch: a study of its own, named
for the study and the epoch (`claim_name`). Creating a name is the one write every
Optuna
storage makes atomically: of two drivers creating it, one gets DuplicatedStudyError (a unique key in SQL). Only the
driver that created the claim of epoch N writes the lease with epoch N, so a rival whose read of the lease has gone
stale, by any delay, can never overwrite a lease another driver took: it finds the claim taken, or (once the winner
has dropped it) the lease's epoch already at N. No wait is needed, and none is made. A claim lives only while its
driver takes the lease; one left by a claimant that died is passed over (its epoch skipped) and dropped.

Test-only settings (environment): MOE_AUTOTUNE_LEASE_TIMEOUT_S shortens the lease timeout (the heartbeat
follows at a quarter of it); MOE_AUTOTUNE_LEASE_HOST names the host the driver claims to run on, so that two
drivers on one machine can play two hosts; MOE_AUTOTUNE_LEASE_CLOCK_SKEW_S sets that host's wall clock off (what its
heartbeats say they were written at).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna

from orchestrator.errors import LeaseLost, StorageError
from orchestrator.records import StudyRecord
from orchestrator.storage import studies
from orchestrator.storage.fencing import fence_writes

STALE_AFTER_S = 120.0  # longer than anything the loop blocks on (an MLflow request times out in 30 s)
HEARTBEAT_EVERY_S = 10.0
CLAIMANT_WAIT_S = 10.0  # a claim's creator writes who it is right after creating it: a claim still silent after
# this long was left by a claimant that died between the two writes
MAX_PASSED_CLAIMS = 8  # dead claimants' epochs passed over in a row: more is a storage fought over, not a crash
TIMEOUT_ENV = "MOE_AUTOTUNE_LEASE_TIMEOUT_S"  # tests only
HOST_ENV = "MOE_AUTOTUNE_LEASE_HOST"  # tests only
CLOCK_SKEW_ENV = "MOE_AUTOTUNE_LEASE_CLOCK_SKEW_S"  # tests only: this host's wall clock runs off by this much

log = logging.getLogger(__name__)


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
    """time.time() of its last heartbeat, by its own host's clock: shown, never compared with another host's clock."""
    beat: int = 0
    """How many heartbeats it has written: another host sees it alive when this advances (Lease._watch)."""

    @classmethod
    def of(cls, study: Any) -> "Holder | None":
        """The study's lease holder, read from the storage now; None when released (or not a lease)."""
        return cls.stored(study)[0]

    @staticmethod
    def stored(study: Any) -> "tuple[Holder | None, int]":
        """The study's lease as stored now: its holder (None when released) and the last epoch a driver took."""
        lease = StudyRecord.lease_of(study)
        return _holder_of(lease["driver_lease"]), _epoch_number(lease["driver_lease_epoch"])

    def to_attr(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def here(self) -> bool:
        """Does its driver run on this host (where its process can be asked: `process_alive`)?"""
        return self.host == this_host()

    @property
    def process_alive(self) -> bool:
        """Is its driver's process, on this host, still there (a paused process is alive)?"""
        try:
            os.kill(int(self.pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: alive
            return True
        except (TypeError, ValueError, OverflowError):
            return False
        return int(self.pid) > 0

    def __str__(self) -> str:
        try:
            age = f"{time.time() - float(self.heartbeat):.0f} s ago"
        except (TypeError, ValueError):
            age = "unknown"
        return f"pid {self.pid} on {self.host} (heartbeat {age})"


@dataclass
class Lease:
    study: optuna.Study
    storage: studies.StudyStorage
    """The study's storage: where the claims are created (claim_name)."""
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    host: str = field(default_factory=this_host)
    pid: int = field(default_factory=os.getpid)
    epoch: int = 0  # 1 + the epoch of the lease this driver took (a later driver's is higher)
    lost: bool = False
    _beat: float = 0.0
    _beats: int = 0  # heartbeats written: Holder.beat

    def acquire(self) -> None:
        """Take the lease, or refuse (StorageError, one line naming the driver that holds it or is taking it)."""
        holder = self._gone_holder()
        passed: list[int] = []
        self.epoch = self._claim(max(_epoch(holder), self._recorded_epoch()) + 1, passed)
        try:
            now = Holder.of(self.study)  # read after our claim was created: no later write can precede it
            other = now is not None and now.token not in (self.token, holder.token if holder else None)
            if max(_epoch(now), self._recorded_epoch()) >= self.epoch or other:
                raise self._taken_at_once(now)  # our first read was stale: another driver took this epoch
            try:
                fence_writes(self.storage, self.study.study_name, self.epoch)  # the store refuses older epochs
            except LeaseLost:
                raise self._taken_at_once(None) from None
            self._write()
            if self._claim_id(self.epoch + 1) is not None:  # presumed dead while claiming: the next one is taken
                raise self._taken_at_once(None)
            self.store(driver_lease_epoch=self.epoch)
        finally:
            self._drop_claim(self.epoch)
        for epoch in passed:  # dead claimants' claims: once the lease is ours nobody can take their epochs
            self._drop_claim(epoch)

    def _gone_holder(self) -> Holder | None:
        """The lease's holder once it is known to be gone (None: no lease, or ours); refuses (StorageError) while it
        is alive. On this host its process answers; from another host only its heartbeats can: it is alive when its
        beat count advances within the lease timeout, watched by this host's monotonic clock (no two hosts' clocks
        are ever compared, so a host whose clock is off can neither take a live lease nor keep a dead one)."""
        holder = Holder.of(self.study)
        for _ in range(MAX_PASSED_CLAIMS):
            if holder is None or holder.token == self.token:
                return holder
            if holder.here:
                if holder.process_alive:
                    raise self.refusal(holder)
                return holder
            now = self._watch(lambda: _sign(Holder.of(self.study)), _sign(holder))
            if now is _UNCHANGED:  # silent for the whole timeout: dead (or paused: its writes are fenced)
                return holder
            if now is not None and now[0] == holder.token:  # it beat: alive
                raise self.refusal(holder)
            holder = Holder.of(self.study)  # released, or taken by another meanwhile: judge that one
        raise self.refusal(holder)

    def refusal(self, holder: Holder | None) -> StorageError:
        """The one line that refuses a driver while `holder` runs the study (also for a resume that finds the
        study's storage locked by it: orchestrator/sweep/held.py)."""
        return StorageError(f"study {self.study.study_name!r} is being run by {holder or 'another driver'}; wait "
                            f"for it to finish or stop it (a lease whose driver died is taken over once its "
                            f"heartbeat has not advanced for {stale_after_s():.0f} s, at once on its own host)")

    @staticmethod
    def _watch(read: Callable[[], Any], seen: Any) -> Any:
        """Read `read()` until it differs from `seen` (returned) or the lease timeout passes on this host's monotonic
        clock (_UNCHANGED)."""
        deadline = time.monotonic() + stale_after_s()
        while time.monotonic() < deadline:
            time.sleep(min(heartbeat_every_s() / 4, 1.0))
            now = read()
            if now != seen:
                return now
        return _UNCHANGED

    def _claim(self, epoch: int, passed: list[int]) -> int:
        """Create the claim of `epoch`, or of a later one when `epoch`'s claimant died (appended to `passed`);
        the epoch claimed. A live claimant (taking the lease at this moment) refuses this driver."""
        while len(passed) <= MAX_PASSED_CLAIMS:
            try:
                claim = self.storage.create_new_study([optuna.study.StudyDirection.MINIMIZE],
                                                      self._claim_name(epoch))
            except optuna.exceptions.DuplicatedStudyError:
                claimant = self._claimant(epoch)
                if claimant is not None and self._claiming(epoch, claimant):
                    raise self._taken_at_once(claimant) from None
                passed.append(epoch)
                epoch += 1
                continue
            try:
                self.storage.set_study_user_attr(claim, "claimant", self._holder(epoch).to_attr())
            except KeyError:  # dropped already: a rival found it silent past CLAIMANT_WAIT_S and passed over it
                raise self._taken_at_once(None) from None
            return epoch
        raise StorageError(f"study {self.study.study_name!r}: {MAX_PASSED_CLAIMS} drivers in a row died while "
                           f"taking its lease; run again once no other driver of it is starting")

    def _claimant(self, epoch: int) -> Holder | None:
        """Who created the claim of `epoch` (None: a claimant that died before saying so, or a claim dropped)."""
        deadline = time.monotonic() + CLAIMANT_WAIT_S
        while True:
            claim = self._claim_id(epoch)
            if claim is None:  # dropped: its driver took the lease (alive, refused by the read that follows)
                return Holder.of(self.study)
            try:
                data = self.storage.get_study_user_attrs(claim).get("claimant")
            except KeyError:  # dropped as it was read: asked again above
                continue
            if data or time.monotonic() > deadline:
                return _holder_of(data)
            time.sleep(0.05)

    def _claiming(self, epoch: int, claimant: Holder) -> bool:
        """Is the claimant of `epoch` still taking the lease (or has it taken it)? Its process on this host; from
        another host, its claim changes (dropped once it holds the lease) within the lease timeout."""
        if self._claim_id(epoch) is None:  # dropped: it went on and took the lease
            return True
        if claimant.here:
            return claimant.process_alive
        return self._watch(lambda: self._claim_id(epoch), self._claim_id(epoch)) is not _UNCHANGED

    def _claim_id(self, epoch: int) -> int | None:
        try:
            return self.storage.get_study_id_from_name(self._claim_name(epoch))
        except KeyError:  # Optuna's answer for a name it does not hold
            return None

    def _drop_claim(self, epoch: int) -> None:
        claim = self._claim_id(epoch)
        if claim is None:
            return
        try:
            self.storage.delete_study(claim)
        except KeyError:
            log.debug("the claim of epoch %d was dropped by another driver", epoch)

    def _recorded_epoch(self) -> int:
        return Holder.stored(self.study)[1]

    def _taken_at_once(self, other: Holder | None) -> StorageError:
        # the same refusal as a lease found held, in the same words: another driver took it as this one did
        return StorageError(f"study {self.study.study_name!r} is being run by {other or 'another driver'}, "
                            f"which took it at the same moment as this driver")

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

    def quiet_until(self) -> float:
        """The monotonic time (the host's clock, shared by its processes) before which no rival can have taken
        the lease: where `fence` reads nothing. 0 once it is lost or before it is held. The sweep's MLflow writer,
        another process of this host, writes only before it (orchestrator/tracking/write_behind.py,
        Tracker.write_behind)."""
        if self.lost or not self._beat:
            return 0.0
        return self._beat + stale_after_s() / 2

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
            self.store(driver_lease=None)

    def _lost(self, now: Holder | None) -> LeaseLost:
        by = f"by {now} (epoch {now.epoch})" if now else "and released by another driver"
        return LeaseLost(f"study {self.study.study_name!r} was taken over {by} while this driver (epoch "
                         f"{self.epoch}) was paused or cut off for longer than the {stale_after_s():.0f} s lease; "
                         f"it stops without writing anything more")

    def _holder(self, epoch: int) -> Holder:
        return Holder(self.token, epoch, self.host, self.pid, time.time() + _clock_skew_s(), self._beats)

    def _write(self) -> None:
        self._beats += 1
        self.store(driver_lease=self._holder(self.epoch).to_attr())
        self._beat = time.monotonic()

    def store(self, **attrs: Any) -> None:
        """Write fields of the study's record (StudyRecord): the one way the sweep writes them, by the driver that
        holds the study (the lease's own fields, and the session's spec, situation, budget and MLflow ids)."""
        StudyRecord.write(self.study, **attrs)

    def _claim_name(self, epoch: int) -> str:
        return claim_name(self.study.study_name, epoch)


def claim_name(study_name: str, epoch: int) -> str:
    """The name of the study a driver creates to claim `epoch` of `study_name`'s lease: it never clashes with a
    study's name, and the stores' readers never show it (orchestrator.storage.studies.LEASE_CLAIM_MARK)."""
    return f"{study_name}{studies.LEASE_CLAIM_MARK}{epoch}"


def _clock_skew_s() -> float:
    """A test's skew of this host's wall clock (CLOCK_SKEW_ENV): the lease never compares it with another's."""
    try:
        return float(os.environ.get(CLOCK_SKEW_ENV, "0"))
    except ValueError:
        return 0.0


def _holder_of(data: Any) -> Holder | None:
    """A Holder from its stored dict (one stored before beats were counted: beat 0); None when released, or not a
    lease."""
    try:
        return Holder(**{f: data[f] for f in Holder.__dataclass_fields__ if f != "beat"},
                      beat=data.get("beat", 0)) if data else None
    except (KeyError, TypeError, AttributeError):
        return None


_UNCHANGED = object()  # Lease._watch: nothing changed within the lease timeout


def _sign(holder: Holder | None) -> tuple[str, Any] | None:
    """What changes when a holder beats, releases or is replaced: its token and beat count."""
    return (holder.token, holder.beat) if holder else None


def _epoch(holder: Holder | None) -> int:
    return _epoch_number(holder.epoch) if holder else 0


def _epoch_number(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
