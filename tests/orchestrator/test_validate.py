"""Result validation: impossible measurements are marked invalid and are never the best trial."""

import concurrent.futures
import math

import pytest

from search_spaces.catalog.hardware import load_gpu
from search_spaces.layouts.layout import Layout
from search_spaces.result import TrialResult
from search_spaces.validation import DISPATCHER_CLASSES, problems, validate

H100 = load_gpu("h100")
LAYOUT = Layout(tp=2, cp=2, ep=4, pp=2, gbs=16, precision="bf16", dispatcher="alltoall")


def _applied(layout: Layout, **changes) -> dict:
    applied = {k: getattr(layout, k) for k in ("tp", "cp", "ep", "etp", "pp", "vpp")}
    applied["dispatcher"] = [DISPATCHER_CLASSES[layout.dispatcher]]
    applied.update(changes)
    return applied


def _honest(layout: Layout = LAYOUT, **changes) -> TrialResult:
    values = dict(status="ok", tokens_per_sec_per_gpu=4000.0, tflops_per_gpu=400.0, mfu=0.4, step_time_s=2.0,
                  loss=[10.5, 10.2, 9.9], peak_memory_gib=60.0, applied=_applied(layout), layout=layout.to_dict())
    values.update(changes)
    return TrialResult(**values)


def test_an_honest_measurement_is_kept_as_is():
    result = _honest()
    assert problems(result, LAYOUT, H100) == []
    assert validate(result, LAYOUT, H100) is result and result.status == "ok"


@pytest.mark.parametrize("precision", ["bf16", "fp8-blockwise"])
def test_tflops_above_the_chip_peak_is_invalid(precision):
    layout = LAYOUT.replace(precision=precision)
    peak = H100.peak(precision)
    just_under = validate(_honest(layout, tflops_per_gpu=peak * 0.99, mfu=0.99), layout, H100)
    assert just_under.status == "ok"
    over = validate(_honest(layout, tflops_per_gpu=peak * 1.3, mfu=1.3), layout, H100)
    assert over.status == "invalid"
    assert "peak" in over.error and f"{peak:,.1f}" in over.error
    assert over.extra["status_before_validation"] == "ok"


def test_mfu_above_one_is_invalid_even_without_tflops():
    result = validate(_honest(tflops_per_gpu=None, mfu=1.7), LAYOUT, H100)
    assert result.status == "invalid" and "MFU" in result.error


@pytest.mark.parametrize("size", ["tp", "cp", "ep", "etp", "pp", "vpp"])
def test_a_parallel_size_not_in_effect_is_invalid(size):
    requested = getattr(LAYOUT, size)
    result = validate(_honest(applied=_applied(LAYOUT, **{size: requested + 1})), LAYOUT, H100)
    assert result.status == "invalid"
    assert size.upper() in result.error and "in effect" in result.error


def test_cp_silently_switched_off_is_invalid():
    # the failure users saw with earlier tools: CP=4 asked for, CP=1 ran, throughput looked great
    layout = LAYOUT.replace(cp=4, tp=1)
    result = validate(_honest(layout, tokens_per_sec_per_gpu=99999.0, applied=_applied(layout, cp=1)), layout, H100)
    assert result.status == "invalid" and "CP 4 was requested but 1" in result.error


@pytest.mark.parametrize("requested,reported,ok", [
    ("alltoall", ["MoEAlltoAllTokenDispatcher"], True),
    ("allgather", ["MoEAllGatherTokenDispatcher"], True),
    ("deepep", ["MoEFlexTokenDispatcher"], True),
    ("alltoall", ["MoEAllGatherTokenDispatcher"], False),
    ("deepep", ["MoEAlltoAllTokenDispatcher"], False),
    ("alltoall", ["MoEAlltoAllTokenDispatcher", "MoEAllGatherTokenDispatcher"], False),
    ("allgather", "allgather", True),  # a trainer may report the plain name
    ("alltoall", [], True),  # dense model: no dispatcher to check
])
def test_dispatcher_not_in_effect_is_invalid(requested, reported, ok):
    layout = LAYOUT.replace(dispatcher=requested)
    applied = _applied(layout)
    applied["dispatcher"] = reported
    result = validate(_honest(layout, applied=applied), layout, H100)
    assert (result.status == "ok") is ok, result.error
    if not ok:
        assert "dispatcher" in result.error and requested in result.error


@pytest.mark.parametrize("requested,reported,ok", [
    ("dropless", "dropless", True),
    ("capacity:1.25", "capacity:1.25", True),
    ("forced_balance", "force_balance", True),  # any spelling of the same routing
    ("capacity:1.25", "dropless", False),  # token dropping silently off
    ("dropless", "forced_balance", False),  # a benchmark's random routing measured as production's
    ("capacity:1.25", "capacity:1.0", False),
    ("dropless", "unrecognised: moe_expert_capacity_factor=2.0", False),
    ("dropless", None, True),  # dense model: no router to check
])
def test_routing_not_in_effect_is_invalid(requested, reported, ok):
    layout = LAYOUT.replace(routing=requested)
    result = validate(_honest(layout, applied=_applied(layout, routing=reported)), layout, H100)
    assert (result.status == "ok") is ok, result.error
    if not ok:
        assert "routing" in result.error and requested in result.error


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), None])
def test_a_non_finite_loss_is_invalid(bad):
    result = validate(_honest(loss=[10.5, bad, 9.9]), LAYOUT, H100)
    assert result.status == "invalid" and "loss is not finite at step 1" in result.error


