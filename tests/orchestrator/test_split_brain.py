"""Split brain (issue 21, class 5): a driver paused past its lease while another takes the study over writes
nothing when it resumes (it stops with one line, exit code 5); a lease whose holder is alive is never taken
(on another host: while its heartbeat is fresh; on its own host: while its process exists, paused or not).

The lease timeout and the host a driver claims are shortened/named by the test-only settings of
orchestrator/sweep/lease.py; slow trials come from the replay backend's test-only delay.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import optuna
import pytest
from mlflow import MlflowClient

from orchestrator.errors import StorageError
from orchestrator.outputs.check import check
from orchestrator.records import StudyRecord, queries
from orchestrator.storage import studies
from orchestrator.storage.fencing import FENCE_SUFFIX
from orchestrator.sweep import lease as leases
from orchestrator.sweep.lease import CLOCK_SKEW_ENV, HOST_ENV, TIMEOUT_ENV, Holder, Lease, LeaseLost
from tests.sweep_helpers import TO_THE_END, measured_count, spec_data

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("moe-autotune"))
TABLE = ROOT / "tests" / "data" / "replay_small.csv"
LEASE_S = 3.0
REPLAY_DELAY_S = 1.0


# ---- the lease on its own: two drivers as two Lease objects on one study -------------------------------------
@pytest.fixture
def storage(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    return optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")


@pytest.fixture
def study(storage):
    return optuna.create_study(study_name="lease", storage=storage)


def _names(storage) -> list[str]:
    return [s.study_name for s in storage.get_all_studies()]


@contextlib.contextmanager
def _beating(beat: Callable[[], None]):
    """`beat()` every heartbeat period in a thread (a live driver on another host) until the block ends."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(leases.heartbeat_every_s()):
            beat()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_write_right_after_a_fence_that_passed_is_refused_by_the_store_once_taken_over(tmp_path, monkeypatch):
    """The gap the lease's own look leaves (paused between `fence()` and the write after it) is closed by the store:
    each driver on a storage of its own, as two processes are (orchestrator/storage/fencing.py)."""
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    first_storage, second_storage = studies.open_storage(url), studies.open_storage(url)
    first = Lease(optuna.create_study(study_name="gap", storage=first_storage), first_storage, host="host-a")
    first.acquire()
    first.fence()  # passes: the write that follows is the one a pause could delay
    second = Lease(optuna.load_study(study_name="gap", storage=second_storage), second_storage, host="host-b")
    second.acquire()
    with pytest.raises(LeaseLost, match="taken over by a driver of epoch 2 .*store refused its write"):
        first.store(family="written after the takeover")
    assert Holder.of(second.study).token == second.token
    assert StudyRecord.of(optuna.load_study(study_name="gap", storage=url)).family is None
    second.store(family="the holder's")
    assert StudyRecord.of(optuna.load_study(study_name="gap", storage=url)).family == "the holder's"


def test_a_live_holder_on_another_host_is_never_taken_and_a_stale_one_is_fenced(study, storage):
    first = Lease(study, storage, host="host-a")
    first.acquire()
    second = Lease(study, storage, host="host-b")
    with _beating(lambda: first.heartbeat(force=True)):
        with pytest.raises(StorageError, match="is being run by pid .* on host-a"):
            second.acquire()  # its beats advance: alive as far as anyone can tell
    # host-a goes silent (paused, or dead: nobody can tell which): taken once its beat stood still for the timeout
    second.acquire()
    assert (first.epoch, second.epoch) == (1, 2)
    # host-a wakes up: every write it would make is fenced, and its own heartbeat does not overwrite the lease
    with pytest.raises(LeaseLost, match=r"taken over by pid \d+ on host-b .*\(epoch 2\).*without writing"):
        first.heartbeat(force=True)
    with pytest.raises(LeaseLost):
        first.fence()
    assert LeaseLost.exit_code == 5
    first.release()
    assert Holder.of(study).token == second.token
    second.fence()  # the holder writes on
    second.release()
    assert Holder.of(study) is None
    with pytest.raises(LeaseLost, match="released by another driver"):
        Lease(study, storage, host="host-a", token=first.token, epoch=1).fence()


