"""Why a trial failed: the failure classes (a small vocabulary, declared once here), each rank's failure record, the
parser of a node's log, and the choice of the root cause among every rank's failures.

A multi-rank trial fails on several ranks at once, and the first rank to say so is often reporting a symptom: rank
0's "Connection reset by peer" when rank 2 raised, or aborted on a gloo collective mismatch, or was SIGKILLed. So
every failing rank writes its own record beside the result (`<result>.rank<R>.failure.json`: the time of its
exception, its class, one line and the traceback's tail), and whoever writes the final result (the trainer's rank
that claims it; the backend once the process tree has ended, which also reads the node logs: gloo and NCCL
aborts, `terminate called ...`, torchrun's summary of the ranks that ended by a signal or an exit code) picks the
root cause: the earliest failure that is not a symptom (`communication`, or a rank torchrun stopped with SIGTERM
after another failed), by time across ranks; only when every failure is a symptom, the earliest symptom. A Python
exception's time is exact; torchrun gives the second in which it saw a rank end, read as the end of that second.

The class is detail beside the trial's status (ok | oom | error | ...), which keeps its meaning. Pure Python: the
trainer and the orchestrator both use it.
"""

from __future__ import annotations

import json
import os
import re
import signal as signals
import tempfile
import time as clock
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable


@dataclass(frozen=True)
class FailureClass:
    name: str
    meaning: str
    symptom: bool = False  # a consequence of another rank's failure, never preferred as the root cause


FAILURE_CLASSES: tuple[FailureClass, ...] = (
    FailureClass("oom", "out of device memory (torch.OutOfMemoryError, CUDA or NCCL out of memory)"),
    FailureClass("collective_mismatch", "the ranks disagreed on a collective (its size, kind or order): gloo's "
                                        "EnforceNotMet abort, a mismatch torch's collective checks found"),
    FailureClass("timeout", "a collective or the rendezvous waited past its timeout (a rank stuck or gone); "
                            "NCCL's watchdog"),
    FailureClass("killed", "the rank ended by a signal with no message of its own (SIGKILL: the kernel's OOM "
                           "killer or a scheduler; SIGSEGV; SIGABRT)"),
    FailureClass("config_refused", "Megatron-Core refused the configuration: an AssertionError or ValueError "
                                   "raised while the parallel state, config or model were built"),
    FailureClass("communication", "a peer went away: connection reset or closed, broken pipe (a symptom: another "
                                  "rank failed first)", symptom=True),
    FailureClass("error", "anything else: an exception the other classes do not name"),
)
BY_NAME: dict[str, FailureClass] = {c.name: c for c in FAILURE_CLASSES}
CLASS_NAMES: tuple[str, ...] = tuple(BY_NAME)

REASON_CHARS = 300  # a failure's one line
DETAIL_CHARS = 3000  # the traceback's tail (or log lines) a record keeps
LOG_TAIL_BYTES = 8 << 20  # what is read of a node log: torchrun's summary is at its end
RECORD_SUFFIX = ".failure.json"

# markers in an exception's type and message (lower case), in the order they are tried after oom
_MISMATCH = ("collective mismatch", "mismatch between collectives", "doesn't match expected size",
             "op.preamble.length", "detected mismatch")
_TIMEOUT = ("timed out", "timeout", "deadline exceeded")
_COMMUNICATION = ("connection reset", "connection closed", "connection refused", "broken pipe", "econnreset",
                  "epipe", "peer closed", "socket closed", "remote process exited", "network error",
                  "unhandled system error", "ncclremoteerror", "ncclsystemerror")
_REFUSALS = ("AssertionError", "ValueError")


