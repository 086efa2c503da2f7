"""Everything the commands write: the terminal (rich's Console, `echo`) and the files and folders a user names
(`status --csv`, `calibrate --out`, `report --out`).

Writing can fail for reasons that are the environment's, not the input's: a full device, a pipe whose reader
has gone (`moe-autotune status | head -0`), an I/O error. Each is one line, `OutputError` (exit 6), naming the
output and the reason, and leaves nothing half-written: a file is written beside its target and renamed over it
once whole; a folder loses the files the command made in it.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO, cast

import rich
import typer

from search_spaces.errors import MoeAutotuneError

from orchestrator.errors import OutputError

PIPE_WIDTH = 200  # a pipe or a log file has no width: rich would wrap tables at 80 columns
STDOUT = "standard output"


def _reason(exc: OSError) -> str:
    if isinstance(exc, BrokenPipeError):
        return "the pipe was closed by its reader"
    return exc.strerror or type(exc).__name__


class _Guarded(io.TextIOBase):
    """A text stream (standard output) whose writes are flushed at once and whose failures are OutputError: the
    failure shows at the print that met it, as one line, not as a traceback (or, for a pipe, as Python's
    "Exception ignored" at exit)."""

    def __init__(self, stream: TextIO, name: str = STDOUT):
        self._stream = stream
        self._name = name

    def write(self, text: str) -> int:
        try:
            written = self._stream.write(text)
            self._stream.flush()
        except OSError as exc:
            _abandon(self._stream)
            raise OutputError(f"cannot write to {self._name}: {_reason(exc)}") from None
        return written if written is not None else len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            _abandon(self._stream)
            raise OutputError(f"cannot write to {self._name}: {_reason(exc)}") from None

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"


def _abandon(stream: TextIO) -> None:
    """After a failed write to a real descriptor, point it at /dev/null: what is still buffered then goes nowhere
    at exit, instead of failing again there with Python's "Exception ignored" on stderr (Python's own advice for
    a broken pipe)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return  # a StringIO (tests), or already closed
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


def stdout() -> TextIO:
    """Standard output, guarded (sys.stdout as it is now: tests redirect it)."""
    # a text stream (io.TextIOBase), which typeshed does not count as a typing.TextIO (what rich and typer take)
    return cast(TextIO, _Guarded(sys.stdout))


def console(stderr: bool = False) -> rich.console.Console:
    """rich's Console on standard output (guarded) or standard error, wide enough for a layout key when not a
    terminal."""
    from rich.console import Console  # rich only for a command that prints with it (`estimate --json` does not)

    stream = sys.stderr if stderr else stdout()
    probe = Console(file=stream)
    return probe if probe.is_terminal else Console(file=stream, width=PIPE_WIDTH)


def echo(message: str = "", nl: bool = True) -> None:
    """typer.echo onto standard output, guarded."""
    typer.echo(message, nl=nl, file=stdout())


def json_line(data: Any, what: str) -> str:
    """`data` as one line of strict JSON (RFC 8259 has no NaN or Infinity: a reader such as jq refuses them). A
    figure that is not finite is one line naming it (exit 2: the constants or sizes given made it), never JSON
    that no strict reader parses."""
    bad = _first_not_finite(data)
    if bad is not None:
        path, value = bad
        raise MoeAutotuneError(f"{what}: {path or 'the value'} is {value}, not a finite number; nothing printed "
                               "(constants at the edges of their ranges can do this: try the packaged calibration)")
    return json.dumps(data, allow_nan=False)


def _first_not_finite(data: Any, path: str = "") -> tuple[str, float] | None:
    stack = [(path, data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where, item
        if isinstance(item, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(list(item.items())))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


# ---- files and folders a user names ------------------------------------------------------------------------
def write_file(path: str | Path, what: str, write: Callable[[TextIO], object]) -> Path:
    """Write the file `path` (named by the option `what`) with `write(fh)`, whole or not at all.

    A regular file (or a new one) is written to a hidden temporary file beside it, synced, and renamed over it:
    a reader never sees half of it, and a write that fails leaves the old file (or none) and no temporary file.
    What is not a regular file (a device such as /dev/stdout or /dev/full, a FIFO) is written in place: nothing
    can be renamed over it. Any OSError is OutputError: one line naming the file and the reason."""
    target = Path(path)
    try:
        info = target.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise OutputError(f"cannot write {what} {str(target)!r}: {_reason(exc)}") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        try:
            with open(target, "w", encoding="utf-8", newline="") as fh:
                write(fh)
        except OSError as exc:
            raise OutputError(f"cannot write {what} {str(target)!r}: {_reason(exc)}") from None
        return target
    import tempfile

    real = target.resolve()  # a symlink stays one: the file it points at is replaced
    mode = stat.S_IMODE(info.st_mode) if info is not None else 0o666 & ~_umask()
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".part")
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, real)
        tmp = None
    except OSError as exc:
        raise OutputError(f"cannot write {what} {str(target)!r}: {_reason(exc)}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return target


def write_text(path: str | Path, what: str, text: str) -> Path:
    """write_file of a text."""
    return write_file(path, what, lambda fh: fh.write(text))


@contextlib.contextmanager
def output_folder(path: str | Path, what: str) -> Iterator[Path]:
    """A folder the command writes files into (`report --out`). When writing fails (an OSError), the files the
    command made there are removed (and the folder, when it made it), and OutputError names the folder and the
    reason; files that were there before are kept (each one the command rewrites is renamed over, see
    write_file)."""
    folder = Path(path)
    existed = folder.is_dir()
    before = set(folder.rglob("*")) if existed else set()
    try:
        yield folder
    except (OSError, OutputError) as exc:
        import shutil

        if not existed:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            made = sorted(set(folder.rglob("*")) - before, key=lambda p: len(p.parts), reverse=True)
            for item in made:
                with contextlib.suppress(OSError):
                    item.rmdir() if item.is_dir() and not item.is_symlink() else item.unlink()
        if isinstance(exc, OutputError):
            raise
        raise OutputError(f"cannot write {what} {str(folder)!r}: {_reason(exc)}") from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
