"""`moe-autotune lengths`: read the document lengths of a dataset and write the histogram that `estimate --lengths`,
`space --lengths` and a sweep spec's `packing: {lengths: FILE}` read (search_spaces/cost/packing.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("lengths")(lengths)


def lengths(
    data: Path = typer.Argument(..., help="a Megatron indexed dataset (PREFIX, PREFIX.idx or PREFIX.bin), or a "
                                          ".jsonl / .parquet file"),
    out: Path = typer.Option(..., "--out", help="the histogram file to write (JSON)"),
    column: Optional[str] = typer.Option(None, "--column", help="JSONL/Parquet: the column holding each document's "
                                                                "token count"),
    text_column: Optional[str] = typer.Option(None, "--text-column",
                                              help="JSONL/Parquet: a text column to tokenise (needs --tokenizer)"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="a Hugging Face tokenizer, local path or "
                                                                      "cached name (only with --text-column)"),
    max_documents: int = typer.Option(1_000_000, "--max-documents", min=1, max=1 << 31,
                                      help="read at most this many documents: a uniform sample of an indexed "
                                           "dataset, the first rows of a JSONL/Parquet file"),
    max_length: Optional[int] = typer.Option(None, "--max-length", min=1,
                                             help="cut longer documents into pieces of this many tokens (your "
                                                  "seq_len: what packing into it does to them)"),
    seed: int = typer.Option(0, "--seed", min=0, help="the sample's seed (indexed datasets)"),
) -> int:
    """Read document lengths (sampled within --max-documents, with a progress bar), bin them and write the
    histogram; print its summary."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from search_spaces.inputs import check_output_file

    from orchestrator.spec.document_lengths import (
        bin_lengths,
        histogram_text,
        idx_document_lengths,
        load_tokenizer,
        table_document_lengths,
    )
    from orchestrator.userio import console, write_text

    check_output_file(out, "--out")
    table = data.suffix.lower() in (".jsonl", ".json", ".parquet", ".pq")
    if not table and (column or text_column or tokenizer):
        from search_spaces.errors import SpecError
        raise SpecError("--column, --text-column and --tokenizer are for JSONL/Parquet files, not indexed datasets")
    with Progress(TextColumn("[bold]reading document lengths"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("read", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        if table:
            tok = load_tokenizer(tokenizer) if tokenizer else None
            counts, summary = table_document_lengths(data, column, text_column, tok, max_documents, advance)
        else:
            counts, summary = idx_document_lengths(data, max_documents, seed, advance)
    hist = bin_lengths(counts, summary, max_length)
    write_text(out, "document-length histogram", histogram_text(hist))  # a full device: one line, exit 6
    d = hist.describe()
    console().print(f"{d['documents']:,.0f} documents ({summary['sampling']}) of {summary['source']}: mean "
                    f"{d['mean_tokens']:,.0f} tokens, median {d['median_tokens']:,}, p90 {d['p90_tokens']:,}, "
                    f"longest {d['longest_tokens']:,}; half the tokens are in documents of "
                    f"{d['token_weighted_median']:,}+ tokens; {d['bins']} bins -> {out}")
    return 0
