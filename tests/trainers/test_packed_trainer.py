"""The trainer's packed batches (THD): the CPU core attention keeps every token inside its document (with and
without CP), the batches are laid out as Megatron's THD RoPE and Transformer Engine expect, and a packed trial
reports tokens/s of real tokens and its padding."""

from __future__ import annotations

import json
import types
from functools import partial

import pytest

torch = pytest.importorskip("torch")

from search_spaces.cost.packing import histogram  # noqa: E402

from tests.trainer_helpers import assert_ok, run_trainer  # noqa: E402
from trainers import cp_attention  # noqa: E402
from trainers.cp_attention import ContextParallelDotProductAttention as Attention  # noqa: E402
from trainers.packed_batches import PackedTokens, thd_token_positions  # noqa: E402

HEADS, DIM = 2, 8
CU_PADDED = [0, 16, 48, 56, 64]  # four documents (padded to multiples of 2*CP = 4 and 8)


def _attention(cp_size: int = 1, cp_rank: int = 0):
    """The module's attention methods on a plain object (no process groups needed)."""
    ns = types.SimpleNamespace(heads=HEADS, query_groups=HEADS, softmax_scale=DIM ** -0.5, cp_size=cp_size,
                               cp_rank=cp_rank, cp_group=None, window_size=None, softmax_offset=None)
    for name in ("_packed", "_attend", "_hidden"):
        setattr(ns, name, partial(getattr(Attention, name), ns))
    return ns


def _params(cu_padded, rows: int = 1):
    cu = torch.tensor(cu_padded, dtype=torch.int32)
    return types.SimpleNamespace(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_q_padded=cu, pack_rows=rows)


def _causal(q, k, v):
    """Plain causal attention of one document ([t, heads, dim])."""
    scores = torch.einsum("qhd,khd->hqk", q, k) * DIM ** -0.5
    t = q.shape[0]
    scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v).reshape(t, -1)


def test_a_token_never_attends_across_a_document_boundary():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(64, HEADS, DIM, generator=gen) for _ in range(3))
    out = _attention()._packed(q, k, v, _params(CU_PADDED)).reshape(64, -1)
    for a, b in zip(CU_PADDED, CU_PADDED[1:]):
        assert torch.allclose(out[a:b], _causal(q[a:b], k[a:b], v[a:b]), atol=1e-6)
    # another first document changes nothing after it
    k2, v2 = k.clone(), v.clone()
    k2[:16], v2[:16] = torch.randn(16, HEADS, DIM), torch.randn(16, HEADS, DIM)
    again = _attention()._packed(q, k2, v2, _params(CU_PADDED)).reshape(64, -1)
    assert torch.equal(again[16:], out[16:]) and not torch.allclose(again[:16], out[:16])


def test_under_cp_each_rank_attends_as_the_whole_pack_does(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(64, HEADS, DIM, generator=gen) for _ in range(3))
    whole = _attention()._packed(q, k, v, _params(CU_PADDED)).reshape(64, -1)
    cp = 2
    held = [thd_token_positions(torch.tensor(CU_PADDED), r, cp)[2] for r in range(cp)]
    assert sorted(torch.cat(held).tolist()) == list(range(64))  # every token on exactly one rank
    gathered = {}  # the CP all-gather: every rank's local tokens in rank order (found by the local's storage)
    monkeypatch.setattr(cp_attention, "gather_from_sequence_parallel_region", lambda t, *a: gathered[t.data_ptr()])
    for r in range(cp):
        k_local, v_local = k[held[r]], v[held[r]]
        gathered[k_local.data_ptr()] = torch.cat([k[idx] for idx in held])
        gathered[v_local.data_ptr()] = torch.cat([v[idx] for idx in held])
        part = _attention(cp, r)._packed(q[held[r]], k_local, v_local, _params(CU_PADDED))
        assert torch.allclose(part.reshape(len(held[r]), -1), whole[held[r]], atol=1e-6)