@pytest.mark.parametrize("skew_s", [-200.0, 200.0])
def test_a_holder_on_a_host_whose_clock_is_off_is_judged_by_its_beats_not_its_clock(study, storage, skew_s):
    """Issue 58: one host's clock 200 s behind (or ahead of) the other's. A holder that beats is alive, however old
    its heartbeat's time looks here; one that stopped beating is taken over after the timeout, however new it
    looks. Before, the first was taken from a live driver (both then stopped, the study doubled) and the second
    kept for 200 s."""
    beats = iter(range(1, 10**6))

    def beat() -> None:  # host-a's driver, its clock off by skew_s
        StudyRecord.write(study, driver_lease=Holder("a", 1, "host-a", 1, time.time() + skew_s, next(beats)).to_attr())

    beat()
    rival = Lease(study, storage, host="host-b")
    with _beating(beat):
        with pytest.raises(StorageError, match="is being run by pid 1 on host-a"):
            rival.acquire()
    started = time.monotonic()
    rival.acquire()  # host-a fell silent: its beat stands still for the timeout, whatever its clock says
    assert time.monotonic() - started >= leases.stale_after_s()
    assert Holder.of(study).token == rival.token and rival.epoch == 2


def test_a_driver_whose_read_of_the_lease_went_stale_is_refused_and_never_overwrites_the_holder(study, storage):
    """CI, issue 33: two resumes started together both read the lease free; one then took it while the other stalled
    past the old settle wait, and the late one's write replaced the holder's lease: both ran, both stopped. However
    late the stale driver comes back, the claim of the epoch it read has been taken: it is refused in the words of
    a lease held by another ("is being run by", naming it), and the holder's lease is untouched."""
    first, second = Lease(study, storage, host="host-a"), Lease(study, storage, host="host-b")
    claim = first._claim
    first._claim = lambda epoch, passed: (second.acquire(), claim(epoch, passed))[1]  # host-b takes it meanwhile
    with pytest.raises(StorageError, match=r"is being run by pid \d+ on host-b.*at the same moment"):
        first.acquire()
    assert (Holder.of(study).token, second.epoch) == (second.token, 1)
    assert _names(storage) == ["lease"]  # both claims dropped
    second.fence()
    second.heartbeat(force=True)


def test_two_drivers_claiming_one_epoch_at_once_one_runs_the_other_is_refused_naming_it(study, storage):
    """host-a starts while host-b holds the claim of epoch 1 and has not yet written the lease: host-a watches the
    claim (another host's claimant can only be seen to move on), host-b takes the lease and beats on, host-a is
    refused naming it."""
    first, second = Lease(study, storage, host="host-a"), Lease(study, storage, host="host-b")
    refusals: list[str] = []

    def first_tries() -> None:
        try:
            first.acquire()
        except StorageError as exc:
            refusals.append(str(exc))

    attempt = threading.Thread(target=first_tries)

    def first_tries_meanwhile():  # host-b has claimed epoch 1 and not yet written the lease
        attempt.start()
        time.sleep(leases.heartbeat_every_s())
        Lease._write(second)

    second._write = first_tries_meanwhile
    second.acquire()
    del second._write  # its own heartbeats from now on
    with _beating(lambda: second.heartbeat(force=True)):
        attempt.join()
    assert len(refusals) == 1 and re.search(r"is being run by pid \d+ on host-b", refusals[0]), refusals
    assert Holder.of(study).host == "host-b" and _names(storage) == ["lease"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("claimant", ["dead", "silent", "alive"])
def test_a_claim_whose_claimant_died_is_passed_over_and_dropped_a_live_one_refuses(study, storage, monkeypatch,
                                                                                   claimant):
    """A driver killed between creating its claim and writing the lease leaves the claim: the next driver passes
    over that epoch (the claimant's process is gone, or it never said who it was within CLAIMANT_WAIT_S)."""
    monkeypatch.setattr(leases, "CLAIMANT_WAIT_S", 0.2)
    left = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], leases.claim_name("lease", 1))
    if claimant != "silent":
        pid = _dead_pid() if claimant == "dead" else os.getpid()
        storage.set_study_user_attr(left, "claimant", Holder("x", 1, leases.this_host(), pid, time.time()).to_attr())
    assert [s.study_name for s in studies.stored_studies(storage)] == ["lease"]  # a claim is no study of ours
    driver = Lease(study, storage)
    if claimant == "alive":
        with pytest.raises(StorageError, match=f"is being run by pid {os.getpid()} .*at the same moment"):
            driver.acquire()
        assert Holder.of(study) is None
        return
    driver.acquire()
    assert (driver.epoch, Holder.of(study).epoch, _names(storage)) == (2, 2, ["lease"])


