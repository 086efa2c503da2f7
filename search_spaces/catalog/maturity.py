"""The software a figure belongs to: a container release's maturity on a GPU, measured on published rows.

The constants are fitted on the newest published release of each configuration (search_spaces.calibration.reference).
Users run the containers they have, and on a new GPU the first releases that supported it ran the same layouts slower
(GB200: 25.11 at about three quarters of 26.08's tokens/s). `measure_maturity` takes every release of the
Megatron-Bridge performance summary and, per GPU and release, the geometric mean of tokens/s at that release over
tokens/s at the newest release of the same configuration (model, GPUs, length, precision, mapping, batch):
`Calibration.software_maturity` holds it (bench/fit_calibration.py measures it; CALIBRATION.md has the table).
`at_software(cal, release)` is the calibration for a user's release: the compute rates of each GPU scaled by that
release's maturity there (`Calibration.sustained_factor`); communication is left alone (the published ratios are
whole steps, mostly compute-bound rows: an approximation). A release newer than every measured one is today's
(factor 1); one between measured releases takes the newest measured one not newer than it; one older than every
measured release of a GPU is refused for it (`maturity` says so) -- there is no evidence of how slow it was.
Pure Python.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Iterable

from search_spaces.errors import SpecError

RELEASE = re.compile(r"^(?:nemo[- ]|bridge-)?(\d{2})\.(\d{2})(?:\.(\d{2}))?$", re.IGNORECASE)


def parse_release(text: str) -> tuple[int, ...]:
    """'25.11', '26.04.01', 'nemo-26.02', 'bridge-26.06' -> (year, month[, patch]); a SpecError line otherwise."""
    found = RELEASE.match(str(text).strip())
    if not found:
        raise SpecError(f"software release {text!r} is not a NeMo / Megatron-Bridge container release such as "
                        "'25.11' or '26.04.01'")
    return tuple(int(g) for g in found.groups() if g is not None)


def maturity(table: dict[str, float], release: str) -> tuple[float, str | None]:
    """(the share of today's rate `release` reached on a GPU whose measured table is `table`, the measured
    release it comes from: None for today's). A release older than every measured one raises SpecError."""
    wanted = parse_release(release)
    known = sorted(table, key=parse_release)
    if not known or wanted > parse_release(known[-1]):
        return 1.0, None
    older = [r for r in known if parse_release(r) <= wanted]
    if not older:
        raise SpecError(f"software release {release}: no published evidence this old (oldest measured: "
                        f"{known[0]}); give a release from {known[0]} on")
    return float(table[older[-1]]), older[-1]


def at_software(cal, release: str | None, gpus: Iterable[str] = ()):
    """`cal` as it runs under container `release` (None or "": the constants' own software); the release is
    checked against the tables of `gpus` (a SpecError line for one older than every release measured there)."""
    if not release:
        return cal
    parse_release(release)
    for gpu in gpus:
        try:
            maturity(cal.software_maturity.get(gpu, {}), release)
        except SpecError as exc:
            raise SpecError(f"{exc} (on {gpu})") from None
    return cal.model_copy(update={"software_release": str(release).strip()})


def software_label(cal, gpu: str) -> str:
    """What software a figure for `gpu` assumes, in one line."""
    own = (cal.software or {}).get("container", "")
    newest = "the newest published release of each configuration"
    if not cal.software_release:
        return f"{newest} (the constants' own software)" + (f": {own}" if own else "")
    factor, source = maturity(cal.software_maturity.get(gpu, {}), cal.software_release)
    if source is None:
        return f"release {cal.software_release}: {newest} (no slower release measured on {gpu})"
    return (f"release {cal.software_release}: compute at {factor:.2f}x of {newest} on {gpu} (measured at "
            f"release {source})")


def measure_maturity(rows: Iterable) -> dict[str, dict[str, dict]]:
    """Per GPU, per older release: {"factor": geometric mean tokens/s over the newest release of the same
    configuration, "pairs": how many configurations}; rows are reference Measurements of every release (their
    `release` 'bridge-26.04.01')."""
    groups: dict[tuple, list] = defaultdict(list)
    for m in rows:
        lay = m.layout
        groups[(m.model, m.gpu, m.num_gpus, m.seq_len, lay.precision, lay.tp, lay.pp, lay.cp, lay.vpp, lay.ep,
                lay.mbs, lay.gbs)].append(m)
    logs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for same in groups.values():
        newest = max(same, key=lambda m: parse_release(m.release))
        for m in same:
            if parse_release(m.release) < parse_release(newest.release):
                logs[(m.gpu, m.release.split("-", 1)[-1])].append(math.log(m.tokens() / newest.tokens()))
    out: dict[str, dict[str, dict]] = {}
    for (gpu, release), values in sorted(logs.items(), key=lambda kv: (kv[0][0], parse_release(kv[0][1]))):
        out.setdefault(gpu, {})[release] = {"factor": round(math.exp(sum(values) / len(values)), 3),
                                            "pairs": len(values)}
    return out


__all__ = ["at_software", "maturity", "measure_maturity", "parse_release", "software_label"]
