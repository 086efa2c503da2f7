"""Packed documents (THD): the histogram, the expected packed sequence, and what it does to the cost model.

With every document seq_len tokens long the figures are today's to the last digit; short documents leave little
attention per sequence, so CP's ring is no longer hidden and the best layout moves toward less CP."""

from __future__ import annotations

import json

import pytest

from search_spaces.cost import memo
from search_spaces.cost.costmodel import estimate
from search_spaces.cost.packing import (
    DocumentStream,
    full_length,
    histogram,
    load_histogram,
    pack_sequence,
    packed_statistics,
    pad_multiple,
)
from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout

from orchestrator.commands.cli import main

L128K = 131072
# the figures an estimate holds; full-length packing must reproduce each exactly
FIGURES = ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s", "peak_memory_gib")
CASES = [  # (model, gpu, GPUs, seq_len, layout): MLA with hierarchical CP, GQA, sliding windows, gated delta-net
    ("deepseek-v3", "h100", 256, L128K,
     dict(tp=1, cp=16, ep=16, pp=8, vpp=8, gbs=128, precision="fp8-blockwise", recompute="full", dispatcher="deepep",
          cp_comm_type="a2a+p2p", hierarchical_cp=(8, 2))),
    ("deepseek-v3", "h100", 256, L128K, dict(tp=2, cp=8, ep=16, pp=8, vpp=4, gbs=128, cp_comm_type="p2p",
                                             recompute="full")),
    ("qwen3-235b-a22b", "gb200", 128, L128K, dict(tp=2, cp=8, ep=8, pp=4, gbs=64, cp_comm_type="allgather",
                                                  recompute="full")),
    ("gpt-oss-120b", "h100", 64, 32768, dict(tp=2, cp=4, ep=8, gbs=64, cp_comm_type="a2a")),
    ("qwen3-next-80b-a3b", "h100", 64, 65536, dict(tp=2, cp=4, ep=8, pp=2, gbs=32, cp_comm_type="p2p",
                                                   recompute="full")),
]


def _short_documents():
    """Mostly 0.5-8K documents, a few long ones: what web/code corpora look like at 128K packing."""
    return histogram([512, 1024, 2048, 4096, 8192, 16384, 65536], [300, 300, 200, 100, 50, 20, 2])


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[3]}")
def test_full_length_documents_give_todays_figures_exactly(case):
    model, gpu, n, seq_len, fields = case
    layout = Layout(**fields)
    memo.clear_all()
    today = estimate(model, gpu, n, seq_len, layout)
    assert today.legal, today.violations
    memo.clear_all()
    packed = estimate(model, gpu, n, seq_len, layout, packing=full_length(seq_len))
    for name in FIGURES:
        assert getattr(packed, name) == getattr(today, name), name
    assert packed.time.components() == today.time.components()
    assert packed.packing["useful_token_share"] == 1.0 and packed.packing["attention_vs_full_length"] == 1.0


def test_short_documents_leave_little_attention_and_expose_the_cp_ring():
    layout = Layout(**CASES[1][4])
    full = estimate("deepseek-v3", "h100", 256, L128K, layout)
    packed = estimate("deepseek-v3", "h100", 256, L128K, layout, packing=_short_documents())
    assert packed.packing["attention_vs_full_length"] < 0.1
    assert packed.time.attention < 0.2 * full.time.attention
    # the same K/V bytes per ring step, hidden behind a tenth of the attention
    assert packed.time.cp_comm > 2 * full.time.cp_comm
    assert packed.tokens_per_sec_per_gpu > full.tokens_per_sec_per_gpu
    assert packed.tflops_per_gpu < full.tflops_per_gpu  # fewer FLOPs per token


def test_with_short_documents_less_cp_wins_at_128k():
    """At a fixed grid family (TP1, EP16, PP8) the full-length sequences want CP16, the short documents less."""
    def best_cp(packing):
        rates = {}
        for cp, hier in ((4, (2, 2)), (8, (4, 2)), (16, (8, 2))):
            layout = Layout(tp=1, cp=cp, ep=16, pp=8, vpp=4, gbs=128, precision="fp8-blockwise", recompute="full",
                            dispatcher="deepep", cp_comm_type="a2a+p2p", hierarchical_cp=hier)
            est = estimate("deepseek-v3", "h100", 256, L128K, layout, packing=packing)
            assert est.legal, est.violations
            rates[cp] = est.tokens_per_sec_per_gpu
        return max(rates, key=rates.get)
    assert best_cp(_short_documents()) < best_cp(None)


def test_padding_is_spent_compute_never_useful_tokens():
    h = histogram([100], [10])
    stats = packed_statistics(h, 4096, pad_multiple(cp=4, tp=2, sequence_parallel=True))  # multiple 16
    assert pad_multiple(4, 2, True) == 16 and pad_multiple(4, 2, False) == 8 and pad_multiple(1, 8, True) == 1
    assert stats.pieces == ((112, 4096 / 112),)
    assert stats.useful_share == pytest.approx(100 / 112)
    layout = Layout(tp=2, cp=4, gbs=8)
    plain = estimate("tiny-moe", "h100", 8, 4096, layout, packing=histogram([112], [10]))
    padded = estimate("tiny-moe", "h100", 8, 4096, layout, packing=h)
    assert padded.step_time_s == plain.step_time_s  # the same padded documents: the same work
    assert padded.tokens_per_sec_per_gpu == pytest.approx(plain.tokens_per_sec_per_gpu * 100 / 112)