def test_a_pack_of_two_sequences_attended_row_by_row_equals_the_whole_pack(monkeypatch):
    """MBS 2: the pack's two sequences attended apart (as a batch, no [pack, pack] scores) give what the whole
    pack attended at once gives, on one rank and on each CP rank."""
    two_rows = [0, 8, 32, 40, 48, 64]  # 8 + 24 | 8 + 8 + 16: no document crosses the row boundary at 32
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(64, HEADS, DIM, generator=gen) for _ in range(3))
    whole = _attention()._packed(q, k, v, _params(two_rows)).reshape(64, -1)
    assert torch.allclose(_attention()._packed(q, k, v, _params(two_rows, rows=2)).reshape(64, -1), whole,
                          atol=1e-6)
    cp = 2
    held = [thd_token_positions(torch.tensor(two_rows), r, cp)[2] for r in range(cp)]
    gathered = {}
    monkeypatch.setattr(cp_attention, "gather_from_sequence_parallel_region", lambda t, *a: gathered[t.data_ptr()])
    for r in range(cp):
        k_local, v_local = k[held[r]], v[held[r]]
        gathered[k_local.data_ptr()] = torch.cat([k[idx] for idx in held])
        gathered[v_local.data_ptr()] = torch.cat([v[idx] for idx in held])
        part = _attention(cp, r)._packed(q[held[r]], k_local, v_local, _params(two_rows, rows=2))
        assert torch.allclose(part.reshape(len(held[r]), -1), whole[held[r]], atol=1e-6)


def test_packed_batches_follow_megatrons_thd_layout():
    pytest.importorskip("megatron.core")
    from trainers.run import SyntheticTokens

    hist = histogram([5, 13, 40], [3, 2, 1])
    data = PackedTokens(SyntheticTokens(vocab=97, seq_len=64, gbs=2, mbs=2, seed=3), hist, multiple=4)
    group = types.SimpleNamespace(size=lambda: 2, rank=lambda: 1)
    (batch,) = list(data.microbatches(0, 0, 1, "cpu", group))
    params = batch["packed_seq_params"]
    assert params.pack_rows == 2  # the CPU attention attends the pack's two sequences apart
    cu, cu_padded = params.cu_seqlens_q.tolist(), params.cu_seqlens_q_padded.tolist()
    docs = [d for seq in data.step(0).documents for d in seq]
    assert [b - a for a, b in zip(cu, cu[1:])] == docs  # real lengths
    assert cu_padded[-1] == 128 and all(b - a >= d and (b - a) % 4 == 0
                                        for (a, b), d in zip(zip(cu_padded, cu_padded[1:]), docs))
    assert batch["tokens"].shape == (1, 64)  # half of the 128-token pack on CP rank 1
    assert batch["loss_mask"].sum().item() < 64 or sum(docs) == 128
    report = data.report(range(0, 1))
    assert report["useful_token_share"] == pytest.approx(sum(docs) / 128)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_packed_trial_reports_real_tokens_and_padding(tmp_path):
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps({"format": "moe-autotune document lengths v1", "lengths": [9, 30, 70],
                                   "counts": [5, 3, 1]}))
    result, proc = run_trainer(tmp_path / "cp2", 2, "--cp", "2", "--seq-len", "128", "--mbs", "2", "--gbs", "4",
                               "--lengths", str(lengths))
    assert_ok(result, proc)
    packing = result.extra["packing"]
    assert 0.5 < packing["useful_token_share"] < 1.0 and packing["pad_multiple"] == 4
    assert result.applied["core_attention"] == ["ContextParallelDotProductAttention"]
    full_rate = 4 * 128 / result.step_time_s / 2  # gbs 4 sequences of 128 tokens on 2 ranks
    assert result.tokens_per_sec_per_gpu == pytest.approx(full_rate * packing["useful_token_share"])
    assert result.loss[-1] < result.loss[0]