def test_a_claimant_presumed_dead_is_refused_when_it_wakes(study, storage):
    """A driver paused between its claim and its lease, past CLAIMANT_WAIT_S: a second driver passed over its epoch
    and claimed the next. Whichever step it wakes at, it refuses and the second driver's lease stands."""
    first = Lease(study, storage, host="host-a")
    epoch_2 = leases.claim_name("lease", 2)

    def second_claims_the_next_epoch():  # first has written nothing of the lease yet
        storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], epoch_2)
        Lease._write(first)

    first._write = second_claims_the_next_epoch
    with pytest.raises(StorageError, match="at the same moment"):
        first.acquire()
    assert epoch_2 in _names(storage) and leases.claim_name("lease", 1) not in _names(storage)
    # its claim was dropped under it by the driver that passed over it: refused the same way
    StudyRecord.write(study, driver_lease=None)
    dropped = Lease(study, storage, host="host-a")
    dropped.storage = _DroppingStorage(storage)
    with pytest.raises(StorageError, match="at the same moment"):
        Lease.acquire(dropped)


class _DroppingStorage:
    """The storage, but the claim it creates is dropped at once (a rival presumed its claimant dead)."""

    def __init__(self, storage):
        self._inner = storage

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def create_new_study(self, directions, study_name=None):
        claim = self._inner.create_new_study(directions, study_name)
        self._inner.delete_study(claim)
        return claim


def test_drivers_racing_for_the_lease_with_random_stalls_exactly_one_takes_it(tmp_path):
    _race(f"sqlite:///{tmp_path / 'race.db'}")


@pytest.mark.slow  # a PostgreSQL cluster of the session: its tests share one xdist worker
@pytest.mark.xdist_group("postgres")
def test_drivers_racing_for_a_lease_kept_in_postgresql_exactly_one_takes_it(postgres):
    """The claim is a unique key there too: a second creator waits on the first's transaction, then fails."""
    _race(postgres.create_database("lease_race"))


def _race(url: str) -> None:
    """Four drivers (threads, each with its own storage and connections, as processes have) start together, each
    stalling a random while between reading the lease and claiming it: in every round exactly one holds it, the
    rest refuse, and no claim is left behind."""
    optuna.create_study(study_name="race", storage=url)
    stores = [optuna.storages.RDBStorage(url) for _ in range(4)]
    drivers = [optuna.load_study(study_name="race", storage=store) for store in stores]
    rng = random.Random(0)

    def drive(lease: Lease, stall: float, barrier: threading.Barrier, outcomes: list[str]) -> None:
        claim = lease._claim
        lease._claim = lambda epoch, passed: (time.sleep(stall), claim(epoch, passed))[1]
        barrier.wait()
        try:
            lease.acquire()
            outcomes.append(lease.token)
        except StorageError:
            outcomes.append("refused")

    for round_ in range(8):
        barrier, outcomes = threading.Barrier(4), []
        leases = [Lease(study, store) for study, store in zip(drivers, stores)]
        threads = [threading.Thread(target=drive, args=(lease, rng.uniform(0, 0.05), barrier, outcomes))
                   for lease in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if o != "refused"]
        assert len(winners) == 1 and Holder.of(drivers[0]).token == winners[0], (round_, outcomes)
        winner = next(lease for lease in leases if lease.token == winners[0])
        # released by its holder (the store refuses the others' writes): the next round races again
        StudyRecord.write(winner.study, driver_lease=None)
    assert [s.study_name for s in stores[0].get_all_studies()] == ["race"]


def test_the_fence_reads_the_lease_once_half_the_timeout_has_passed_since_its_own_write(study, storage,
                                                                                          monkeypatch):
    """Within half the timeout of its own write no rival can have taken the lease (a rival waits the whole
    timeout): the fence does not read the storage there; after it, it reads it and finds a takeover."""
    clock = [100.0]
    monkeypatch.setattr(leases.time, "monotonic", lambda: clock[0])
    driver = Lease(study, storage, host="host-a")
    driver.acquire()
    reads = []
    real_of = Holder.of.__func__
    monkeypatch.setattr(Holder, "of", classmethod(lambda cls, st: reads.append(1) or real_of(cls, st)))
    StudyRecord.write(study, driver_lease=Holder("rival", 9, "host-b", 1, time.time()).to_attr())
    for _ in range(3):
        driver.fence()  # fresh own write: no read (a real rival could not have written this yet)
    assert reads == []
    clock[0] += leases.stale_after_s() / 2
    with pytest.raises(LeaseLost, match="epoch 9"):
        driver.fence()
    assert reads == [1]
    with pytest.raises(LeaseLost):
        driver.fence()  # lost stays lost, without another read
    assert reads == [1]


