"""The published rows are held to what was measured: tokens/s. A release's TF/s is in its own FLOP count, and
Megatron-Bridge changed gpt-oss's count at 26.06 (the tables' TF/s / tokens/s moves from 0.83x of today's count
to 1.00x), so a TF/s figure converted with today's count would understate those runs by 17%."""

import pytest

from search_spaces.calibration.fit import model_spec
from search_spaces.calibration.reference import summary_rows
from search_spaces.cost.flops import flops_per_token


def _rows():
    return {(r.source, r.model, r.gpu, r.seq_len): r for r in summary_rows()}


def test_summary_rows_carry_the_published_tokens_per_second():
    rows = _rows()
    assert rows and all(r.tokens_per_sec_per_gpu for r in rows.values())
    old = rows[("summary 26.04.01", "gpt-oss-120b", "gb300", 4096)]
    assert old.tokens() == 19200  # the table's tokens/s, not 523 TF/s over today's FLOPs per token
    today = flops_per_token(model_spec("gpt-oss-120b"), 4096)
    assert old.tflops() * 1e12 / old.tokens() / today == pytest.approx(0.83, abs=0.01)
    new = rows[("summary 26.08", "gpt-oss-120b", "gb300", 4096)]
    assert new.tflops() * 1e12 / new.tokens() / today == pytest.approx(1.0, abs=0.005)


def test_a_cell_with_a_second_figure_in_brackets_reads_its_first():
    # 25.11's Llama3-8B on GB300 prints "37556 (36108)"; the row is kept, at the first figure
    rows = _rows()
    llama = rows[("summary 25.11", "llama3-8b", "gb300", 8192)]
    assert llama.tokens() == 37556