def classify(type_name: str, message: str, phase: str | None = None) -> str:
    """The class of an exception (or an abort's `what()`) from its type name and message; `phase`: "build" when it
    was raised while the parallel state, config or model were built (a refusal is config_refused there)."""
    text = f"{type_name}: {message}".lower()
    if "outofmemoryerror" in text or "out of memory" in text:
        return "oom"
    if phase == "build" and type_name.rsplit(".", 1)[-1] in _REFUSALS:
        return "config_refused"
    for name, markers in (("collective_mismatch", _MISMATCH), ("timeout", _TIMEOUT),
                          ("communication", _COMMUNICATION)):
        if any(marker in text for marker in markers):
            return name
    if "enforcenotmet" in text:  # gloo's enforce checks are invariants between a pair of ranks: a size, an op
        return "collective_mismatch"
    return "error"


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """The first line that holds anything, at most `limit` characters."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


@dataclass(frozen=True)
class RankFailure:
    """How one rank failed (or what a log says of it)."""
    failure_class: str
    reason: str  # one line: `RuntimeError: Connection reset by peer`, `ended by SIGKILL (exit code -9)`
    rank: int | None = None  # the global rank; None when the log does not say
    time: float | None = None  # seconds since the epoch; None when unknown (sorted after every known time)
    detail: str = ""  # the traceback's tail, or the log's lines
    source: str = "exception"  # exception (the rank's record), log, torchrun, exit code
    signal: str | None = None  # SIGKILL, SIGABRT, ... when the rank ended by one

    @property
    def symptom(self) -> bool:
        """A consequence of another failure: a peer gone, or a rank torchrun stopped once another had failed."""
        return BY_NAME[self.failure_class].symptom or self.signal == "SIGTERM"

    @property
    def where(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else "a rank"

    def summary(self) -> str:
        return f"{self.where}: {self.failure_class}: {self.reason}"

    def to_dict(self, detail: bool = True) -> dict[str, Any]:
        out = {"failure_class": self.failure_class, "reason": self.reason, "rank": self.rank, "time": self.time,
               "source": self.source, "signal": self.signal}
        return {**out, "detail": self.detail} if detail else out

    @classmethod
    def from_dict(cls, data: Any) -> "RankFailure | None":
        """A record as written by to_dict, or None when it is not one (a damaged or foreign file)."""
        if not isinstance(data, dict) or data.get("failure_class") not in BY_NAME:
            return None
        rank, when = data.get("rank"), data.get("time")
        return cls(failure_class=data["failure_class"], reason=one_line(str(data.get("reason") or "")),
                   rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                   time=float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None,
                   detail=str(data.get("detail") or "")[-DETAIL_CHARS:], source=str(data.get("source") or "exception"),
                   signal=data.get("signal") if isinstance(data.get("signal"), str) else None)


def from_exception(type_name: str, message: str, rank: int | None, when: float, traceback_text: str = "",
                   phase: str | None = None) -> RankFailure:
    """A rank's failure by a Python exception (the trainer's record)."""
    return RankFailure(classify(type_name, message, phase), one_line(f"{type_name}: {message}"), rank, when,
                       traceback_text[-DETAIL_CHARS:], "exception")


# ---- the root cause ---------------------------------------------------------------------------------------------

def root_cause(failures: Iterable[RankFailure]) -> RankFailure | None:
    """The earliest failure that is not a symptom (by time; an unknown time after every known one; ties in the
    order given), else the earliest symptom; None for no failure."""
    ranked = list(failures)
    if not ranked:
        return None
    order = sorted(range(len(ranked)), key=lambda i: (ranked[i].symptom, ranked[i].time is None,
                                                      ranked[i].time or 0.0, i))
    return ranked[order[0]]


def apply(result: Any, root: RankFailure, everyone: Iterable[RankFailure] = ()) -> Any:
    """Write the root cause into a TrialResult (its class, rank and line; its error led by the cause, then the
    other failures, then what was first reported when that named something else). Status error becomes oom when
    the cause is one; no other status changes."""
    others = [f for f in everyone if f is not root]
    first = f"{root.where}: {root.reason}"
    previous = result.error or ""
    lines = [first]
    if others:
        lines.append("other failures: " + "; ".join(f.summary() for f in others[:8]))
    if root.detail:
        lines.append(root.detail)
    if previous and not previous.startswith(first):
        lines.append("first reported: " + previous[:1500])
    result.error = "\n".join(lines)
    result.failure_class, result.failure_rank, result.failure_reason = root.failure_class, root.rank, root.reason
    if root.failure_class == "oom" and result.status == "error":
        result.status = "oom"
    result.extra["failures"] = [f.to_dict(detail=False) for f in [root, *others][:16]]
    return result


# ---- the records beside the result ------------------------------------------------------------------------------

def record_path(result_path: str | os.PathLike[str], rank: int) -> Path:
    return Path(f"{result_path}.rank{rank}{RECORD_SUFFIX}")


def record_paths(result_path: str | os.PathLike[str]) -> list[Path]:
    """The failure records of every rank beside `result_path`, by rank."""
    path = Path(result_path)
    found = path.parent.glob(f"{path.name}.rank*{RECORD_SUFFIX}") if path.parent.is_dir() else []
    return sorted(found, key=lambda p: (len(p.name), p.name))


def write_record(result_path: str | os.PathLike[str], failure: RankFailure) -> Path:
    """This rank's record, written atomically (a reader never sees half of it)."""
    target = record_path(result_path, failure.rank if failure.rank is not None else 0)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(failure.to_dict(), fh, indent=1, default=str)
    os.replace(tmp, target)
    return target


