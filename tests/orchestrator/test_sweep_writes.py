"""An analytic sweep asks and tells on an in-memory copy of its study and stores each finished trial whole
(orchestrator/sweep/writes.py): the storage ends up holding what direct writes store, trial numbers are the
storage's, a queued trial is filled in place, and nothing is stored out of order or past the lease's fence."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from orchestrator.errors import LeaseLost
from orchestrator.sweep import run_sweep
from orchestrator.sweep import session as sessions
from orchestrator.sweep.writes import DirectWrites, WholeTrialWrites
from tests.sweep_helpers import make_spec, prior_for

FREE = ["tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "recompute"]
SPACE = {"x": CategoricalDistribution([1, 2, 3, 4])}


def _stored(storage: str, name: str) -> list[dict]:
    """Each stored trial as what a reader sees of it (whether it names its MLflow run, not the run's id)."""
    study = optuna.load_study(study_name=name, storage=storage)
    return [{"number": t.number, "state": t.state, "params": t.params, "values": t.values,
             "user_attrs": {k: v if k != "mlflow_run_id" else "a run" for k, v in t.user_attrs.items()},
             "system_attrs": t.system_attrs} for t in study.trials]


def _child_runs(tracking_uri: str, name: str) -> dict[int, tuple[str, dict, dict]]:
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], "tags.`moe_autotune.role` != 'parent'", max_results=1000)
    return {int(r.data.tags["optuna_trial_number"]): (r.info.status, dict(r.data.params),
                                                      {k: v for k, v in r.data.metrics.items()}) for r in runs}


@pytest.mark.parametrize("track_rejected", [False, True])
def test_an_analytic_sweep_stores_and_records_what_direct_writes_would(tmp_path, monkeypatch, track_rejected):
    outcomes = {}
    for how in ("whole", "direct"):
        spec = make_spec(tmp_path / how, "writes", budget={"n_trials": 8, "max_concurrent": 3}, gpus_per_node=8,
                         seq_len=512, free=FREE, track_rejected=track_rejected)
        (tmp_path / how).mkdir()
        with monkeypatch.context() as patch:
            if how == "direct":
                patch.setattr(sessions, "sweep_writes", lambda study, *args: DirectWrites(study))
            outcome = run_sweep(spec, prior=prior_for(spec), show_progress=False)
        assert outcome.exit_code == 0, outcome.messages
        outcomes[how] = (_stored(spec.storage, spec.name), _child_runs(spec.tracking_uri, spec.name),
                         outcome.best.number)
    whole, direct = outcomes["whole"], outcomes["direct"]
    assert len(whole[0]) >= 8 and any(t["user_attrs"].get("proposed_by") == "rule-of-thumb" for t in whole[0])
    assert whole[0] == direct[0]
    assert whole[1] == direct[1] and all(status == "FINISHED" for status, _, _ in whole[1].values())
    assert whole[2] == direct[2]


@pytest.fixture
def stored(tmp_path) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"x": 4}, user_attrs={"proposed_by": "rule-of-thumb"})
    return study, storage


def _stored_trials(storage) -> list:
    return optuna.load_study(study_name="s", storage=storage.url).trials


def test_the_queue_is_taken_from_the_storage_then_each_trial_is_stored_whole_in_number_order(stored):
    study, storage = stored
    writes = WholeTrialWrites(study, storage, fence=lambda: None)
    queued = writes.study.ask(SPACE)
    assert queued.study is study and writes.direct(queued) and queued.params == {"x": 4}  # from the storage
    assert writes.study is study  # while a trial of the storage runs, the storage is asked
    study.tell(queued, [0.5])
    assert writes.told(queued) == [0]

    first, second = writes.study.ask(SPACE), writes.study.ask(SPACE)  # the queue is empty: the copy is asked
    assert first.study is not study and not writes.direct(first) and (first.number, second.number) == (1, 2)
    assert len(_stored_trials(storage)) == 1  # asking stored nothing
    second.study.tell(second, [2.0])
    assert writes.told(second) == []  # trial 1 runs: 2 waits for it
    first.study.tell(first, [1.0])
    assert writes.told(first) == [1, 2]

    trials = _stored_trials(storage)
    assert [(t.number, t.state, t.values) for t in trials] == [
        (0, TrialState.COMPLETE, [0.5]), (1, TrialState.COMPLETE, [1.0]), (2, TrialState.COMPLETE, [2.0])]
    assert [t.params for t in trials] == [{"x": 4}, first.params, second.params]
    assert trials[0].user_attrs == {"proposed_by": "rule-of-thumb"}
    assert writes.flush() == []  # nothing is stored twice


