"""The kernel tables (search_spaces/catalog/kernel_tables.json): every entry has a source, a catalog GPU, a precision
that GPU runs, and lies at or below that GPU's ceiling; the cost terms' figures at their shapes
(search_spaces/cost/kernel_check.py); and the per-term explanation `estimate --explain` prints
(search_spaces/cost/explain.py)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from search_spaces.calibration.calibration_file import calibration
from search_spaces.catalog.hardware import GPUS, load_gpu
from search_spaces.catalog.kernels import TERMS, UNITS, KernelEntry, Source, entries, kernel_tables
from search_spaces.catalog.models import load_model
from search_spaces.cost.breakdown import TIME_KEYS
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.explain import EXTRAPOLATED, INSIDE, NO_TABLE, explain_step, layout_gemm_shapes
from search_spaces.cost.gpu_terms import GPU_TERMS
from search_spaces.cost.kernel_check import cross_check, model_figure
from search_spaces.cost.throughput import gemm_rate, gemm_rates, job_for
from search_spaces.layouts.layout import Layout

ENTRIES = kernel_tables()
SHAPE_FIELDS = {"gemm": {"kind", "m", "n", "k"}, "attention": {"seq_len", "d_qk", "d_v", "mask", "direction"},
                "ep_alltoall": {"ep", "nodes", "link", "direction"}}


def _id(e: KernelEntry) -> str:
    return f"{e.term}-{e.gpu}-{e.source.key}-" + "-".join(str(v) for v in e.shape.values())


def test_every_term_has_a_table_and_every_source_is_used():
    assert {e.term for e in ENTRIES} == set(TERMS)
    assert len(ENTRIES) >= 100
    assert {e.source.key for e in ENTRIES} == {"deepgemm-readme", "project-gemm-shapes-h200", "deepep-legacy",
                                               "deepep-readme-v2", "fa4-pr2280", "fa4-pr2270", "fa4-pr2432",
                                               "fa4-pr2605", "fa3-pr2889"}


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_every_entry_has_a_source_a_gpu_a_precision_and_a_shape(entry):
    s = entry.source
    # a repository at a full commit and a file, or an address
    assert (s.repository and re.fullmatch(r"[0-9a-f]{40}", s.commit) and s.file) or s.url.startswith("https://")
    assert s.measured_on and entry.kernel
    # the quoted line holds the value (to the table's precision)
    assert any(abs(float(x) - entry.value) <= 0.05 for x in re.findall(r"\d+(?:\.\d+)?", entry.quote)), entry.quote
    assert entry.gpu in GPUS and not load_gpu(entry.gpu).is_cpu
    assert load_gpu(entry.gpu).supports(entry.precision)
    assert entry.unit == UNITS[entry.term]
    assert SHAPE_FIELDS[entry.term] <= set(entry.shape)


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_every_entry_lies_at_or_below_its_gpus_ceiling(entry):
    """TFLOP/s at or below the datasheet's dense peak at the precision (hardware.py); GB/s at or below the link
    measured, counted as the source counts (DeepEP's RDMA figures include the sender's own node)."""
    assert 0 < entry.value <= entry.ceiling()
    if entry.unit == "TFLOP/s":
        assert entry.ceiling() == load_gpu(entry.gpu).peak(entry.precision)


def test_the_ceiling_refuses_a_figure_above_the_peak():
    """The check can fail: the DeepGEMM row that reaches 1,520 TF/s on an H100 is above BF16's 989 TF/s, and
    DeepEP's 90 GB/s over a 50 GB/s NIC holds only because it counts the sender's own node (2 nodes: half)."""
    best = max(entries("gemm", "h100"), key=lambda e: e.value)
    assert best.value == 1520 and best.value <= best.ceiling()
    assert replace(best, precision="bf16").value > replace(best, precision="bf16").ceiling()
    rdma = next(e for e in entries("ep_alltoall") if e.value == 90 and e.shape["link"] == "rdma")
    assert rdma.ceiling() == pytest.approx(2 * 50) and rdma.remote_share == 0.5
    assert rdma.value > replace(rdma, counts_local_share=False).ceiling()
    fake = KernelEntry("attention", "h100", "bf16", "nonesuch", {"seq_len": 1}, 1000.0, "TFLOP/s", Source("x"))
    assert fake.value > fake.ceiling()


@pytest.mark.parametrize("row", cross_check(), ids=lambda r: _id(r["entry"]))
def test_the_cross_check_is_the_terms_figure_at_the_entrys_shape(row):
    e = row["entry"]
    assert row["model"] > 0 and math.isfinite(row["ratio"]) and row["ratio"] == pytest.approx(row["model"] / e.value)
    assert row["unit"] == e.unit and row["model"] == model_figure(e).value


def test_a_gemm_entrys_model_figure_is_the_rate_times_the_shape_factor():
    e = next(x for x in entries("gemm", "h200") if x.shape["m"] == 4096 and x.shape["k"] == 2048)
    gpu, cal = load_gpu("h200"), calibration()
    rate = gemm_rate(gpu, "bf16", cal)
    job = job_for(load_model("tiny-moe"), gpu, 8, 4096, Layout().replace(precision="bf16"), cal)
    assert model_figure(e).value == pytest.approx(rate * GPU_TERMS.gemm_shape_factor(job, 4096, 2048, e.shape["n"],
                                                                                      rate) / 1e12)


@pytest.mark.parametrize("model,gpu,n,flags", [
    ("qwen3-30b-a3b", "h100", 16, {"ep": "8", "precision": "bf16", "gbs": "16"}),
    ("deepseek-v3", "gb200", 512, {"ep": "64", "pp": "8", "vpp": "4", "gbs": "512", "precision": "mxfp8",
                                   "dispatcher": "hybridep"}),
    ("llama3-8b", "h200", 8, {"tp": "2", "gbs": "4"}),
])
def test_the_layouts_gemm_shapes_are_the_ones_the_rates_use(model, gpu, n, flags):
    """explain.layout_gemm_shapes sizes the GEMMs as throughput._gemm_rates does: its shape factors give the rates."""
    spec, g, cal = load_model(model), load_gpu(gpu), calibration()
    job = job_for(spec, g, n, 4096, Layout.from_params(flags), cal)
    rates, peak = gemm_rates(job), gemm_rate(g, job.layout.precision, cal)
    shapes = layout_gemm_shapes(job)
    assert rates.dense == pytest.approx(peak * GPU_TERMS.gemm_shape_factor(job, *shapes["dense"], peak))
    if spec.is_moe:
        expert = peak * cal.grouped_gemm_efficiency[g.family] * GPU_TERMS.gemm_shape_factor(job, *shapes["grouped"],
                                                                                             peak)
        assert rates.dense * rates.grouped == pytest.approx(expert)


def _explained(model, gpu, n, flags, seq_len=4096):
    spec, g, layout = load_model(model), load_gpu(gpu), Layout.from_params(flags)
    est = estimate(spec, g, n, seq_len, layout)
    assert est.legal, est.violations
    return est, {(r.component, r.part): r for r in explain_step(spec, g, n, seq_len, layout, est.time, calibration())}


def test_every_term_of_the_step_is_explained_and_the_covered_ones_name_an_entry():
    est, rows = _explained("qwen3-30b-a3b", "h100", 16, {"ep": "8", "precision": "bf16", "gbs": "16",
                                                          "dispatcher": "deepep"})
    # every component once, in the breakdown's order (gemm and attention in parts)
    assert list(dict.fromkeys(c for c, _ in rows)) == list(est.time.components())
    assert set(est.time.components()) <= set(TIME_KEYS)
    dense, expert = rows[("gemm", "dense GEMMs")], rows[("gemm", "expert grouped GEMMs (one expert)")]
    # BF16 on an H100: the H200's BF16 figures (the same chip), not DeepGEMM's FP8 ones on the same board
    assert dense.entry.gpu == "h200" and dense.entry.precision == "bf16" and dense.range == INSIDE
    assert dense.implied == pytest.approx(gemm_rates(job_for(load_model("qwen3-30b-a3b"), load_gpu("h100"), 16, 4096,
                                                             Layout.from_params({"ep": "8", "precision": "bf16",
                                                                                 "gbs": "16"}),
                                                             calibration())).dense / 1e12)
    assert expert.shape["m"] == pytest.approx(4096 * 8 * 8 / 128) and "dense GEMM's figure" in expert.why
    # no Hopper attention figure with a mask in the tables: extrapolated, and said so
    assert rows[("attention", "forward")].range == EXTRAPOLATED and "hopper" in rows[("attention", "forward")].why
    ep = rows[("ep_comm", "dispatch + combine")]
    assert ep.range == INSIDE and ep.entry.kernel.startswith("DeepEP") and ep.implied_share == pytest.approx(0.7)
    assert rows[("launch_overhead", "whole")].range == NO_TABLE and rows[("launch_overhead", "whole")].entry is None


def test_a_shape_beyond_the_table_is_extrapolated_along_its_axis():
    _, rows = _explained("deepseek-v3", "gb200", 512, {"ep": "64", "pp": "8", "vpp": "4", "gbs": "512",
                                                        "precision": "mxfp8", "dispatcher": "hybridep"})
    fwd = rows[("attention", "forward")]
    assert (fwd.entry.shape["d_qk"], fwd.entry.shape["d_v"]) == (192, 128)  # MLA's widths before the same board
    assert fwd.range == EXTRAPOLATED and "query tokens 4,096 outside the measured 8,192-8,192" in fwd.why
    ep = rows[("ep_comm", "dispatch + combine")]
    assert ep.range == EXTRAPOLATED and "hybridep" in ep.why and "EP span 64" in ep.why
    assert rows[("gemm", "dense GEMMs")].range == EXTRAPOLATED  # no Blackwell FP8 GEMM table


def test_the_host_cpu_has_no_kernel_table():
    _, rows = _explained("tiny-moe", "cpu", 4, {"ep": "2", "precision": "fp32", "gbs": "4"}, seq_len=512)
    assert all(r.entry is None and r.range == NO_TABLE for r in rows.values())
