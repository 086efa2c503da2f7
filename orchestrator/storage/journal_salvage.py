"""What is intact of a damaged journal storage: the line that stops Optuna named, and the other lines replayed into a
new journal (`moe-autotune check --storage journal:///x --salvage NEW.journal`).

Optuna replays a journal whole: one line that is not a whole JSON operation (a disk that garbled it, a line cut
short and glued to the next) stops every reader of every study in the file. Its studies and trials have no ids in
the file: a study's id is the count of studies created before it, a trial's the count of trials created before it
(in any study), and each later line names them by those ids. So a damaged line cannot simply be dropped when it
created a study or a trial: every later id would point at the wrong one. Salvaging keeps every whole line as it is
and, for a damaged one, reads what its first bytes still say (`{"op_code":N,"worker_id":...,"study_id":S` or
`"trial_id":T`, written first):

- a line that changed a study or a trial (an attribute, a parameter, a state) is dropped; the study it belonged to is
  named as damaged (when its id can be read);
- a line that created a trial of a known study becomes a placeholder trial there (running, so that the later lines
  about it still apply, or failed when none follows), so that every later trial keeps its id;
- a line that created a study whose name can be read becomes that study again; one whose name cannot be read, and a
  creation whose study cannot be read, cannot be placed: the salvage refuses, naming the line (restore a copy).

The source is never changed; the new journal is written whole, beside nothing else (a file that exists is refused).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from optuna.storages.journal import BaseJournalBackend, JournalStorage

from orchestrator.errors import StorageError

# Optuna's journal operations (optuna/storages/journal/_storage.py, JournalOperation): a file format, fixed
CREATE_STUDY, DELETE_STUDY, CREATE_TRIAL = 0, 1, 4
WHAT = {0: "the creation", 1: "the deletion", 2: "an attribute", 3: "a system attribute", 4: "the creation",
        5: "a parameter", 6: "the state and values", 7: "an intermediate value", 8: "an attribute",
        9: "a system attribute", 10: "a discard of trials"}
TRIAL_OPS = {5, 6, 7, 8, 9}
RUNNING, FAIL = 0, 3  # optuna.trial.TrialState values
START = b'{"op_code":'
SALVAGED_FROM = "moe_autotune:salvaged_from_line"  # a placeholder trial's system attr: the line it stands for
_OP = re.compile(rb'^\{"op_code":(\d+),')
_ID = {key: re.compile(rb'"' + key.encode() + rb'":(\d+)[,}]') for key in ("study_id", "trial_id")}
_NAME = re.compile(rb'"study_name":"((?:[^"\\]|\\.)*)"')
_DIRECTIONS = re.compile(rb'"directions":\[([12](?:,[12])*)\]')


@dataclass(frozen=True)
class Damage:
    line: int
    """The line of the source (1-based, as `sed -n Np` counts)."""
    op: int | None
    """The operation it held, when its first bytes say."""
    study: str | None = None
    """The study it belonged to, when its first bytes name it."""
    trial: int | None = None
    """The number of the trial it changed (or created), in that study."""
    why: str = "not a whole JSON line"
    note: str = ""
    """What the salvage put in its place, if anything."""

    def __str__(self) -> str:
        what = WHAT.get(self.op, "an operation that cannot be read") if self.op is not None else \
            "an operation that cannot be read"
        if self.trial is not None:
            what += f" of trial {self.trial}"
        elif self.op in TRIAL_OPS:
            what += " of a trial that cannot be read"
        if self.study:
            what += f" of study {self.study!r}"
        elif self.op in (1, 2, 3):
            what += " of a study that cannot be read"
        return f"line {self.line} is damaged ({self.why}): {what} is lost" + (f"; {self.note}" if self.note else "")


@dataclass
class Salvage:
    """The whole lines (placeholders for lost creations among them), what was lost, and the studies kept."""
    lines: list[bytes] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    studies: list[str] = field(default_factory=list)
    torn_tail: bool = False

    @property
    def damaged_studies(self) -> list[str]:
        return sorted({d.study for d in self.damage if d.study and d.study in self.studies})


def first_damage(path: Path) -> Damage | None:
    """The first damaged line of the journal at `path` (what Optuna stops at), or None."""
    found = _salvage(path, stop_at_first=True)
    return found.damage[0] if found.damage else None


def salvage(path: Path) -> Salvage:
    """Every study of the journal at `path` that can be read, as new journal lines; StorageError when a damaged line
    cannot be placed (its study or trial ids would shift every later line)."""
    return _salvage(path, stop_at_first=False)


class _Lines(BaseJournalBackend):
    """The salvaged lines as a journal backend: Optuna's own replay judges each line as it is added."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        yield from self.logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise NotImplementedError("a salvage only reads")


