"""Results the Optuna storage refused (its disk was full): kept in a JSONL file beside the trial directories
until `--resume` records them as trials of their own, so nothing measured is lost.

One record per line, fsynced; a torn last line (the process died mid-write) is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.records import TrialRecord

log = logging.getLogger("moe_autotune")


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
        """The kept records by trial number (a line of another shape is no record)."""
        if not self.path.is_file():
            return {}
        out = {}
        lines = self.path.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                kept = json.loads(line)
            except json.JSONDecodeError:
                where = "its last line (torn by a crash)" if i == len(lines) - 1 else f"line {i + 1}"
                log.warning("result spool %s: skipped %s, not JSON", self.path, where)
                continue
            if isinstance(kept, dict) and type(kept.get("trial_number")) is int and isinstance(kept.get("attrs"), dict):
                out[kept["trial_number"]] = TrialRecord.from_attrs(kept["trial_number"], kept["attrs"])
        return out

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
