"""The rules every store kept in a file follows, whatever its kind (a journal, a SQLite file of Optuna or MLflow):
a path a file can have, a file a read-only command names that must be there, a folder and file that take writes,
and a full disk named by its device."""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from search_spaces.errors import SpecError

from orchestrator.errors import StorageError
from orchestrator.redact import redact_uri

NAME_MAX, PATH_MAX = 255, 4096  # bytes, as Linux file systems allow


def usable_path(raw: str, url: str) -> Path:
    """The file a store URL names (SQLite's, a journal's); a SpecError line for a path no file can have: a folder's
    name, a NUL byte, a name longer than a file system allows (os.stat would raise, not answer)."""
    path = Path(raw)
    why = None
    if "\x00" in raw:
        why = "it holds a NUL byte"
    elif path.name in ("", ".", ".."):
        why = "it names a folder, not a file"
    elif len(os.fsencode(raw)) >= PATH_MAX or any(len(os.fsencode(part)) > NAME_MAX for part in path.parts):
        why = f"a name in it is longer than a file system allows ({NAME_MAX} bytes a name, {PATH_MAX} in all)"
    if why:
        raise SpecError(f"the store {redact_uri(url)[:200]} names no usable file: {why}")
    return path


def read_head(path: Path, size: int, what: str, shown: str, hint: str) -> bytes:
    """The first `size` bytes of a store file a read-only command names; a SpecError line when it is missing, not a
    file, or unreadable."""
    if not path.exists():
        raise SpecError(f"no {what} at {shown}: {str(path)!r} does not exist{hint}")
    if not path.is_file():
        raise SpecError(f"no {what} at {shown}: {str(path)!r} is not a file")
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError as exc:
        raise SpecError(f"cannot read the {what} {shown}: {exc.strerror or exc}") from None


def _refuses_a_file(folder: Path, target: Path) -> str | None:
    """Why a new file cannot be made in `folder` (only asked for the folder itself), or None."""
    if target != folder:
        return None
    probe = folder / f".moe-autotune-probe-{secrets.token_hex(4)}"
    try:
        probe.touch()
        probe.unlink()
    except OSError:
        return why_not_writable(folder)
    return None


def why_not_writable(target: Path) -> str:
    """Why os.access said no: a read-only file system, an immutable file (chattr +i) or permissions."""
    try:
        if target.is_dir():
            fd = os.open(target, os.O_RDONLY)
            os.close(fd)
            probe = target / f".moe-autotune-probe-{secrets.token_hex(4)}"
            probe.touch()
            probe.unlink()
        else:
            os.close(os.open(target, os.O_RDWR))
    except OSError as exc:
        hints: dict[int | None, str] = {errno.EROFS: "on a read-only file system",
                                        errno.EPERM: "immutable (chattr +i) or not permitted",
                                        errno.EACCES: "permission denied"}
        hint = hints.get(exc.errno, exc.strerror or str(exc))
        return f"{str(target)!r} is {hint}" if exc.errno in (errno.EROFS, errno.EPERM) else f"{str(target)!r}: {hint}"
    return f"{str(target)!r} is not writable"


def disk_full(exc: BaseException, path: Path | None = None) -> bool:
    """Did a write fail because the device is full (SQLite's "database or disk is full", ENOSPC)? SQLite says
    "disk I/O error" when not even its shared-memory file fits: with `path`, that and a device with under
    LOW_SPACE bytes free count too."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen).lower()
        if getattr(seen, "errno", None) == errno.ENOSPC or "disk is full" in text or "no space left" in text:
            return True
        if path is not None and "disk i/o error" in text and _free_bytes(path) < LOW_SPACE:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


LOW_SPACE = 1 << 20


def _free_bytes(path: Path) -> int:
    import shutil

    try:
        return shutil.disk_usage(path.parent if str(path.parent) else ".").free
    except OSError:
        return LOW_SPACE


def device(path: Path | None, url: str) -> str:
    """The device a store's file lives on, and its free space: what a "disk is full" line names."""
    import shutil

    import psutil

    if path is None:
        return f"the database server of {redact_uri(url)}"
    where = Path(os.path.realpath(path.parent if path.parent.exists() else "."))
    mounts = [p for p in psutil.disk_partitions(all=True) if str(where).startswith(p.mountpoint)]
    mount = max(mounts, key=lambda p: len(p.mountpoint)) if mounts else None
    free = shutil.disk_usage(where).free / 2 ** 20
    name = f"{mount.device} mounted at {mount.mountpoint}" if mount else str(where)
    return f"{name} ({free:.1f} MiB free) holding {path}"


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder: the link is made all the same
    finally:
        os.close(fd)


def require_writable(path: Path, url: str, what: str) -> None:
    """The store file `path` a sweep will write: its folder (for a new file, SQLite's -wal/-shm files, a journal's
    lock file) and the file itself must take writes; one StorageError line naming which, before anything is
    written."""
    shown = redact_uri(url)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise StorageError(f"cannot use the {what} {shown}: folder {str(folder)!r} does not exist")
    for target in ((path, folder) if path.exists() else (folder,)):
        # os.access passes root on an immutable folder: a probe file tells (SQLite needs its -wal/-journal there)
        why = why_not_writable(target) if not os.access(target, os.W_OK) else _refuses_a_file(folder, target)
        if why:
            raise StorageError(f"the {what} {shown} refuses writes: {why}")
