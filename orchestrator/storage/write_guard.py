"""Does the Optuna storage still take writes? Asked where the storage itself would not say so.

A SQLite file in WAL mode whose file (or folder) is made read-only or immutable mid-sweep takes every write on: the
writes land in its `-wal` file, which stays writable, and the checkpoints into the main file fail without a word. The
sweep ended with exit 0, its study in a `-wal` beside a file that no longer holds it (a copy of the file alone, the
one the stores promise, lost the sweep). So each write statement of a sweep's SQLite storage asks first whether the
file and its folder take writes (two `access` calls: no file is opened, so none of SQLite's locks is dropped) and is
refused with the OSError that says why: the sweep stops with the storage's line (StudyStore.failure: exit 9).

A journal needs no guard: each append opens the file and makes its lock file beside it, and a refusal is an OSError.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

# the errnos of a file system that refuses a write, as the error lines say them
REFUSALS: dict[int | None, str] = {errno.EROFS: "on a read-only file system",
                                   errno.EPERM: "immutable (chattr +i) or not permitted",
                                   errno.EACCES: "not writable (permission denied)"}
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLAC")  # the statements that change a study (reads are never refused)


def refusal(path: Path) -> OSError | None:
    """The OSError a write to the store file `path` would meet now (its folder, for SQLite's -wal, -shm and
    -journal files, and the file itself), or None. `access` answers for the effective user, root included: an
    immutable file or a read-only file system is refused to root too."""
    folder = path.parent if str(path.parent) else Path(".")
    for target in (path, folder):
        if target.exists() and not os.access(target, os.W_OK):
            code = errno.EROFS if _read_only_mount(target) else errno.EPERM if os.geteuid() == 0 else errno.EACCES
            return OSError(code, os.strerror(code), str(target))
    return None


def _read_only_mount(target: Path) -> bool:
    try:
        return bool(os.statvfs(target).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def guard(engine: Any, path: Path) -> None:
    """Every write statement on `engine` (the SQLAlchemy engine of a sweep's SQLite storage at `path`) first asks
    `refusal`; a refused one raises its OSError before SQLite sees it (the transaction is rolled back)."""
    from sqlalchemy import event

    def before(**event_args: Any) -> None:
        if event_args["statement"].lstrip()[:6].upper() in _WRITES:
            refused = refusal(path)
            if refused is not None:
                raise refused

    event.listen(engine, "before_cursor_execute", before, named=True)


__all__ = ["REFUSALS", "guard", "refusal"]
