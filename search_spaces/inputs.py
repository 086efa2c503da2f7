"""The rules for what a user hands in, one home each: a file a user named (a sweep spec, a model config.json:
missing, a directory, not a regular file, unreadable, too large, not UTF-8), an output path, a name (study,
experiment, registered model, output file stem), a size (GPUs, sequence length, batch), and what an error line
may quote of a file (`excerpt`: short, one line, obvious secrets masked). Each refusal is one SpecError line."""

from __future__ import annotations

import numbers
import os
import re
import stat
from pathlib import Path
from typing import Iterable

from search_spaces.errors import SpecError
from search_spaces.redaction import redact_quoted

MAX_INPUT_BYTES = 1 << 20  # 1 MiB: a spec or a config.json is a few kB


def read_text_file(path: str | os.PathLike[str], what: str, limit: int = MAX_INPUT_BYTES) -> str:
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


# ---- names ------------------------------------------------------------------------------------------
# Every name a user gives (study, experiment, registered model, output file stem) ends up in an sbatch header
# (`#SBATCH --job-name`), a file or folder name (`report-<study>`, `<workdir>/<study>/`), an MLflow URI
# (`models:/<name>@production`, a search filter `tags.x = '<name>'`) and argv. One rule keeps it plain in all of
# them: ASCII letters, digits, '.', '_', '-', starting with a letter or digit (so never '-x', '.', '..'), and
# at most MAX_NAME_LENGTH characters (a file name allows 255 bytes; a length family appends '-<seq_len>').
MAX_NAME_LENGTH = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)


def check_name(value: object, what: str) -> str:
    """`value` when it is a plain name, else a SpecError: one line saying what is wrong with it (the value is
    shown escaped and cut, so a line break or a megabyte in it never reaches the terminal as such)."""
    if not isinstance(value, str):
        raise SpecError(f"{what} must be a name (text), got {type(value).__name__}")
    shown = _shown(value)
    if not value:
        raise SpecError(f"{what} is empty; give a name of letters, digits, '.', '_' or '-'")
    if len(value) > MAX_NAME_LENGTH:
        raise SpecError(f"{what} {shown} is longer than {MAX_NAME_LENGTH} characters ({len(value)})")
    if not _NAME.fullmatch(value):
        bad = next((c for c in value if not _NAME.fullmatch("a" + c)), value[0])
        why = ("starts with " + repr(bad)) if _NAME.fullmatch("a" + value) else ("contains " + _char(bad))
        raise SpecError(f"{what} {shown} {why}: a name is letters, digits, '.', '_' or '-' and starts with a "
                        "letter or digit (no spaces, line breaks, path separators or shell characters)")
    return value


def check_optional_name(value: str | None, what: str) -> str | None:
    """check_name for an optional argument (None: not given)."""
    return None if value is None else check_name(value, what)


def _shown(value: str, limit: int = 60) -> str:
    return excerpt(value, limit)


def _char(c: str) -> str:
    names = {"/": "a path separator '/'", "\\": "a path separator '\\\\'", " ": "a space", "\n": "a line break",
             "\r": "a line break", "@": "'@' (it would split an MLflow models:/ URI)"}
    return names.get(c, f"{ascii(c)}" + (" (a control character)" if not c.isprintable() else ""))


