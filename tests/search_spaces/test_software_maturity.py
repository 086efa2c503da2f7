"""The software a figure belongs to: each published row names its container, the maturity table is measured on the
summary's configurations published in several releases, and `estimate`/`space`/sweeps take the user's release."""

import json

import pytest

from search_spaces.calibration.calibration_file import calibration
from search_spaces.calibration.reference import (
    ORIGINS,
    long_context_moe_rows,
    published_rows,
    summary_rows_every_release,
)
from search_spaces.catalog.maturity import at_software, maturity, measure_maturity, parse_release, software_label
from search_spaces.cost.costmodel import estimate
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.commands.cli import main

DENSE = ("llama3-70b", 64, 4096, Layout(tp=4, pp=4, gbs=128))  # compute-bound: the release's factor shows


def test_every_reference_row_names_its_publisher_and_software():
    for m in published_rows() + long_context_moe_rows():
        assert m.origin in ORIGINS, m
        (kind, container), = m.software
        assert kind == "container" and container, m
    nemo = [m for m in published_rows() if m.source == "nemo long sequence"]
    assert {dict(m.software)["container"] for m in nemo} == {"NeMo 24.03.01", "NeMo 25.04.rc2"}


@pytest.mark.parametrize("text,want", [("25.11", (25, 11)), ("26.04.01", (26, 4, 1)), ("bridge-26.06", (26, 6)),
                                       ("NeMo 24.03.01", (24, 3, 1))])
def test_release_names_parse(text, want):
    assert parse_release(text) == want


@pytest.mark.parametrize("text", ["latest", "26", "26.4", "x;rm -rf", ""])
def test_a_release_that_is_not_one_is_refused(text):
    with pytest.raises(SpecError, match="not a NeMo / Megatron-Bridge container release"):
        parse_release(text)


def test_lookup_newer_is_today_between_takes_the_older_measured_too_old_is_refused():
    table = {"25.11": 0.75, "26.04": 0.9}
    assert maturity(table, "26.08") == (1.0, None)
    assert maturity(table, "26.02") == (0.75, "25.11")
    assert maturity(table, "26.04") == (0.9, "26.04")
    assert maturity(table, "26.04.01") == (1.0, None)  # newer than every release measured slower: today's
    with pytest.raises(SpecError, match="no published evidence this old"):
        maturity(table, "25.09")


def test_the_packaged_table_is_the_measured_one():
    measured = measure_maturity(summary_rows_every_release())
    assert calibration().software_maturity == {g: {r: v["factor"] for r, v in t.items()} for g, t in measured.items()}
    # GB200's first releases ran the same configurations at about three quarters of today's speed
    assert measured["gb200"]["25.11"]["factor"] < 0.8
    assert all(v["pairs"] >= 1 for t in measured.values() for v in t.values())


def test_an_older_release_is_slower_by_about_its_factor_and_the_default_is_today():
    cal = calibration()
    today = estimate(DENSE[0], "gb200", *DENSE[1:], cal=cal).tokens_per_sec_per_gpu
    assert estimate(DENSE[0], "gb200", *DENSE[1:], cal=at_software(cal, None)).tokens_per_sec_per_gpu == today
    old = estimate(DENSE[0], "gb200", *DENSE[1:], cal=at_software(cal, "25.11", ["gb200"])).tokens_per_sec_per_gpu
    factor = cal.software_maturity["gb200"]["25.11"]
    assert factor < old / today < 1  # compute scaled by the factor; communication and overhead are not
    newest = at_software(cal, "26.08", ["gb200"])
    assert estimate(DENSE[0], "gb200", *DENSE[1:], cal=newest).tokens_per_sec_per_gpu == pytest.approx(today)
    assert "0.76x" in software_label(at_software(cal, "25.11"), "gb200")
    assert "constants' own software" in software_label(cal, "gb200")


def test_estimate_states_its_software_and_refuses_a_release_without_evidence(capsys):
    args = ["estimate", "--model", "llama3-70b", "--gpu", "gb200", "--num-gpus", "64", "--seq-len", "4096",
            "--tp", "4", "--pp", "4", "--gbs", "128"]
    assert main(args + ["--json"]) == 0
    today = json.loads(capsys.readouterr().out)
    assert "newest published release" in today["software"]
    assert main(args + ["--json", "--software", "25.11"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert old["software"].startswith("release 25.11")
    assert old["tokens_per_sec_per_gpu"] < today["tokens_per_sec_per_gpu"]
    h100 = [a if a != "gb200" else "h100" for a in args]
    assert main(h100 + ["--software", "25.09"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no published evidence" in err[0] and "h100" in err[0]


def test_a_sweep_spec_takes_the_release_and_its_prior_runs_at_it():
    from orchestrator.search.prior import Prior
    from orchestrator.spec.schema import parse_spec

    spec = parse_spec({"model": "llama3-70b", "gpu": "gb200", "nodes": 16, "gpus_per_node": 4, "seq_len": 4096,
                       "software": "25.11"})
    assert spec.software == "25.11"
    assert Prior(spec).cal.software_release == "25.11"
    assert parse_spec({"model": "tiny-moe"}).software is None
    with pytest.raises(SpecError, match="not a NeMo / Megatron-Bridge container release"):
        parse_spec({"model": "tiny-moe", "software": "latest"})
