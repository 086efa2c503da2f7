"""Results the Optuna storage refused (its disk was full): kept in a JSONL file beside the trial directories
until `--resume` records them as trials of their own, so nothing measured is lost.

One record per line, fsynced; a torn last line (the process died mid-write) is skipped with a warning, and so
is a damaged one (read within search_spaces.bounded's bounds).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from search_spaces.bounded import loads_json
from search_spaces.errors import SpecError

from orchestrator.records import TrialRecord

log = logging.getLogger("moe_autotune")
MAX_LINE_BYTES = 1 << 20  # one result and its record: a few kB


def _bounded_lines(fh: BinaryIO) -> Iterator[bytes | None]:
    """The file's lines (without their line breaks); None for a line longer than MAX_LINE_BYTES (skipped
    without holding it in memory)."""
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES:
            while line and not line.endswith(b"\n"):  # the rest of the long line
                line = fh.readline(MAX_LINE_BYTES)
            yield None
            continue
        yield line.rstrip(b"\r\n")


@dataclass(frozen=True)
class ResultSpool:
    path: Path

    def add(self, number: int, params: dict[str, Any], record: TrialRecord) -> None:
        """Keep trial `number`'s layout params and record (status, result, prediction, ...)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = {"trial_number": number, "params": params, "attrs": record.stored_attrs()}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(line, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def records(self) -> dict[int, TrialRecord]:
        """The kept records by trial number (a line of another shape is no record). Each line is read within
        search_spaces.bounded's bounds (at most MAX_LINE_BYTES, nesting, digits): a damaged spool is skipped line
        by line with a warning, never a traceback."""
        if not self.path.is_file():
            return {}
        out = {}
        with open(self.path, "rb") as fh:
            lines = list(_bounded_lines(fh))
        for i, line in enumerate(lines):
            where = "its last line (torn by a crash)" if i == len(lines) - 1 else f"line {i + 1}"
            if line is None:
                log.warning("result spool %s: skipped %s, longer than %d bytes", self.path, where, MAX_LINE_BYTES)
                continue
            if not line.strip():
                continue
            try:
                kept = loads_json(line.decode("utf-8", errors="replace"), f"result spool {self.path}, {where}")
            except SpecError as exc:  # the message names the line and why, quoting none of it
                log.warning("%s; skipped", exc)
                continue
            if isinstance(kept, dict) and type(kept.get("trial_number")) is int and isinstance(kept.get("attrs"), dict):
                try:
                    out[kept["trial_number"]] = TrialRecord.from_attrs(kept["trial_number"], kept["attrs"])
                except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
                    log.warning("result spool %s: skipped %s, not a trial record (%s)", self.path, where,
                                type(exc).__name__)
        return out

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