def test_a_copy_starts_from_every_stored_trial_and_numbers_on_from_them(stored):
    study, storage = stored
    study.tell(study.ask(SPACE), [3.0])  # the queued trial, done by an earlier driver
    writes = WholeTrialWrites(study, storage, fence=lambda: None)
    trial = writes.study.ask(SPACE)
    assert [(t.number, t.state, t.values) for t in writes.study.trials] == [
        (0, TrialState.COMPLETE, [3.0]), (1, TrialState.RUNNING, None)]
    trial.study.tell(trial, [1.0])
    assert writes.told(trial) == [1]
    assert [t.number for t in _stored_trials(storage)] == [0, 1]


def _past_the_queue(study, storage, fence=lambda: None) -> WholeTrialWrites:
    study.tell(study.ask(SPACE), [3.0])
    return WholeTrialWrites(study, storage, fence=fence)


def test_nothing_is_stored_past_the_fence(stored):
    study, storage = stored
    fenced = [False]

    def fence():
        if fenced[0]:
            raise LeaseLost("another driver holds the study")
    writes = _past_the_queue(study, storage, fence)
    trial = writes.study.ask(SPACE)
    trial.study.tell(trial, [1.0])
    fenced[0] = True
    with pytest.raises(LeaseLost):
        writes.told(trial)
    assert len(_stored_trials(storage)) == 1


def test_a_trial_another_writer_stored_meanwhile_stops_the_driver(stored):
    study, storage = stored
    writes = _past_the_queue(study, storage)
    trial = writes.study.ask(SPACE)
    assert study.ask(SPACE).number == trial.number == 1  # a driver without the lease stored trial 1
    trial.study.tell(trial, [1.0])
    with pytest.raises(LeaseLost, match="trial 1 was stored by another writer, this driver's as a later one"):
        writes.told(trial)


@pytest.mark.parametrize("landed", [True, False])
def test_a_store_cut_short_is_stored_once_whether_it_landed_or_not(stored, monkeypatch, landed):
    """Ctrl-C during a trial's store, before or after its transaction committed: the next flush (the sweep's stop
    stores what it can) stores it once, never twice."""
    study, storage = stored
    writes = _past_the_queue(study, storage)
    trial = writes.study.ask(SPACE)
    trial.study.tell(trial, [1.0])
    real = type(storage).create_new_trial

    def cut_short(self, *args, **kwargs):
        if landed:
            real(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(type(storage), "create_new_trial", cut_short)
    with pytest.raises(KeyboardInterrupt):
        writes.told(trial)
    monkeypatch.setattr(type(storage), "create_new_trial", real)
    assert writes.flush() == [1]
    assert [(t.number, t.values) for t in _stored_trials(storage)] == [(0, [3.0]), (1, [1.0])]
    assert writes.flush() == []


def test_a_sweep_whose_trials_run_writes_directly(tmp_path):
    spec = make_spec(Path(tmp_path), "replayed", backend="replay", seq_len=128,  # the table's situation
                     replay_table=str(Path(__file__).parents[1] / "data" / "replay_small.csv"), budget={"n_trials": 2})
    session = sessions.open_session(spec, prior=prior_for(spec))
    try:
        assert isinstance(session.writes, DirectWrites) and session.writes.study is session.study
        assert session.writes.direct(session.study.ask(SPACE))
    finally:
        session.close()


def test_check_counts_a_run_begun_for_a_trial_not_yet_stored_as_in_flight_and_a_finished_one_as_a_difference(
        tmp_path):
    """A driver killed between beginning a trial's run and storing the trial leaves a running run numbered after
    the study's last trial: in flight, as a running trial's run is (--resume completes or closes it). Finished, such
    a run would be a record without its trial."""
    from orchestrator.outputs.check import check
    from orchestrator.records import TRIAL_TAG

    spec = make_spec(tmp_path, "in-flight", budget={"n_trials": 3}, gpus_per_node=8, seq_len=512, free=FREE)
    run_sweep(spec, prior=prior_for(spec), show_progress=False)
    study = optuna.load_study(study_name=spec.name, storage=spec.storage)
    client = MlflowClient(spec.tracking_uri)
    begun = client.create_run(study.user_attrs["mlflow_experiment_id"], tags={
        "mlflow.parentRunId": study.user_attrs["mlflow_parent_run_id"], TRIAL_TAG: str(len(study.trials))})
    assert check(spec.storage, spec.name)[1] == []
    client.set_terminated(begun.info.run_id, "FINISHED")
    assert check(spec.storage, spec.name)[1] == [
        f"child run {begun.info.run_id} names trial {len(study.trials)}, which the study does not have"]
