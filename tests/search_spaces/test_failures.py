"""Honest failure reasons (issue 53): the failure classes over real log excerpts (gloo's EnforceNotMet abort,
torchrun's Root Cause block, an OOM, a connection reset, a Megatron-Core assertion, NCCL's watchdog), the choice of
the earliest root cause across ranks, the records beside a result, and a TrialResult that carries the cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from search_spaces import failures
from search_spaces.failures import CLASS_NAMES, FAILURE_CLASSES, RankFailure, classify, parse_log, root_cause
from search_spaces.result import TrialResult

LOGS = Path(__file__).resolve().parents[1] / "data" / "failure_logs"
# torchrun of torch 2.13, two gloo ranks all-reducing 4 and 8 floats: rank 0 aborts in C++ (no rank prefix on the
# abort), rank 1 sees the peer gone and is stopped by torchrun (its uncaught exception printed with `[rank1]:`)
GLOO_MISMATCH = (LOGS / "gloo_mismatch.log").read_text()

# the real trainer (tiny-moe, two ranks) with MOE_AUTOTUNE_FAULT=crash@1 on rank 1: torchrun's summary
CRASH_ON_RANK_1 = (LOGS / "crash_on_rank_1.log").read_text()

# an uncaught CUDA OOM on global rank 5 (the second node's local rank 1), exit code 1: torch's messages, this
# machine has no GPU to make them
OOM_ON_RANK_5 = (LOGS / "oom_on_rank_5.log").read_text()

NCCL_WATCHDOG = ("[rank3]:[E1206 11:40:02.123456 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
                 "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, "
                 "NumelOut=1, Timeout(ms)=600000) ran for 600083 milliseconds before timing out.\n")
MEGATRON_ASSERTION = ("AssertionError", "num_attention_heads (4) must be a multiple of tensor_model_parallel_size (3)")


# ---- the vocabulary ---------------------------------------------------------------------------------------------

def test_the_classes_are_declared_once_with_a_meaning_each_and_communication_is_the_symptom():
    assert CLASS_NAMES == ("oom", "collective_mismatch", "timeout", "killed", "config_refused", "communication",
                           "error")
    assert all(c.meaning and "\n" not in c.meaning for c in FAILURE_CLASSES)
    assert [c.name for c in FAILURE_CLASSES if c.symptom] == ["communication"]


@pytest.mark.parametrize("type_name, message, phase, expected", [
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", "train", "oom"),
    ("RuntimeError", "NCCL WARN Cuda failure 'out of memory'", None, "oom"),
    ("gloo::EnforceNotMet", "[enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data "
                            "size doesn't match expected size. Is there a distributed collective mismatch?", None,
     "collective_mismatch"),
    ("gloo::EnforceNotMet", "[enforce fail at pair.cc:300] op.nbytes == nbytes", None, "collective_mismatch"),
    ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 300000ms for "
                     "recv operation to complete", "train", "timeout"),
    ("RuntimeError", "[pair.cc:537] Read error [127.0.0.1]:48785: Connection reset by peer. This is typically "
                     "caused by a remote worker hanging", "train", "communication"),
    ("RuntimeError", "[pair.cc:589] Connection closed by peer [127.0.0.1]:29500", "train", "communication"),
    (*MEGATRON_ASSERTION, "build", "config_refused"),
    ("ValueError", "num_moe_experts (6) must be divisible by expert_model_parallel_size (4)", "build",
     "config_refused"),
    (*MEGATRON_ASSERTION, "train", "error"),  # in the steps: not a refusal of the configuration
    ("RuntimeError", "injected by MOE_AUTOTUNE_FAULT=raise@1 on rank 1", "train", "error"),
])
def test_an_exception_is_classified_by_its_type_message_and_phase(type_name, message, phase, expected):
    assert classify(type_name, message, phase) == expected


# ---- the logs -----------------------------------------------------------------------------------------------------

def test_a_gloo_abort_is_given_to_the_rank_torchrun_saw_abort_and_beats_the_peers_reset():
    found = parse_log(GLOO_MISMATCH)
    by_rank = {f.rank: f for f in found}
    assert set(by_rank) == {0, 1}
    assert by_rank[0].failure_class == "collective_mismatch" and by_rank[0].signal == "SIGABRT"
    assert "gloo::EnforceNotMet" in by_rank[0].reason and "exit code -6" in by_rank[0].reason
    assert by_rank[1].failure_class == "communication" and by_rank[1].symptom  # reset, then torchrun's SIGTERM
    cause = root_cause(found)
    assert (cause.rank, cause.failure_class) == (0, "collective_mismatch")


def test_torchruns_root_cause_names_the_rank_it_saw_killed_not_the_one_it_stopped():
    found = parse_log(CRASH_ON_RANK_1)
    assert [(f.rank, f.signal, f.source) for f in found] == [(1, "SIGKILL", "torchrun"), (0, "SIGTERM", "torchrun")]
    cause = root_cause(found)
    assert (cause.rank, cause.failure_class) == (1, "killed")
    assert cause.reason == "ended by SIGKILL (exit code -9)"
    assert found[0].time < found[1].time  # torchrun's seconds: 20:01:16 before 20:01:17


def test_an_uncaught_oom_is_its_ranks_cause_with_torchruns_time():
    (cause,) = parse_log(OOM_ON_RANK_5)
    assert (cause.rank, cause.failure_class, cause.signal) == (5, "oom", None)
    assert cause.reason.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert "exited with code 1" in cause.reason
    assert cause.time is not None


def test_an_nccl_watchdog_line_is_a_timeout_of_the_rank_it_names():
    (cause,) = parse_log(NCCL_WATCHDOG * 3)  # the same error on every line of its stack: once
    assert (cause.rank, cause.failure_class) == (3, "timeout")


def test_a_log_without_failures_shows_none():
    assert parse_log("W1206 ... No CUDA runtime is found\nGPTModel IS DEPRECATED.\n") == []


# ---- the earliest root cause ------------------------------------------------------------------------------------

def _f(name: str, rank: int | None, at: float | None, signal: str | None = None) -> RankFailure:
    return RankFailure(name, f"{name} on {rank}", rank, at, signal=signal)


def test_the_earliest_failure_that_is_no_symptom_wins_whoever_reported_first():
    reset = _f("communication", 0, 10.0)  # rank 0 reported first: a symptom
    raised = _f("error", 2, 10.5)
    killed = _f("killed", 1, 11.0, "SIGKILL")
    assert root_cause([reset, killed, raised]) is raised
    assert root_cause([reset, _f("killed", 3, 9.0, "SIGTERM"), killed]) is killed  # torchrun's SIGTERM: a symptom
    assert root_cause([_f("error", 1, None), _f("oom", 2, 12.0)]).rank == 2  # an unknown time after a known one
    assert root_cause([_f("error", 1, 5.0), _f("oom", 2, 5.0)]).rank == 1  # a tie: the order given
    assert root_cause([_f("communication", 1, 3.0), reset]).rank == 1  # symptoms only: the earliest
    assert root_cause([]) is None


def test_apply_names_the_cause_first_and_keeps_the_others():
    result = TrialResult(status="error", error="rank 0: RuntimeError: Connection reset by peer\ntraceback ...")
    oom = RankFailure("oom", "OutOfMemoryError: injected", 1, 1.0, detail="Traceback ...\nOutOfMemoryError")
    failures.apply(result, oom, [oom, _f("communication", 0, 2.0)])
    assert (result.status, result.failure_class, result.failure_rank) == ("oom", "oom", 1)
    assert result.error.startswith("rank 1: OutOfMemoryError: injected\nother failures: rank 0: communication")
    assert "first reported: rank 0: RuntimeError: Connection reset by peer" in result.error
    assert [f["rank"] for f in result.extra["failures"]] == [1, 0]


# ---- records beside a result, and a result that has ended --------------------------------------------------------

def test_records_round_trip_and_a_damaged_one_is_skipped(tmp_path):
    result_path = tmp_path / "result.json"
    mine = failures.from_exception("RuntimeError", "boom\nsecond line", 1, 123.5, "Traceback ...", "train")
    path = failures.write_record(result_path, mine)
    assert path.name == "result.json.rank1.failure.json"
    (tmp_path / "result.json.rank0.failure.json").write_text("{not json")
    (tmp_path / "result.json.rank2.failure.json").write_text(json.dumps({"failure_class": "nonesuch"}))
    assert failures.read_records(result_path) == [mine]
    assert mine.reason == "RuntimeError: boom"
    failures.clear_records(result_path)
    assert failures.record_paths(result_path) == []


def test_settle_replaces_a_claimed_symptom_with_the_rank_the_logs_show_killed(tmp_path):
    result_path = tmp_path / "result.json"
    reset = failures.from_exception("RuntimeError", "Connection reset by peer", 0, 1e12, "tb", "train")
    failures.write_record(result_path, reset)
    (tmp_path / "node-0.log").write_text(CRASH_ON_RANK_1)
    claimed = failures.apply(TrialResult(status="error"), reset, [reset])
    settled = failures.settle(claimed, result_path, [tmp_path / "node-0.log"], [1])
    assert (settled.status, settled.failure_class, settled.failure_rank) == ("error", "killed", 1)
    assert settled.error.startswith("rank 1: ended by SIGKILL (exit code -9)")
    assert "rank 0: communication: RuntimeError: Connection reset by peer" in settled.error


def test_settle_without_records_or_logs_uses_the_exit_code_or_the_error(tmp_path):
    result_path = tmp_path / "result.json"
    killed = failures.settle(TrialResult(status="error", error="trainer exited [-9] without a result: "),
                             result_path, [], [-9])
    assert (killed.failure_class, killed.failure_rank) == ("killed", None)
    assert "SIGKILL (exit code -9)" in killed.failure_reason and "-9" in killed.error
    plain = failures.settle(TrialResult(status="oom", error="fake OOM"), result_path, [], [0])
    assert (plain.failure_class, plain.failure_reason) == ("oom", "fake OOM")
    ok = failures.settle(TrialResult(status="ok"), result_path, [], [-9])
    assert ok.failure_class is None


def test_a_result_carries_its_cause_through_json_and_an_older_file_still_loads(tmp_path):
    result = TrialResult(status="error", failure_class="killed", failure_rank=1, failure_reason="ended by SIGKILL")
    result.write(tmp_path / "r.json")
    back = TrialResult.read(tmp_path / "r.json")
    assert (back.failure_class, back.failure_rank, back.failure_reason) == ("killed", 1, "ended by SIGKILL")
    older = {k: v for k, v in result.to_dict().items() if not k.startswith("failure_")}
    assert TrialResult.from_dict(older).failure_class is None
    with pytest.raises(ValueError, match="unknown failure class"):
        TrialResult(status="error", failure_class="gremlins")
