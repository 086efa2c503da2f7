"""`moe-autotune lengths`: document lengths from Megatron's indexed datasets (held to Megatron-Core's own reader
on a dataset its own builder wrote), JSONL and Parquet token-count columns; bad data is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from search_spaces.cost.packing import load_histogram

from orchestrator.commands.cli import main
from orchestrator.spec.document_lengths import bin_lengths, idx_document_lengths

# a subprocess: importing torch and megatron-core here would put them in every test's process (and the
# orchestrator's import path rule is that it never imports torch)
MEGATRON_WRITE_AND_READ = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    prefix = sys.argv[1]
    rng = np.random.default_rng(7)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for n in rng.integers(1, 3000, size=500):
        builder.add_item(torch.from_numpy(rng.integers(0, 50000, size=int(n), dtype=np.int32)))
        builder.end_document()
    for parts in ([5, 7], [100, 1, 30]):  # documents of several sequences
        builder.add_document(torch.from_numpy(np.arange(sum(parts), dtype=np.int32)), parts)
    builder.finalize(prefix + ".idx")
    ds = IndexedDataset(prefix)
    docs = ds.document_indices
    lengths = [int(ds.sequence_lengths[docs[i]:docs[i + 1]].sum()) for i in range(len(docs) - 1)]
    print(json.dumps(lengths))
""")


# session-scoped: --dist loadgroup keeps the group on one worker but may run other modules between its tests,
# which would tear a module fixture down and build the dataset again
@pytest.fixture(scope="session")
def megatron_dataset(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("indexed") / "corpus_text_document")
    done = subprocess.run([sys.executable, "-c", MEGATRON_WRITE_AND_READ, prefix], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return prefix, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.xdist_group("megatron_dataset")  # one worker builds the dataset once
def test_idx_reader_agrees_with_megatron_cores(megatron_dataset):
    prefix, megatron_lengths = megatron_dataset
    ours, summary = idx_document_lengths(prefix + ".idx")
    assert ours.tolist() == megatron_lengths and summary["documents_in_source"] == 502
    assert ours[-2:].tolist() == [12, 131]


@pytest.mark.xdist_group("megatron_dataset")  # one worker builds the dataset once
def test_a_large_dataset_is_sampled_within_the_bound(megatron_dataset):
    prefix, megatron_lengths = megatron_dataset
    seen = []
    ours, summary = idx_document_lengths(prefix + ".bin", max_documents=100, seed=1,
                                         advance=lambda done, total: seen.append((done, total)))
    assert len(ours) == 100 and set(ours.tolist()) <= set(megatron_lengths)
    assert summary["sampling"] == "uniform sample of 100 (seed 1)" and seen[-1] == (100, 100)


@pytest.mark.xdist_group("megatron_dataset")  # one worker builds the dataset once
def test_lengths_command_writes_the_histogram_estimate_reads(megatron_dataset, tmp_path, capsys):
    prefix, megatron_lengths = megatron_dataset
    out = tmp_path / "h.json"
    assert main(["lengths", prefix, "--out", str(out)]) == 0
    assert "502 documents" in capsys.readouterr().out
    hist = load_histogram(out)
    assert hist.documents == 502 and hist.longest <= max(megatron_lengths)
    assert abs(hist.mean - np.mean(megatron_lengths)) / np.mean(megatron_lengths) < 0.01  # mean per bin kept
    assert main(["estimate", "--model", "tiny-moe", "--gpu", "h100", "--num-gpus", "8", "--seq-len", "4096",
                 "--lengths", str(out), "--json"]) == 0


def test_jsonl_and_parquet_token_counts(tmp_path):
    rows = [{"id": i, "n_tokens": 100 + 7 * i} for i in range(300)]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    parquet = tmp_path / "docs.parquet"
    pd.DataFrame(rows).to_parquet(parquet)
    for path in (jsonl, parquet):
        out = tmp_path / f"{path.suffix[1:]}.json"
        assert main(["lengths", str(path), "--column", "n_tokens", "--out", str(out), "--max-documents", "200"]) == 0
        hist = load_histogram(out)
        assert hist.documents == 200  # the first 200 rows: the stated bound
        assert hist.summary["sampling"] == "first 200 rows at most"


def test_long_documents_are_cut_only_when_asked(tmp_path):
    hist = bin_lengths(np.array([10_000, 300]), {"source": "t"}, max_length=4096)
    assert hist.documents == 4 and hist.longest == 4096 and hist.summary["documents_cut"] == 1


@pytest.mark.parametrize("content, extra, needle", [
    (b"not an index at all", [], "is not a Megatron indexed dataset index"),
    (b"MMIDIDX\x00\x00" + (2).to_bytes(8, "little") + b"\x04" + bytes(16), [], "version 2"),
    (b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + b"\x04" + (1000).to_bytes(8, "little")
     + (2).to_bytes(8, "little"), [], "truncated"),
])
def test_an_idx_that_is_not_one_is_one_line(tmp_path, capsys, content, extra, needle):
    bad = tmp_path / "bad.idx"
    bad.write_bytes(content)
    assert main(["lengths", str(bad), "--out", str(tmp_path / "h.json"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("rows, needle", [
    ([{"n": -5}], "negative document length"), ([{"n": "many"}], "is not a token count"),
    ([{"x": 1}], "has no column 'n'"), ([], "no documents with tokens")])
def test_bad_jsonl_is_one_line(tmp_path, capsys, rows, needle):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["lengths", str(path), "--column", "n", "--out", str(tmp_path / "h.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
