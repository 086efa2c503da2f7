"""Issue 58: fencing tokens kept by the store (orchestrator/storage/fencing.py). A driver that lost its study's lease
is refused by the store itself, even when it skips its own look at the lease (paused between that look and the write
after it): on a SQLite file, a journal file and PostgreSQL, each driver with its own storage as two processes have."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from orchestrator.errors import LeaseLost
from orchestrator.storage import studies
from orchestrator.storage.fencing import fence_writes


def _two_drivers(url: str) -> tuple[tuple[optuna.Study, Any], tuple[optuna.Study, Any]]:
    """Two drivers, each a study on a storage of its own (the storage is what a driver's lease is given)."""
    first, second = studies.open_storage(url), studies.open_storage(url)
    return ((optuna.create_study(study_name="fenced", storage=first), first),
            (optuna.load_study(study_name="fenced", storage=second), second))


def _takeover_is_refused_by_the_store(url: str) -> None:
    (first, first_storage), (second, second_storage) = _two_drivers(url)
    fence_writes(first_storage, "fenced", 1)
    first.set_user_attr("written_by", "first")
    first.enqueue_trial({"x": 1})
    running = first.ask()  # in flight when the driver is paused
    fence_writes(second_storage, "fenced", 2)  # the takeover: a later epoch
    trials_before = len(second.get_trials(deepcopy=False))
    # the first driver, paused past its lease, writes without looking: every kind of write is refused
    for write in (lambda: first.tell(running, 3.0), lambda: running.set_user_attr("late", True),
                  lambda: first.set_user_attr("written_by", "first again"), lambda: first.ask(),
                  lambda: first.enqueue_trial({"x": 2})):
        with pytest.raises(LeaseLost, match=r"taken over by a driver of epoch 2 .*epoch 1.*refused its write"):
            write()
    fresh = optuna.load_study(study_name="fenced", storage=studies.open_storage(url))
    assert fresh.user_attrs["written_by"] == "first" and len(fresh.get_trials(deepcopy=False)) == trials_before
    assert fresh.trials[running.number].state.name == "RUNNING" and not fresh.trials[running.number].user_attrs
    second.set_user_attr("written_by", "second")  # the holder writes on
    second.tell(running.number, state=optuna.trial.TrialState.FAIL)  # the holder settles the orphan
    second.tell(second.ask(), 1.0)
    fresh = optuna.load_study(study_name="fenced", storage=studies.open_storage(url))
    assert fresh.user_attrs["written_by"] == "second" and fresh.best_value == 1.0
    with pytest.raises(LeaseLost, match="epoch 2"):  # an old epoch cannot lower the fence again
        fence_writes(first_storage, "fenced", 1)
    assert fresh.study_name == "fenced" and first.user_attrs["written_by"] == "second"  # reads stay open


def test_a_sqlite_store_refuses_a_superseded_drivers_writes(tmp_path):
    _takeover_is_refused_by_the_store(f"sqlite:///{tmp_path / 'optuna.db'}")


def test_a_journal_refuses_a_superseded_drivers_writes(tmp_path):
    _takeover_is_refused_by_the_store(f"journal:///{tmp_path / 'optuna.journal'}")


@pytest.mark.xdist_group("postgres")
def test_a_postgresql_store_refuses_a_superseded_drivers_writes(postgres):
    _takeover_is_refused_by_the_store(postgres.create_database("fenced"))


def test_an_unfenced_reader_and_an_in_memory_study_are_untouched(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    (_, driver_storage), (reader, _) = _two_drivers(url)
    fence_writes(driver_storage, "fenced", 3)
    reader.set_user_attr("note", "a reader's storage has no fence")  # e.g. a test or a tool opening the file
    in_memory = studies.in_memory()
    memory = optuna.create_study(storage=in_memory)
    fence_writes(in_memory, memory.study_name, 1)  # nothing else writes it: no fence
    memory.tell(memory.ask(), 2.0)
    assert memory.best_value == 2.0