@dataclass
class _Replay:
    """The salvage so far: Optuna's replay of the kept lines, and the ids it has given (to place a lost creation)."""
    path: Path
    backend: _Lines = field(default_factory=_Lines)
    names: dict[int, str] = field(default_factory=dict)
    alive: set[int] = field(default_factory=set)
    trial_of: dict[int, tuple[int, int]] = field(default_factory=dict)  # trial id -> (study id, number)
    counts: dict[int, int] = field(default_factory=dict)
    referenced: set[int] = field(default_factory=set)  # trial ids the whole lines name
    out: Salvage = field(default_factory=Salvage)

    def __post_init__(self) -> None:
        self.storage = JournalStorage(self.backend)

    def keep(self, log: dict[str, Any], raw: bytes | None = None) -> str | None:
        """Add one operation (`raw`: its line as the file holds it); why Optuna cannot apply it (then it is not
        kept), or None."""
        self.backend.logs.append(log)
        try:
            self.storage.get_all_studies()  # replays what was added
        except Exception as exc:  # noqa: BLE001 -- any failure of Optuna's replay is this line's damage
            return f"{type(exc).__name__} when replayed"
        self.out.lines.append((raw if raw is not None else json.dumps(log, separators=(",", ":")).encode()) + b"\n")
        self._track(log)
        return None

    def _track(self, log: dict[str, Any]) -> None:
        op = log["op_code"]
        if op == CREATE_STUDY and log["study_name"] not in {self.names[i] for i in self.alive}:
            study = len(self.names)
            self.names[study], self.counts[study] = log["study_name"], 0
            self.alive.add(study)
        elif op == DELETE_STUDY:
            self.alive.discard(log["study_id"])
        elif op == CREATE_TRIAL and log["study_id"] in self.alive:
            self.trial_of[len(self.trial_of)] = (log["study_id"], self.counts[log["study_id"]])
            self.counts[log["study_id"]] += 1

    def lost(self, line: int, fragment: bytes, why: str, strict: bool) -> None:
        """A damaged operation: named (what its first bytes still say), and put back as a placeholder when it
        created a study or a trial (`strict`: a creation that cannot be placed, or an operation that cannot be read,
        refuses the salvage)."""
        op, study, trial = _number(_OP, fragment), _number(_ID["study_id"], fragment), None
        if op is None:
            op = _infer(fragment)
        trial_id = _number(_ID["trial_id"], fragment)
        if trial_id is not None and trial_id in self.trial_of:
            study, trial = self.trial_of[trial_id]
        name, note = (self.names.get(study) if study is not None else None), ""
        if strict and (op is None or (op == CREATE_TRIAL and study is None)):
            raise StorageError(f"line {line} of {str(self.path)!r} is damaged where it says what it did ({why}): if "
                               "it created a study or a trial, every later one would be numbered wrongly without it, "
                               "so nothing is salvaged; restore the journal from a copy")
        if strict and op == CREATE_TRIAL and study in self.alive:
            trial, note = self.counts[study], self._placeholder_trial(study, line)
        elif strict and op == CREATE_STUDY:
            name, note = self._study_again(fragment, line)
        self.out.damage.append(Damage(line, op, name, trial, why, note))

    def _placeholder_trial(self, study: int, line: int) -> str:
        """A trial in place of one whose creation is lost: running when later lines change it (they still apply),
        failed otherwise; every later trial keeps its id."""
        state = RUNNING if len(self.trial_of) in self.referenced else FAIL
        self.keep({"op_code": CREATE_TRIAL, "worker_id": SALVAGER, "study_id": study, "datetime_start": None,
                   "state": state, "system_attrs": {SALVAGED_FROM: line}})
        return "a placeholder trial stands for it" + ("" if state == RUNNING else " (failed: no later line names it)")

    def _study_again(self, fragment: bytes, line: int) -> tuple[str, str]:
        """The study whose creation is lost, made again from its name (its directions when they can be read)."""
        from orchestrator.storage.studies import LEASE_CLAIM_MARK

        found = _NAME.search(fragment)
        if found is None:
            raise StorageError(f"line {line} of {str(self.path)!r} created a study whose name cannot be read: without "
                               "it every later study would be numbered wrongly, so nothing is salvaged; restore the "
                               "journal from a copy")
        name = json.loads(b'"' + found.group(1) + b'"')
        if name in {self.names[i] for i in self.alive}:
            return name, "a second creation of that name, which made nothing"
        directions = _DIRECTIONS.search(fragment)
        default = [1] if LEASE_CLAIM_MARK in name else [2, 1]  # a lease claim; a sweep: maximize, minimize
        self.keep({"op_code": CREATE_STUDY, "worker_id": SALVAGER, "study_name": name,
                   "directions": json.loads(b"[" + directions.group(1) + b"]") if directions else default})
        return name, "the study is made again from its name"