@pytest.mark.parametrize("tokens", [float("nan"), float("inf"), 0.0, -5.0])
def test_a_nonsense_throughput_is_invalid(tokens):
    result = validate(_honest(tokens_per_sec_per_gpu=tokens), LAYOUT, H100)
    assert result.status == "invalid" and "tokens/s" in result.error


def test_every_reason_is_reported_together():
    result = validate(_honest(tflops_per_gpu=5000.0, loss=[math.nan], applied=_applied(LAYOUT, cp=1)), LAYOUT, H100)
    assert result.status == "invalid"
    for word in ("peak", "CP", "loss"):
        assert word in result.error


def test_failed_results_are_left_alone_and_input_is_not_mutated():
    oom = TrialResult(status="oom", error="CUDA out of memory", tflops_per_gpu=1e9, loss=[math.nan])
    assert validate(oom, LAYOUT, H100) is oom and oom.status == "oom"
    lying = _honest(tflops_per_gpu=1e6)
    checked = validate(lying, LAYOUT, H100)
    assert checked.status == "invalid" and lying.status == "ok" and lying.error is None


def test_results_without_applied_or_gpu_are_judged_on_what_they_have():
    # the analytic backend reports no `applied`; an unknown GPU has no peak
    assert validate(_honest(applied={}), LAYOUT, H100).status == "ok"
    assert validate(_honest(tflops_per_gpu=1e9, mfu=None), LAYOUT, None).status == "ok"
    assert validate(_honest(applied={}, loss=[math.inf]), LAYOUT, None).status == "invalid"


def test_cpu_peak_is_only_an_ordering_figure():
    cpu = load_gpu("cpu")
    layout = LAYOUT.replace(precision="fp32")
    assert validate(_honest(layout, tflops_per_gpu=cpu.peak("fp32") * 3, mfu=None), layout, cpu).status == "ok"


def test_a_result_that_went_through_json_is_validated_the_same(tmp_path):
    path = tmp_path / "result.json"
    _honest(loss=[10.0, float("nan")], applied=_applied(LAYOUT, ep=1)).write(path)
    result = validate(TrialResult.read(path), LAYOUT, H100)
    assert result.status == "invalid" and "EP" in result.error and "loss" in result.error


# ---- in the sweep: an invalid trial is never the best ------------------------------------------------
class _LyingBackend:
    """Every other trial claims 10x the chip's peak and the best throughput of all."""
    name = "lying"

    def __init__(self):
        self.count = 0

    def submit(self, request):
        self.count += 1
        layout = request.layout
        lie = self.count % 2 == 1
        tokens = 1e6 if lie else 1000.0 + self.count
        step = layout.gbs * request.seq_len / tokens / request.num_gpus  # honest: tokens/s agrees with the step
        result = TrialResult(status="ok", tokens_per_sec_per_gpu=tokens,
                             tflops_per_gpu=H100.peak(layout.precision) * (10 if lie else 0.3),
                             mfu=10.0 if lie else 0.3, step_time_s=step, loss=[5.0, 4.0],
                             peak_memory_gib=10.0, applied=_applied(layout), layout=layout.to_dict())
        fut = concurrent.futures.Future()
        fut.set_result(result)
        return fut

    def close(self):
        pass


@pytest.mark.timeout(300)
def test_sweep_never_picks_an_impossible_measurement_as_best(tmp_path, monkeypatch):
    from orchestrator import dispatch
    from orchestrator.records import queries
    from orchestrator.sweep import loop
    from tests.sweep_helpers import make_spec, prior_for

    monkeypatch.setattr(dispatch, "make_backend", lambda spec, prior: _LyingBackend())  # the session starts it
    spec = make_spec(tmp_path, "liars", gpu="h100", gpus_per_node=8, seq_len=1024, gbs=16, fixed={},
                     tracking_uri="none")
    outcome = loop.run_sweep(spec, prior=prior_for(spec), show_progress=False)
    ran = queries.measured_trials(outcome.study)
    statuses = sorted(t.user_attrs["status"] for t in ran)
    assert statuses.count("invalid") >= 1, f"the lying trials were accepted: {statuses}"
    assert outcome.best is not None and outcome.best.user_attrs["status"] == "ok"
    assert outcome.best.values[0] < 1e6, "an above-peak measurement became the best"
    for t in ran:
        if t.user_attrs["status"] == "invalid":
            assert "peak" in t.user_attrs["reason"]
            assert t not in outcome.pareto


@pytest.mark.parametrize("requested,reported,ok", [
    (True, True, True), (False, False, True),
    (True, False, False),  # the overlap silently off: the trial measured the serial all-to-all
    (False, True, False),
    (True, None, True),  # dense model: nothing to check
])
def test_ep_overlap_not_in_effect_is_invalid(requested, reported, ok):
    layout = LAYOUT.replace(ep_overlap=requested)
    result = validate(_honest(layout, applied=_applied(layout, ep_overlap=reported)), layout, H100)
    assert (result.status == "ok") is ok, result.error
    if not ok:
        assert "ep_overlap" in result.error
