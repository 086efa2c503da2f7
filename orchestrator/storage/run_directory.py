"""The sweep's run directory (`<workdir>/<study>`): the trials' folders, the result spool and MLflow's record spool.

It is the environment, not a layout: a folder that stops taking writes mid-sweep (a read-only remount, `chattr +i`,
permissions, a file where a folder belongs, a full disk) stops the sweep with one line naming the path and the
cause (RunDirectoryError, exit 7; a full disk RunDirectoryFull, exit 4), and the trial in flight is recorded as
interrupted, so that --resume runs it again. Before, every later trial failed as `error` ("backend failed:
PermissionError") and burnt the budget, its layout never tried again.

Asked where a trial that runs is dispatched and where one failed (orchestrator/sweep/loop.py: `probe`); a spool
write it refuses is the same fault (`failure`).
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from orchestrator.errors import RunDirectoryError, RunDirectoryFull
from orchestrator.storage.files import device, disk_full

PROBE_BYTES = 4096  # a page: a full file system still makes an empty file, it refuses a page

_HINTS: dict[int | None, str] = {
    errno.EROFS: "on a read-only file system", errno.EPERM: "immutable (chattr +i) or not permitted",
    errno.EACCES: "not writable (permission denied)", errno.ENOTDIR: "not a folder (a file stands in its path)",
    errno.EEXIST: "a file where a folder belongs", errno.ENOENT: "gone", errno.EIO: "failing (an I/O error)",
    errno.EDQUOT: "over its disk quota"}


def probe(folder: Path) -> OSError | None:
    """Does `folder` (made when missing) take a file? None, or the OSError that says why not, its `filename` the
    path refused. A page is written and synced (a full disk refuses it: an empty file may still be made), then
    removed: a few syscalls, once a trial."""
    target = folder / f".moe-autotune-probe-{secrets.token_hex(4)}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(target)
    except OSError as exc:
        try:
            target.unlink(missing_ok=True)
        except OSError:
            pass
        if exc.filename is None:  # a write or sync: the file it was writing
            exc.filename = str(target)
        return exc
    return None


def failure(exc: OSError, trial: int | None = None) -> RunDirectoryError:
    """One line for a write the run directory refused: the path, the cause, what became of `trial` (the one in
    flight, recorded as interrupted by the sweep's stop) and what to do."""
    where = str(exc.filename) if exc.filename else "the run directory"
    stopped = (f"trial {trial} was stopped and recorded as interrupted, not as its layout's failure; "
               if trial is not None else "")
    if disk_full(exc):
        return RunDirectoryFull(f"the run directory's disk is full: {device(Path(where), where)}; {stopped}what "
                                "was measured is kept: free space and rerun with --resume")
    hint = _HINTS.get(exc.errno, f"not writable ({exc.strerror or exc})")
    return RunDirectoryError(f"the run directory cannot be written: {where!r} is {hint}; {stopped}what was "
                             "measured is kept: make it writable and rerun with --resume")


__all__ = ["failure", "probe"]