def read_records(result_path: str | os.PathLike[str]) -> list[RankFailure]:
    """Every readable failure record beside `result_path` (a damaged one is skipped)."""
    from search_spaces.bounded import read_json

    out = []
    for path in record_paths(result_path):
        try:
            failure = RankFailure.from_dict(read_json(path, "failure record", limit=1 << 20))
        except (OSError, ValueError):
            continue
        if failure is not None:
            out.append(failure)
    return out


def clear_records(result_path: str | os.PathLike[str]) -> None:
    """Remove an earlier run's records (they must not be read as this run's)."""
    for path in record_paths(result_path):
        path.unlink(missing_ok=True)


# ---- the logs ---------------------------------------------------------------------------------------------------
_TORCHRUN_ENTRY = re.compile(
    r"^\s*time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:[^\n]*\n\s*rank\s*:\s*(?P<rank>\d+)[^\n]*\n"
    r"\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*\n(?:\s*error_file\s*:[^\n]*\n)?(?:\s*traceback\s*:(?P<tb>[^\n]*))?",
    re.M)
_ROOT_HEADER = "Root Cause (first observed failure):"
_RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?(?P<rest>.*)$")
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|NotMet))"
                             r"(?::\s*(?P<msg>.*))?$")
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
_WHAT = re.compile(r"^\s*what\(\):\s*(?P<msg>.*)$")
_NCCL = re.compile(r"NCCL error|Watchdog caught collective operation timeout|ncclUnhandledCudaError|ncclSystemError|"
                   r"ncclInternalError|ncclRemoteError|ncclInvalidUsage|NCCL WARN .*(?:out of memory|Cuda failure)")
_NCCL_RANK = re.compile(r"\[(?:[^\]]*\s)?Rank (?P<rank>\d+)\]")


def parse_log(text: str) -> list[RankFailure]:
    """The failures one node's log shows: torchrun's summary of the ranks that ended (root cause first), each with
    what its rank printed before (an uncaught exception's last line, a C++ abort's `what()`, an NCCL error);
    what a log says of no rank torchrun names is a failure of its own (its rank when the line says)."""
    details = _detail_lines(text)
    entries = _torchrun_entries(text)
    aborts = [e for e in entries if e.signal == "SIGABRT"]
    out = []
    for entry in entries:
        mine = [d for d in details if d.rank == entry.rank]
        if not mine and entry in aborts and len(aborts) == 1:
            mine = [d for d in details if d.rank is None][:1]  # a C++ abort prints no rank: the one that aborted
        for d in mine:
            details.remove(d)
        out.append(_merged(entry, mine[0]) if mine else entry)
    return out + details


def _torchrun_entries(text: str) -> list[RankFailure]:
    root_at = text.rfind(_ROOT_HEADER)
    entries: list[tuple[bool, RankFailure]] = []
    seen = set()
    for match in _TORCHRUN_ENTRY.finditer(text):
        rank, code = int(match["rank"]), int(match["code"])
        key = (rank, code, match["time"])
        if key in seen:  # a log holding two summaries (a multi-node run's agent and its own) names it once
            continue
        seen.add(key)
        sig = _signal_name(-code) if code < 0 else None
        reason = f"ended by {sig} (exit code {code})" if sig else f"exited with code {code}"
        failure = RankFailure("killed" if sig else "error", reason, rank, _torchrun_time(match["time"]),
                              (match["tb"] or "").strip(), "torchrun", sig)
        entries.append((root_at >= 0 and match.start() > root_at, failure))
    return [f for _, f in sorted(entries, key=lambda e: not e[0])]  # torchrun's root cause first: it wins ties