# ---- sizes -------------------------------------------------------------------------------------------------
# The largest sizes any spec or flag may ask for. Beyond them no cluster or run exists, and numbers that large
# would only make enumerations long (a loop over divisors, a placement of layers); within them every
# enumeration is bounded by a count that does not depend on the numbers (search_spaces/layouts/space.py).
MAX_GPUS = 2 ** 20  # 1,048,576 GPUs: five times the largest training clusters announced (~200k GPUs)
MAX_GPUS_PER_NODE = 2 ** 10  # 1,024: a node or NVLink domain of today holds 4-72 GPUs (a rack-scale NVL576: 576)
MAX_SEQ_LEN = 2 ** 24  # 16M tokens: above the longest context trained today (~10M tokens)
MAX_GBS = 2 ** 24  # 16M sequences per step: at 1K tokens that is 16G tokens per step, 1,000x today's batches
# A model (config.json, spec model_overrides): the deepest published decoder has 126 layers and the most routed
# experts are 512. Layers bound the pipeline placement, a dynamic program quadratic in them run once per (PP, VPP)
# of the space: `space` on 720,720 GPUs (~40 PP sizes) takes ~6 s at 128 layers, ~60 s at 256. Experts bound the
# EP divisors; the widths (hidden, FFN, heads, vocabulary) only enter arithmetic, bounded so no product overflows.
MAX_LAYERS = 128
MAX_MTP_LAYERS = 16
MAX_EXPERTS = 2 ** 14
MAX_MODEL_WIDTH = 2 ** 24
SIZE_LIMITS = {"num_gpus": MAX_GPUS, "nodes": MAX_GPUS, "gpus_per_node": MAX_GPUS_PER_NODE,
               "trial_gpus": MAX_GPUS, "seq_len": MAX_SEQ_LEN, "gbs": MAX_GBS}


def check_size(value: object, what: str, limit: int) -> int:
    """`value` when it is an integer in [1, limit], else a SpecError naming `what` and the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SpecError(f"{what} must be an integer, got {_short_value(value)}")
    value = int(value)
    if value < 1:
        raise SpecError(f"{what} must be >= 1, got {value}")
    if value > limit:
        raise SpecError(f"{what} must be <= {limit:,} (2**{limit.bit_length() - 1}), got {_short_value(value)}")
    return value


def _short_value(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 64:  # never print (or fail to print) a huge integer
        return f"an integer of {value.bit_length()} bits"
    text = repr(value) if isinstance(value, (int, float, str)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


# ---- quoting what a file holds --------------------------------------------------------------------------
# An error line goes to terminals and to whatever log captures the command: it may quote a file (a spec, a
# table, a calibration file, a value read back from a store) only as a short excerpt, one line, with the obvious
# shapes of a secret masked. A file pointed at by mistake (an environment file, a netrc, a kubeconfig) then never
# reaches the log whole. One rule set (search_spaces/redaction.py) masks what moe-autotune records and quotes.
EXCERPT_CHARS = 40  # the most an error line quotes of a file: a cell, a column name, a key, a line's start
MESSAGE_CHARS = 600  # a message built elsewhere (a validator, PyYAML, csv) that may embed a piece of a file: cut here


def redact_secrets(text: str) -> str:
    """`text` with the shapes of a secret masked (***), as search_spaces/redaction.py's one rule set quotes a file
    (redact_quoted): what it misses, the excerpt's length bounds."""
    return redact_quoted(text)


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    """What an error line may quote of a file or of a value read from one: quoted and escaped (ascii(): one
    printable line), obvious secrets masked (redact_secrets), at most `limit` characters, cut with '...'."""
    text = redact_secrets(str(text)[:limit * 8])
    shown = ascii(text)
    return shown if len(shown) <= limit else shown[:limit - 4] + "...'"


def bounded_message(message: str, quoted: Iterable[object] = ()) -> str:
    """A message built by other code (a library, a parser) that may embed values read from a file: each of
    `quoted` (as repr() shows it) replaced by its excerpt, obvious secrets masked, at most MESSAGE_CHARS, one line."""
    for value in quoted:
        text = repr(value)
        if len(text) > 2 and text in message:
            message = message.replace(text, excerpt(value))
    # any other quoted piece (a validator's repr of what it read) cut to an excerpt's length
    message = _QUOTED.sub(lambda m: m.group() if len(m.group()) <= EXCERPT_CHARS else
                          m.group()[:EXCERPT_CHARS - 4] + "..." + m.group()[0], message[:MESSAGE_CHARS * 4])
    message = " ".join(redact_secrets(message).split())
    return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS - 3] + "..."


# a quoted piece as repr() writes one: a quote not inside a word (an apostrophe, `row's`, is none) to its mate
_QUOTED = re.compile(r"(?<!\w)(?:'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\")(?!\w)")
