"""Published document-length distributions of long-context training data as histograms `--lengths` reads, and
what packing those documents does to the best layout of the README's two 128K situations.

Two sources, each with the figures quoted; within a band the lengths are log-uniform (an assumption: neither gives
its bars as numbers), 8 bins per doubling as `moe-autotune lengths` writes:
- ByteScale (Ge et al., "ByteScale: Efficient Scaling of LLM Training with a 2048K Context Length on More Than
  12,000 GPUs", arXiv 2502.21231, section 3.1), ByteDance's Byted dataset, a long-context corpus: "nearly 80% of
  the samples are 4K tokens or shorter ... 1% of the samples (>=128K) contribute 44.3%" of the tokens. 80% of the
  documents 128-4K tokens, 19% 4K-128K, and the 1% above 128K cut into 128K pieces (`lengths --max-length
  131072`: the pieces fill whole sequences) carrying 44.3% of the tokens.
- ProLong (Gao et al., "How to Train Long-Context Language Models (Effectively)", arXiv 2410.02660, Table 14),
  ShortMix, the short-document 37% of its long-context mix, lengths as the model sees them (packed and truncated
  at 64K): documents longer than 4K, 8K, 16K, 32K: 10.9%, 7.2%, 3.2%, 0.8%.

    .venv/bin/python bench/published_lengths.py            # write examples/lengths-*.json, then compare
    .venv/bin/python bench/published_lengths.py --no-space # only write the files
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from search_spaces.cost.packing import HISTOGRAM_FORMAT, LengthHistogram, histogram

ROOT = Path(__file__).resolve().parent.parent
SEQ_LEN = 131072
BINS_PER_DOUBLING = 8
# name: (source, bands [(shortest, longest, share of the documents)], share of the tokens in full-length pieces)
PUBLISHED = {
    "bytescale-128k": (
        "ByteScale (Ge et al., arXiv 2502.21231, section 3.1), Byted dataset: 80% of samples <= 4K tokens, 1% >= 128K "
        "carrying 44.3% of tokens; log-uniform within 128-4K and 4K-128K (assumed); documents above 128K cut into "
        "128K pieces",
        [(128, 4096, 0.80), (4096, SEQ_LEN, 0.19)], 0.443),
    "prolong-shortmix": (
        "ProLong (Gao et al., arXiv 2410.02660, Table 14), ShortMix as the model sees it (packed, truncated at 64K): "
        "documents > 4K, 8K, 16K, 32K: 10.9%, 7.2%, 3.2%, 0.8%; log-uniform within 128-4K, 4-8K, 8-16K, 16-32K, "
        "32-64K (assumed)",
        [(128, 4096, 0.891), (4096, 8192, 0.037), (8192, 16384, 0.040), (16384, 32768, 0.024),
         (32768, 65536, 0.008)], 0.0),
}
SITUATIONS = [("DeepSeek-V3 128K, 256 H100", "deepseek-v3", "h100", 256),
              ("Qwen3-235B 128K, 128 GB200", "qwen3-235b-a22b", "gb200", 128)]


def _band(shortest: int, longest: int, first: bool) -> list[int]:
    """Bin lengths from shortest (when first) to longest, log-spaced, each band's upper end its own."""
    steps = round(BINS_PER_DOUBLING * math.log2(longest / shortest))
    return [round(shortest * 2 ** (i / BINS_PER_DOUBLING)) for i in range(0 if first else 1, steps + 1)]


def published(name: str) -> LengthHistogram:
    """The histogram built from a source's figures (module docstring)."""
    source, bands, long_token_share = PUBLISHED[name]
    lengths: list[int] = []
    counts: list[float] = []
    for i, (shortest, longest, share) in enumerate(bands):
        points = [d for d in _band(shortest, longest, first=i == 0) if d < SEQ_LEN]
        lengths += points
        counts += [share / len(points)] * len(points)
    if long_token_share:
        below = sum(d * c for d, c in zip(lengths, counts))
        lengths.append(SEQ_LEN)  # the pieces of the longer documents, carrying their share of the tokens
        counts.append(long_token_share / (1 - long_token_share) * below / SEQ_LEN)
    return histogram(lengths, counts, {"source": source})


def path_of(name: str) -> Path:
    return ROOT / "examples" / f"lengths-{name}.json"


def write(name: str) -> LengthHistogram:
    hist = published(name)
    data = hist.to_json()
    data["counts"] = [round(c, 9) for c in data["counts"]]
    path_of(name).write_text(json.dumps({"format": HISTOGRAM_FORMAT, **data}, indent=1) + "\n")
    return hist


def compare(name: str) -> list[dict]:
    """For each situation, what `moe-autotune space --lengths` says (the command users run, its JSON): the best
    layout for full-length documents and for these, each's tokens/s/GPU, and the attention share."""
    cli = str(Path(sys.executable).with_name("moe-autotune"))
    rows = []
    for situation, model, gpu, n in SITUATIONS:
        argv = [cli, "space", "--model", model, "--gpu", gpu, "--num-gpus", str(n), "--seq-len", str(SEQ_LEN),
                "--lengths", str(path_of(name)), "--top", "1", "--json"]
        out = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
        versus = out["packing"]["versus_full_length"]
        rows.append({"distribution": name, "situation": situation, "full_length_best": versus["full_length_best"],
                     "tokens_full_length": round(versus["full_length_best_tokens_full"]),
                     "its_tokens_on_these_documents": round(versus["full_length_best_tokens_packed"]),
                     "packed_best": versus["packed_best"], "tokens_packed": round(versus["packed_best_tokens_packed"]),
                     "attention_vs_full_length": round(versus["attention_vs_full_length"], 3)})
    return rows


def main(argv: list[str]) -> None:
    for name in PUBLISHED:
        hist = write(name)
        d = hist.describe()
        print(f"wrote {path_of(name).relative_to(ROOT)}: {len(hist.lengths)} bins, mean {d['mean_tokens']:,.0f} "
              f"tokens, median {d['median_tokens']:,}, p90 {d['p90_tokens']:,}, token-weighted median "
              f"{d['token_weighted_median']:,}")
    if "--no-space" in argv:
        return
    for name in PUBLISHED:
        for row in compare(name):
            print(json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1:])