def test_a_paused_holder_on_its_own_host_is_never_taken(study, storage):
    paused = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.kill(paused.pid, signal.SIGSTOP)
        StudyRecord.write(study, driver_lease=Holder("x", 1, leases.this_host(), paused.pid,
                                                     time.time() - 3600).to_attr())
        with pytest.raises(StorageError, match=f"being run by pid {paused.pid}"):
            Lease(study, storage).acquire()
    finally:
        paused.kill()
        paused.wait()
    Lease(study, storage).acquire()  # its process is gone: taken over at once


# ---- real drivers: SIGSTOP past the lease, a takeover, SIGCONT -----------------------------------------------
def _env(host: str, delay_s: float = REPLAY_DELAY_S) -> dict:
    """A driver on `host`; host-a's clock runs 200 s behind, host-b's 200 s ahead (issue 58: the lease compares
    no two hosts' clocks, so neither takes a live lease nor keeps a dead one)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", TIMEOUT_ENV: str(LEASE_S),
            HOST_ENV: host, "MOE_AUTOTUNE_REPLAY_DELAY_S": str(delay_s),
            CLOCK_SKEW_ENV: {"host-a": "-200", "host-b": "200"}.get(host, "0")}




def _snapshot(data: dict) -> dict:
    """Everything stored: the study's trials (state, values, attrs), its attrs, and every MLflow run."""
    study = studies.load_study(data["storage"], data["name"])
    trials = [(t.number, t.state.name, t.values, json.dumps(t.user_attrs, sort_keys=True, default=str))
              for t in study.get_trials(deepcopy=False)]
    client = MlflowClient(data["tracking_uri"])
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = sorted((r.info.run_id, r.info.status, json.dumps(r.data.tags, sort_keys=True),
                   json.dumps(r.data.metrics, sort_keys=True), json.dumps(r.data.params, sort_keys=True))
                  for r in client.search_runs(experiments, max_results=5000))
    return {"trials": trials, "attrs": json.dumps(study.user_attrs, sort_keys=True, default=str), "runs": runs}


def _unlocked(path: Path) -> bool:
    """Can another process write this SQLite file now (no paused transaction holds its lock)?"""
    try:
        with sqlite3.connect(path, timeout=0.2) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False


FENCE_MARGIN_S = 0.25  # the stop's time is read just after SIGSTOP: a margin for that read, not for load


def _started_trials(study: optuna.Study) -> list[datetime.datetime]:
    """When each running trial whose MLflow run the driver has opened began."""
    return [t.datetime_start for t in study.get_trials(deepcopy=False)
            if t.state.name == "RUNNING" and "mlflow_run_id" in t.user_attrs and t.datetime_start is not None]


