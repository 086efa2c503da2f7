"""Optuna's journal file as a study's storage: `--storage journal:///optuna.journal` (a path relative to the working
folder; four slashes for an absolute one, as with `sqlite:///`).

Why: a finished trial is one JSON line appended (and fsync'd), where SQLite's RDBStorage runs about 96 ORM
statements for it, and every later read of the study replays only the lines it has not seen. The 200-trial what-if
sweep of bench/sweep_speed.py stores its trials in a fraction of the time.

Appends are serialised by Optuna's lock file beside the journal (`<file>.lock`); readers (status, report) read while
a sweep appends, and stop at the last whole line. What the SQLite store guarantees, the journal keeps:

- it is made whole: a missing journal is created empty (an empty journal is a whole one). A journal whose last line
  is torn (the process or the disk failed mid-append) is cut back to its last whole line, under the lock, before a
  sweep appends to it: Optuna would glue the next line onto the torn one, and every reader would stop there for ever;
- a full disk is an OSError (ENOSPC) at the append: the storage's "disk is full" line (StudyStore.failure);
- a file that is not a journal is one line naming it, and is never cut or rewritten;
- a journal damaged before its end (a line a disk garbled, or one cut short with the next glued to it) stops Optuna's
  replay of every study in it: one line names the file and the first damaged line, and `moe-autotune check --storage
  journal:///x --salvage NEW.journal` writes what is intact to a new journal (journal_salvage.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import optuna
from optuna.storages.journal import JournalFileSymlinkLock, JournalStorage

from search_spaces.errors import SpecError

from orchestrator.errors import StorageError
from orchestrator.redact import redact_uri
from orchestrator.storage.base import OPTUNA, StudyStore
from orchestrator.storage.fencing import FencedJournalBackend
from orchestrator.storage.files import read_head, require_writable, usable_path

PREFIX = "journal:///"
# every line Optuna writes is a JSON object whose first key is the operation: how a journal's first bytes read
JOURNAL_START = b'{"op_code":'
_TAIL_CHUNK = 1 << 16


class JournalStore(StudyStore):
    """`journal:///path`: Optuna's journal file."""

    kind = "journal file"

    @property
    def path(self) -> Path:
        return check_url(self.url)

    def check(self, resume: bool) -> None:
        if resume:
            self.require_existing("nothing to resume")
        require_writable(self.path, self.url, OPTUNA)

    def require_existing(self, hint: str) -> None:
        require_journal(self.path, OPTUNA, self.shown, f" ({hint})")

    def open(self, create: bool = True, attempts: int = 10) -> optuna.storages.BaseStorage:
        try:
            return open_journal(self.path, self.url, write=create)
        except OSError as exc:  # a full disk or a refusing folder as the journal is made or its torn tail cut
            raise self.failure(exc, "cannot create" if create else "cannot read") from None


def journal_file(url: str) -> Path | None:
    """The file of a `journal:///path` URL; None for other URLs."""
    if not url.startswith(PREFIX) or not url[len(PREFIX):]:
        return None
    return usable_path(url[len(PREFIX):], url)


def check_url(url: str) -> Path:
    """The journal file a `journal:` URL names; a SpecError line for one of another form."""
    path = journal_file(url)
    if path is None:
        raise SpecError(f"the Optuna storage {redact_uri(url)!r} is no journal URL: write journal:///relative/path "
                        "or journal:////absolute/path")
    return path


def require_journal(path: Path, what: str, shown: str, hint: str) -> None:
    """Refuse (SpecError) a journal a read-only command names that is missing, not a file, or not a journal."""
    older = path.with_name("optuna.db")  # the default storage before the journal (a sweep of an earlier version)
    if not path.exists() and older.is_file():
        hint = f" (a SQLite storage is beside it: pass --storage sqlite:///{older})"
    head = read_head(path, len(JOURNAL_START), what, shown, hint)
    if not head:
        raise SpecError(f"no {what} at {shown}: {str(path)!r} is an empty journal{hint}")
    _require_journal_start(head, what, shown, path)


def _require_journal_start(head: bytes, what: str, shown: str, path: Path) -> None:
    # a torn first line is a prefix of a journal's start: still a journal
    if not (JOURNAL_START.startswith(head) or head.startswith(JOURNAL_START)):
        raise SpecError(f"no {what} at {shown}: {str(path)!r} is not an Optuna journal; restore it from a copy or "
                        "point elsewhere")


def open_journal(path: Path, url: str, write: bool) -> optuna.storages.BaseStorage:
    """The journal storage at `path`. `write`: a sweep will append (the file is created when missing, and a torn
    last line is cut first); a reader reads what is whole. A file that is not a journal: a StorageError line."""
    shown = redact_uri(url)
    if write and path.exists():
        with open(path, "rb") as fh:
            _require_journal_start(fh.read(len(JOURNAL_START)), "Optuna storage", shown, path)
        cut_torn_tail(path)
    try:
        backend = FencedJournalBackend(str(path))
        return backend.register(JournalStorage(backend))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # a line Optuna cannot read or apply
        raise damaged(path, url, exc) from None


def damaged(path: Path, url: str, exc: BaseException) -> StorageError:
    """One line for a journal Optuna cannot replay: the file, the first damaged line, and what to do (restore a copy,
    or salvage what is intact: orchestrator/storage/journal_salvage.py)."""
    from orchestrator.storage.journal_salvage import first_damage

    shown = redact_uri(url)
    try:
        found = first_damage(path)
    except OSError:
        found = None
    where = (f"at line {found.line} of {str(path)!r} ({found.why})" if found is not None else
             f"({type(exc).__name__}: {str(exc)[:150]})")
    return StorageError(f"the Optuna storage {shown} is damaged {where}; restore it from a copy, or write every study "
                        f"it still holds whole to a new journal: moe-autotune check --storage {shown} --salvage "
                        "NEW.journal")


def cut_torn_tail(path: Path) -> int:
    """Cut the journal back to its last whole line, under Optuna's append lock (a writer mid-append finishes
    first); the number of bytes cut (0: it ended whole)."""
    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        with open(path, "rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            keep = _whole_length(fh, size)
            if keep == size:
                return 0
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
            return size - keep
    finally:
        lock.release()


def _whole_length(fh, size: int) -> int:
    """How many leading bytes of the file end at a line's end (its last newline, included)."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        fh.seek(start)
        chunk = fh.read(end - start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0