SALVAGER = "moe-autotune-salvage"  # the worker id of the lines a salvage writes in place of lost ones


def _number(pattern: re.Pattern[bytes], fragment: bytes) -> int | None:
    found = pattern.search(fragment)
    return int(found.group(1)) if found else None


def _infer(fragment: bytes) -> int | None:
    """The operation of a line whose first bytes are gone, from the keys left in it, where that is unambiguous: what
    names a trial by its id changes a trial (never a creation); what names a study by its id changes it, or creates
    a trial in it (its start time and distributions tell), or deletes it (nothing follows the id); None otherwise."""
    has = {key: b'"' + key + b'":' in fragment for key in (b"trial_id", b"study_id", b"study_name")}
    if has[b"trial_id"] and not has[b"study_id"]:
        trial_keys = ((b'"param_name":', 5), (b'"intermediate_value":', 7), (b'"user_attr":', 8),
                      (b'"system_attr":', 9))
        return next((op for key, op in trial_keys if key in fragment), 6)
    if has[b"study_id"] and not has[b"trial_id"]:
        if b'"datetime_start":' in fragment or b'"distributions":' in fragment:
            return CREATE_TRIAL
        if re.search(rb'"study_id":\d+\}\s*$', fragment):  # nothing follows the id: a study's deletion
            return DELETE_STUDY
        study_keys = ((b'"user_attr":', 2), (b'"system_attr":', 3))
        return next((op for key, op in study_keys if key in fragment), None)
    return CREATE_STUDY if has[b"study_name"] else None


def _operations(line: bytes) -> list[tuple[bytes, dict[str, Any] | None]]:
    """The operations of one line of the file: itself, when it is one whole operation; else its pieces, cut where an
    operation starts (a line cut short glues the next one to it), each parsed or None."""
    whole = _parse(line)
    if whole is not None:
        return [(line, whole)]
    starts = [m.start() for m in re.finditer(re.escape(START), line)]
    cuts = ([0] if not starts or starts[0] != 0 else []) + starts + [len(line)]
    return [(line[a:b], _parse(line[a:b])) for a, b in zip(cuts, cuts[1:]) if line[a:b].strip()]


def _parse(fragment: bytes) -> dict[str, Any] | None:
    try:
        log = json.loads(fragment)
    except ValueError:  # not JSON, or not UTF-8
        return None
    if not isinstance(log, dict) or type(log.get("op_code")) is not int or log["op_code"] not in WHAT:
        return None
    return log


def _salvage(path: Path, stop_at_first: bool) -> Salvage:
    lines = path.read_bytes().split(b"\n")
    tail = lines.pop()  # what follows the last newline: a torn append, or nothing
    parsed = [_operations(line) for line in lines]
    replay = _Replay(path)
    replay.referenced = {log["trial_id"] for ops in parsed for _, log in ops
                         if log is not None and type(log.get("trial_id")) is int}
    for number, ops in enumerate(parsed, 1):
        for fragment, log in ops:
            why = replay.keep(log, fragment) if log is not None else "not a whole JSON line"
            if why is None:
                continue
            replay.lost(number, fragment, why, strict=not stop_at_first)
            if stop_at_first:
                return replay.out
    replay.out.torn_tail = bool(tail.strip())
    from orchestrator.storage.studies import LEASE_CLAIM_MARK

    # a lease's claim (alive while a driver takes the lease) is no study of ours
    replay.out.studies = [replay.names[i] for i in sorted(replay.alive) if LEASE_CLAIM_MARK not in replay.names[i]]
    return replay.out


def write(found: Salvage, out: Path) -> None:
    """The salvaged lines as the journal `out`, written whole (a temporary file renamed into place). Optuna writes
    its lines as ASCII JSON."""
    from orchestrator.userio import write_text

    write_text(out, "--salvage", b"".join(found.lines).decode("utf-8", errors="replace"))
