"""Reading JSON, YAML and CSV text within bounds: every file moe-autotune reads goes through here.

The parsers of the standard library and PyYAML fail on hostile text in ways that are not one line: a JSON or
YAML value nested a few thousand levels deep recurses past Python's limit (RecursionError), an integer of more
than 4,300 digits fails to convert (CPython's ValueError), and csv gives a row with more cells than its header a
list of the rest. Here each bound is checked before a value is built, and each refusal is one SpecError line that
names the file and where, quoting at most a short excerpt of it (search_spaces.inputs.excerpt):

- depth: at most MAX_DEPTH levels of nested lists and mappings (a spec or a config.json nests a few);
- integers: at most MAX_INT_DIGITS digits (the largest count any file holds, a token count, has 13);
- keys: a mapping names each key once (JSON and YAML would let the last one win silently);
- YAML: no anchors or aliases (a "billion laughs" bomb), safe tags only, numbers as YAML 1.2 writes them;
- CSV: a header of at most MAX_COLUMNS distinct names, every row exactly as many cells, each at most
  MAX_CELL_CHARS characters; a file of at most MAX_TABLE_BYTES.

Sizes of the files themselves are search_spaces.inputs.read_text_file's (1 MiB for a spec or a config.json).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from search_spaces.errors import SpecError
from search_spaces.inputs import MAX_INPUT_BYTES, bounded_message, excerpt, read_text_file

MAX_DEPTH = 64  # nesting levels of lists and mappings: a spec nests 3, a config.json 4, a calibration file 5
MAX_INT_DIGITS = 64  # digits of an integer: 2**64 has 20; CPython refuses to convert more than 4,300
MAX_TABLE_BYTES = 4 << 20  # a replay or calibration table: ~24k leaderboard rows of ~170 bytes (a sweep runs hundreds)
MAX_COLUMNS = 256  # a table's columns: the leaderboard writes 34
MAX_CELL_CHARS = 4096  # one cell: a layout's value, a status, a number, a note


# ---- JSON ----------------------------------------------------------------------------------------------------
# A JSON string (one left open runs to the end: every string matches, so no match is retried from a later
# quote and the scan stays linear), or one bracket outside a string: says how deep the text nests before the
# recursive parser sees it.
_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.|\\\Z)*(?:"|\Z)|[\[\]{}]', re.S)


def _json_too_deep(text: str, limit: int) -> int | None:
    """The line where `text` nests deeper than `limit` levels, or None."""
    depth = 0
    for match in _JSON_NESTING.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return text.count("\n", 0, match.start()) + 1
        elif token in "]}":
            depth -= 1
    return None


def loads_json(text: str, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """The value `text` holds, within the bounds (depth, digits, duplicate keys); `what` names it in the error
    line. NaN and Infinity are read as Python's json reads them: the caller's model decides where a number must
    be finite."""
    line = _json_too_deep(text, max_depth)
    if line is not None:
        raise SpecError(f"{what}: nested deeper than {max_depth} levels (line {line})")

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise _Refused(f"an integer of {len(digits.lstrip('-')):,} digits (at most {MAX_INT_DIGITS})")
        return int(digits)

    def mapping(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise _Refused(f"duplicate key {excerpt(key)}")
            out[key] = value
        return out

    try:
        return json.loads(text, parse_int=integer, object_pairs_hook=mapping)
    except _Refused as exc:
        raise SpecError(f"{what}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{what}: not JSON ({exc.msg}: line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:  # called already deep in a stack: the bound above was not enough
        raise SpecError(f"{what}: nested too deep") from None


def read_json(path: str | os.PathLike[str], what: str, limit: int = MAX_INPUT_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The value of a JSON file (at most `limit` bytes of UTF-8), within the bounds."""
    return loads_json(read_text_file(path, what, limit), f"{what} {str(path)!r}", max_depth)


def parse_count(text: str) -> int | None:
    """An integer cell or tag (`8`, or `8.0` as pandas writes an integer column with gaps); None when it is
    not one: not a number, not whole, not finite, or more than MAX_INT_DIGITS digits."""
    text = text.strip()
    if not text or len(text) > MAX_INT_DIGITS + 2:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value.is_integer() else None


class _Refused(ValueError):
    """Text a bounded reader does not accept (the message says what and where)."""