def _detail_lines(text: str) -> list[RankFailure]:
    """Per rank, the last uncaught exception printed with a `[rankN]:` prefix; every C++ abort (`terminate called
    ...` and its `what()`); every NCCL error line."""
    by_rank: dict[int, RankFailure] = {}
    out: list[RankFailure] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        prefixed = _RANK_PREFIX.match(line)
        body, rank = (prefixed["rest"], int(prefixed["rank"])) if prefixed else (line, None)
        exc = _EXCEPTION_LINE.match(body.strip()) if prefixed else None
        if exc and rank is not None:
            by_rank[rank] = RankFailure(classify(exc["type"], exc["msg"] or ""), one_line(body), rank,
                                        source="log", detail=body[-DETAIL_CHARS:])
        elif terminate := _TERMINATE.search(body):
            what = next((m["msg"] for ln in lines[i + 1:i + 3] if (m := _WHAT.match(_unprefixed(ln)))), "")
            out.append(RankFailure(classify(terminate["type"], what), one_line(f"{terminate['type']}: {what}"), rank,
                                   source="log", detail="\n".join(lines[i:i + 3])[-DETAIL_CHARS:]))
        elif _NCCL.search(body):
            numbered = _NCCL_RANK.search(body)
            nccl_rank = rank if rank is not None else int(numbered["rank"]) if numbered else None
            out.append(RankFailure(classify("NCCL", body), one_line(body.strip()), nccl_rank, source="log",
                                   detail=body[-DETAIL_CHARS:]))
    return [*by_rank.values(), *_first_per_rank(out)]


def _first_per_rank(failures: list[RankFailure]) -> list[RankFailure]:
    """An NCCL error repeats on every line of its stack: the first per rank (every one whose rank is unknown)."""
    seen: set[int] = set()
    out = []
    for f in failures:
        if f.rank is None or f.rank not in seen:
            out.append(f)
        if f.rank is not None:
            seen.add(f.rank)
    return out


def _merged(entry: RankFailure, said: RankFailure) -> RankFailure:
    """A rank torchrun saw end, with what it printed: the printed class unless that says nothing more (error)."""
    name = said.failure_class if said.failure_class != "error" or entry.failure_class == "error" else "killed"
    return RankFailure(name, one_line(f"{said.reason} ({entry.reason})"), entry.rank, entry.time,
                       "\n".join(x for x in (said.detail, entry.detail) if x)[-DETAIL_CHARS:], "log", entry.signal)


def _unprefixed(line: str) -> str:
    prefixed = _RANK_PREFIX.match(line)
    return prefixed["rest"] if prefixed else line


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _torchrun_time(text: str) -> float | None:
    """torchrun's `2026-12-06_20:01:16` (local time, to the second) as the end of that second."""
    try:
        return clock.mktime(clock.strptime(text, "%Y-%m-%d_%H:%M:%S")) + 1.0
    except (ValueError, OverflowError):
        return None


def read_log_tail(path: str | os.PathLike[str], limit: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# ---- a trial whose process tree has ended -----------------------------------------------------------------------

def settle(result: Any, result_path: str | os.PathLike[str], logs: Iterable[str | os.PathLike[str]] = (),
           returncodes: Iterable[int | None] = ()) -> Any:
    """A failed trial's result (status error or oom) with its root cause: every rank's record beside the result,
    every failure the node logs show, and a launcher that ended by a signal; with none of these, the result's own
    error as its line. Any other status is returned as it is."""
    if result.status not in ("error", "oom"):
        return result
    found = read_records(result_path)
    for log in logs:
        found += parse_log(read_log_tail(log))
    for node, code in enumerate(returncodes):
        if isinstance(code, int) and code < 0:  # the launcher itself (launcher python: the rank) ended by a signal
            sig = _signal_name(-code)
            found.append(RankFailure("killed", f"node {node}'s launcher ended by {sig} (exit code {code})",
                                     source="exit code", signal=sig))
    root = root_cause(found)
    if root is None:
        name = "oom" if result.status == "oom" else classify("", result.error or "")
        root = RankFailure(name, one_line(result.error or "failed with no message"), source="result")
        result.failure_class, result.failure_rank, result.failure_reason = root.failure_class, None, root.reason
        return result
    return apply(result, root, found)