def _pause_while_waiting(proc: subprocess.Popen, data: dict, dbs: list[Path], journal_lock: Path,
                         delay_s: float) -> None:
    """SIGSTOP the driver while it waits on a trial and holds no database or journal lock (a paused writer would
    block the other driver at the storage's level, which is not what this test is about).

    The study is read while the driver runs, through one storage opened once: a look at a stopped driver let the
    trial's delay pass during the look (a loaded suite's PostgreSQL read outlasted half a trial), and the driver,
    stopped for each look, finished its trials unseen. A trial seen running with its MLflow run opened, begun less
    than the delay (less a margin) before the stop, had not answered at the stop: it began before its submit, so its
    answer, and the fence checked after it, were still to come (orchestrator/sweep/lease.py). A driver paused between
    the fence and the write right after it is refused by the Optuna store (orchestrator/storage/fencing.py), but could
    still make one MLflow write, which this test's snapshot would count."""
    study = optuna.load_study(study_name=data["name"], storage=studies.open_storage(data["storage"], create=False))
    fence_lock = journal_lock.with_name(journal_lock.name.replace(".lock", FENCE_SUFFIX + ".lock"))
    while True:
        assert proc.poll() is None, "the driver finished before it was caught waiting on a trial"
        started = _started_trials(study)
        if not any((datetime.datetime.now() - t).total_seconds() < delay_s - FENCE_MARGIN_S for t in started):
            time.sleep(0.02)
            continue
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = datetime.datetime.now()
        if any((stopped - t).total_seconds() < delay_s - FENCE_MARGIN_S for t in started) and \
                all(_unlocked(db) for db in dbs) and not os.path.lexists(journal_lock) and \
                not os.path.lexists(fence_lock):
            return
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_driver_paused_past_its_lease_writes_nothing_after_a_takeover(tmp_path):
    _paused_takeover(tmp_path, f"sqlite:///{tmp_path / 'optuna.db'}", [tmp_path / "optuna.db"])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_driver_paused_past_its_lease_writes_nothing_after_a_takeover_in_a_journal(tmp_path):
    _paused_takeover(tmp_path, f"journal:///{tmp_path / 'optuna.journal'}", [])


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.xdist_group("postgres")
def test_a_driver_paused_past_its_lease_writes_nothing_after_a_takeover_in_postgresql(tmp_path, postgres):
    """Issue 58's reported case: two drivers on one PostgreSQL study."""
    # each look at the paused driver reads the study from the server: under a loaded suite a look can outlast half
    # a 1 s trial, and the driver finished before one landed inside a trial's wait; 2 s trials leave room
    _paused_takeover(tmp_path, postgres.create_database("paused"), [], delay_s=2.0)


def _paused_takeover(tmp_path: Path, storage: str, databases: list[Path], delay_s: float = REPLAY_DELAY_S) -> None:
    """Driver A (host-a) is paused while it waits on a trial, until its lease is stale; driver B (host-b) resumes
    and finishes the study; A is continued: it stops (exit 5, one line) having written nothing, and `check` finds
    the study and MLflow in agreement, every layout measured once. `databases`: SQLite files whose lock a pause
    must not hold (a paused SQLite writer blocks the other driver below the lease, which is not this test's
    subject); a journal's lock file is checked beside it."""
    data = spec_data(tmp_path, "split", seq_len=128, backend="replay", replay_table=str(TABLE), fixed={},
                     budget={"n_trials": 14, **TO_THE_END}, storage=storage)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(data))
    first = subprocess.Popen([CLI, "sweep", str(spec), "--quiet"], cwd=tmp_path, env=_env("host-a", delay_s),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while measured_count(data["storage"], data["name"]) < 2:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.2)
        # a live holder on another host, its beat advancing: never taken
        refused = subprocess.run([CLI, "sweep", str(spec), "--quiet", "--resume"], cwd=tmp_path,
                                 env=_env("host-b", delay_s),
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "being run by" in refused.stderr and "host-a" in refused.stderr, refused
        assert first.poll() is None, "the first driver finished before it could be paused; give it more trials"

        _pause_while_waiting(first, data, [*databases, tmp_path / "mlflow.db"], tmp_path / "optuna.journal.lock",
                             delay_s)
        paused_at = measured_count(data["storage"], data["name"])
        # host-b watches the paused holder's beat count stand still for the lease timeout, then takes over (its
        # heartbeat's time, 200 s old by host-a's clock, decides nothing)
        takeover = subprocess.run([CLI, "sweep", str(spec), "--quiet", "--resume"], cwd=tmp_path,
                                  env=_env("host-b", delay_s), capture_output=True, text=True, timeout=300)
        assert takeover.returncode == 0, takeover.stderr[-3000:]
        before = _snapshot(data)

        os.kill(first.pid, signal.SIGCONT)  # the paused driver wakes up, its lease long gone
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    errors = [line for line in err.splitlines() if line.strip()]
    assert first.returncode == 5, (out, err)
    assert len(errors) == 1 and errors[0].startswith("error:") and "taken over" in errors[0], err
    assert "Traceback" not in err
    assert _snapshot(data) == before  # not one trial, attr or MLflow run written after the takeover
    assert paused_at < 14
    study, problems = check(data["storage"], data["name"])
    assert problems == [], problems  # no layout twice, MLflow agrees with the study trial by trial
    assert len(queries.measured_trials(study)) == 14