# ---- YAML ----------------------------------------------------------------------------------------------------
class BoundedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader within the bounds: anchors and aliases refused before any object is built (a spec has
    no use for them, and nested aliases are a "billion laughs" bomb), duplicate keys at any depth refused, at most
    MAX_DEPTH levels of nesting (PyYAML's composer recurses per level), integers of at most MAX_INT_DIGITS
    digits; numbers read as YAML 1.2 writes them (see below)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # PyYAML's signature
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = f"{'*' if isinstance(event, yaml.AliasEvent) else '&'}{event.anchor}"
            raise _Refused(f"YAML anchors and aliases are not allowed ({excerpt(mark)} at line "
                           f"{event.start_mark.line + 1})")
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))  # a level, as in JSON
        self._depth += collection
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels (line {event.start_mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= collection

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader refuses it itself
                continue
            if first is not None:
                raise _Refused(f"duplicate key {excerpt(key)} at line {line} (first at line {first})")
            seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        digits = sum(c.isalnum() for c in str(node.value))  # 0x.., 0o.., 1_000, 1:20 (sexagesimal) alike
        if digits > MAX_INT_DIGITS:
            raise _Refused(f"an integer of {digits:,} digits at line {node.start_mark.line + 1} "
                           f"(at most {MAX_INT_DIGITS})")
        return super().construct_yaml_int(node)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
# YAML 1.1 (PyYAML's schema) reads `1e12` and `1.0e12` as strings: a float needs a dot and a signed exponent.
# YAML 1.2's core schema, what users write (the README's `train_tokens: 1.0e12`), makes them floats. The
# resolver is added to this loader only (not to yaml.SafeLoader), and after PyYAML's own: what YAML 1.1
# already reads as a number, a bool or a string keeps its meaning. The field types then decide: a float where
# an integer is wanted (`nodes: 1e3`) is still refused, as `nodes: 1.7` is.
YAML12_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+.0123456789"))


def loads_yaml(text: str, what: str) -> Any:
    """The value `text` holds (one YAML document), within the bounds; `what` names it in the error line. A
    YAML error's message is cut and its excerpts of the text masked (inputs.bounded_message)."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except _Refused as exc:
        raise SpecError(f"{what}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        why = bounded_message(exc.problem or exc.context or "not YAML")
        raise SpecError(f"{what}: not valid YAML ({why}{where})") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{what}: not valid YAML ({bounded_message(str(exc))})") from None
    except RecursionError:  # called already deep in a stack: the bound above was not enough
        raise SpecError(f"{what}: nested too deep") from None


def read_yaml(path: str | Path, what: str, limit: int = MAX_INPUT_BYTES) -> Any:
    """The value of a YAML file (at most `limit` bytes of UTF-8), within the bounds."""
    return loads_yaml(read_text_file(path, what, limit), f"{what} {str(path)!r}")


# ---- CSV -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CsvTable:
    """A CSV file's header and rows, each row a mapping of the header's names to its cells (stripped)."""
    header: tuple[str, ...]
    """The column names of the first line, stripped, each once."""
    rows: tuple[tuple[int, dict[str, str]], ...]
    """(the line the row starts on, its cells by column name); blank lines are no rows."""


def read_csv(path: str | Path, what: str, limit: int = MAX_TABLE_BYTES) -> CsvTable:
    """A CSV file (at most `limit` bytes of UTF-8) within the bounds: a header of distinct names, rows of
    exactly as many cells, cells of at most MAX_CELL_CHARS characters. `what` names the file in the error line;
    an error quotes the file only as an excerpt."""
    where = f"{what} {str(path)!r}"
    text = read_text_file(path, what, limit)
    reader = csv.reader(io.StringIO(text, newline=""))
    header: tuple[str, ...] | None = None
    rows: list[tuple[int, dict[str, str]]] = []
    start = 1
    try:
        for cells in reader:
            line, start = start, reader.line_num + 1
            if not cells:
                continue
            if len(cells) > MAX_COLUMNS:
                raise SpecError(f"{where} line {line}: {len(cells):,} cells, more than {MAX_COLUMNS}")
            long = next((i for i, c in enumerate(cells) if len(c) > MAX_CELL_CHARS), None)
            if long is not None:
                column = f"column {excerpt(header[long])}: " if header and long < len(header) else ""
                raise SpecError(f"{where} line {line}: {column}a cell of {len(cells[long]):,} characters, more "
                                f"than {MAX_CELL_CHARS:,} ({excerpt(cells[long])})")
            cells = [c.strip() for c in cells]
            if header is None:
                twice = next((c for i, c in enumerate(cells) if c in cells[:i]), None)
                if twice is not None:
                    raise SpecError(f"{where} line {line}: column {excerpt(twice)} appears twice in the header")
                header = tuple(cells)
                continue
            if len(cells) != len(header):
                raise SpecError(f"{where} line {line}: {len(cells)} cells, but the header has {len(header)} "
                                "columns")
            rows.append((line, dict(zip(header, cells))))
    except csv.Error as exc:  # a NUL byte, a quote left open: the module's message quotes no cell
        raise SpecError(f"{where} line {reader.line_num}: not CSV ({bounded_message(str(exc))})") from None
    return CsvTable(header or (), tuple(rows))
