"""Reading a file a user named (a sweep spec, a model config.json): one SpecError line for every way it
can be wrong (missing, a directory, not a regular file, unreadable, too large, not UTF-8)."""

from __future__ import annotations

import stat
from pathlib import Path

from search_spaces.errors import SpecError

MAX_INPUT_BYTES = 1 << 20  # 1 MiB: a spec or a config.json is a few kB


def read_text_file(path: str | Path, what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of `path` (a leading BOM dropped); `what` names the file in the error line."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise SpecError(f"{what} {str(path)!r} does not exist") from None
    except OSError as exc:
        raise SpecError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise SpecError(f"{what} {str(path)!r} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise SpecError(f"{what} {str(path)!r} is not a regular file")
    if info.st_size > limit:
        raise SpecError(f"{what} {str(path)!r} is larger than {_size(limit)} ({_size(info.st_size)})")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if len(data) > limit:  # grew since stat
        raise SpecError(f"{what} {str(path)!r} is larger than {_size(limit)}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{what} {str(path)!r} is not UTF-8 text (byte {exc.start})") from None


def _size(n: int) -> str:
    if n < 1 << 20:
        return f"{n} bytes"
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n / (1 << 20):.1f} MiB"


def check_output_file(path: str | Path, what: str) -> Path:
    """Refuse, before any work, an output file that cannot be written: a directory, or in a missing folder."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{what} {str(path)!r} is a directory; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise SpecError(f"{what} {str(path)!r}: directory {str(parent)!r} does not exist")
    return path


def check_output_dir(path: str | Path, what: str) -> Path:
    """Refuse, before any work, an output folder that is an existing file (or lies under one)."""
    path = Path(path)
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                where = "" if folder == path else f": {str(folder)!r}"
                raise SpecError(f"{what} {str(path)!r}{where} is a file, not a directory")
            break
    return path