def test_documents_longer_than_half_a_sequence_travel_alone():
    stats = packed_statistics(histogram([1000, 3000], [1, 1]), 4096, 1)
    # the 3000-token document leaves 1096 for the 1000-token one: one sequence holds both
    assert sum(n for _, n in stats.pieces) == pytest.approx(2.0)
    stats = packed_statistics(histogram([3000], [1]), 4096, 1)
    assert stats.useful_share == pytest.approx(3000 / 4096)


def test_memo_tables_are_keyed_on_the_distribution():
    layout = Layout(**CASES[1][4])
    a, b = _short_documents(), histogram([32768], [1])
    memo.clear_all()
    fresh_b = estimate("deepseek-v3", "h100", 256, L128K, layout, packing=b).time.components()
    memo.clear_all()
    first_a = estimate("deepseek-v3", "h100", 256, L128K, layout, packing=a).time.components()
    warm_b = estimate("deepseek-v3", "h100", 256, L128K, layout, packing=b).time.components()
    assert warm_b == fresh_b and warm_b["attention"] != first_a["attention"]


def test_a_stream_packs_documents_as_megatron_wants_them():
    stream = DocumentStream(_short_documents(), 65536, 16, seed=3)
    for _ in range(20):
        docs = stream.next_sequence()
        cu, cu_padded = pack_sequence(docs, 65536, 16)
        assert cu_padded[-1] == 65536 and all(p % 16 == 0 for p in cu_padded[:-1])
        assert [b - a for a, b in zip(cu, cu[1:])] == docs
        assert all(cu[i + 1] <= cu_padded[i + 1] for i in range(len(docs)))
    again = DocumentStream(_short_documents(), 65536, 16, seed=3)
    assert again.next_sequence() == DocumentStream(_short_documents(), 65536, 16, seed=3).next_sequence()


@pytest.mark.parametrize("lengths, counts, needle", [
    ([], [], "empty"), ([10, 20], [0, 0], "every count is 0"), ([10], [-1], "non-negative"),
    ([20, 10], [1, 1], "ascending"), ([0], [1], "positive integer"), ([10], [1, 2], "1 lengths but 2 counts"),
    ([10], [float("nan")], "non-negative number")])
def test_a_histogram_that_is_not_one_is_refused(lengths, counts, needle):
    with pytest.raises(SpecError, match=needle):
        histogram(lengths, counts)


def test_documents_longer_than_the_sequence_are_refused():
    with pytest.raises(SpecError, match="longer than seq_len 4096"):
        estimate("tiny-moe", "h100", 8, 4096, Layout(gbs=8), packing=histogram([1000, 5000], [1, 1]))


def _write(tmp_path, data, name="h.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("data, needle", [
    ({"lengths": [1], "counts": [1]}, "is not one"),
    ({"format": "moe-autotune document lengths v1", "lengths": [], "counts": []}, "empty"),
    ({"format": "moe-autotune document lengths v1", "lengths": [100, 200], "counts": [-3, 1]}, "non-negative"),
    ({"format": "moe-autotune document lengths v1", "lengths": [100, 9000], "counts": [1, 1]}, "longer than seq_len"),
])
def test_estimate_refuses_a_bad_histogram_in_one_line(tmp_path, capsys, data, needle):
    path = _write(tmp_path, data)
    rc = main(["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096",
               "--lengths", str(path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err, err


def test_estimate_shows_useful_tokens_and_attention_share(tmp_path, capsys):
    path = _write(tmp_path, {"format": "moe-autotune document lengths v1", "lengths": [300, 1000],
                             "counts": [5, 1]})
    assert load_histogram(path).describe()["documents"] == 6
    argv = ["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096",
            "--cp", "2", "--lengths", str(path)]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["packing"]["pad_multiple"] == 4 and 0 < out["packing"]["useful_token_share"] <= 1
    assert 0 < out["packing"]["attention_share_of_step"] < 1
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "useful tokens" in text and "of a full-length sequence's" in text
    assert main(argv[:-2] + ["--packing", "packed"]) == 2
    assert "needs --lengths" in capsys.readouterr().err


def test_on_cpu_packed_attention_is_dense_and_each_document_costs_host_time():
    """The CPU trainer's attention computes every row's scores (other documents masked out), and its eager THD
    path pays per document: on cpu packing leaves the attention as it is and adds host time with the documents;
    on a GPU the attention shrinks (THD kernels)."""
    layout = Layout(gbs=8, precision="fp32", dispatcher="alltoall")
    full = estimate("tiny-moe", "cpu", 4, 256, layout).time
    few = estimate("tiny-moe", "cpu", 4, 256, layout, packing=histogram([120, 250], [1, 1])).time
    many = estimate("tiny-moe", "cpu", 4, 256, layout, packing=histogram([12, 30], [1, 1])).time
    assert few.attention == many.attention == full.attention
    assert full.launch_overhead < few.launch_overhead < many.launch_overhead
    gpu = Layout(gbs=8, dispatcher="alltoall")
    gpu_full = estimate("tiny-moe", "h100", 4, 8192, gpu).time
    gpu_many = estimate("tiny-moe", "h100", 4, 8192, gpu, packing=histogram([512, 1024], [1, 1])).time
    assert gpu_many.attention < 0.5 * gpu_full.attention
