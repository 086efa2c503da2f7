"""The records MLflow could not take: kept in a local JSONL file (one record a line, fsynced) and delivered later.

Not orchestrator/sweep/spool.py (results the Optuna storage refused): this one holds only MLflow's records, which
the Optuna storage has. A torn last line (a crash mid-write) is skipped; a damaged line anywhere else is moved to
mlflow-spool.corrupt.jsonl. Both are logged and counted (`torn`, `set_aside`): never silently dropped.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from search_spaces.bounded import loads_json

from orchestrator.errors import LeaseLost

log = logging.getLogger("moe_autotune")

CORRUPT_SPOOL = "mlflow-spool.corrupt.jsonl"


class RecordSpool:
    """The spool file at `path` and what became of its records: `pending` (in it), `torn` (torn last records
    skipped), `set_aside` (damaged records moved to mlflow-spool.corrupt.jsonl)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.pending = 0
        self.torn = 0
        self.set_aside = 0

    def add(self, record: dict[str, Any]) -> None:
        """Append one record (`trial_number`, `payload`, why it was not delivered), on disk before it returns."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as fh:
            if fh.tell() and not _ends_with_newline(self.path):
                fh.write(b"\n")  # a crash tore the last record: never glue the next one onto it
            fh.write((json.dumps(record, default=str) + "\n").encode())
            fh.flush()
            os.fsync(fh.fileno())
        self.pending += 1

    def flush(self, deliver: Callable[[int, dict[str, Any]], None]) -> int:
        """`deliver` each spooled record (its trial number and payload); returns how many are still pending: those
        whose delivery raised (LeaseLost is raised on: the records are the new driver's)."""
        if not self.path.is_file():
            self.pending = 0
            return 0
        raw = self.path.read_bytes()
        lines = raw.decode("utf-8", errors="replace").splitlines()
        torn_tail = bool(raw) and not raw.endswith(b"\n")
        left, damaged = [], []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            rec = _spool_record(line)
            if rec is None:
                if torn_tail and i == len(lines) - 1:
                    self.torn += 1
                    log.warning("MLflow spool %s: skipped a torn last record (the sweep stopped while writing "
                                 "it); the Optuna storage still has the trial", self.path)
                else:
                    damaged.append(line)
                continue
            try:
                deliver(rec["trial_number"], rec["payload"])
            except LeaseLost:
                raise
            except Exception:  # noqa: BLE001 -- MLflow still down: the record stays in the spool
                left.append(line)
        self._set_aside(damaged)
        if left:
            self.path.write_text("\n".join(left) + "\n")
        else:
            self.path.unlink()
        self.pending = len(left)
        return self.pending

    def _set_aside(self, lines: list[str]) -> None:
        if not lines:
            return
        corrupt = self.path.with_name(CORRUPT_SPOOL)
        with open(corrupt, "a") as fh:
            fh.write("\n".join(lines) + "\n")
        self.set_aside += len(lines)
        log.warning("MLflow spool %s: %d corrupt record(s) moved to %s (not delivered; the Optuna storage "
                     "still has the trials)", self.path, len(lines), corrupt)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _spool_record(line: str) -> dict[str, Any] | None:
    """The record a spool line holds, or None when the line is damaged."""
    try:
        rec = loads_json(line, "MLflow spool line")  # bounded: nesting, digits (SpecError is a ValueError)
    except ValueError:
        return None
    ok = (isinstance(rec, dict) and isinstance(rec.get("trial_number"), int)
          and not isinstance(rec.get("trial_number"), bool) and isinstance(rec.get("payload"), dict))
    return rec if ok else None
