"""How a record declares what it stores: `stored(doc, *feeds)` on a dataclass field, and reading / writing those
fields as Optuna user attrs (`Stored`). A value of the wrong type reads as absent (an older or damaged study
still loads); a typed value (a Layout, a TrialResult) is kept as JSON through its `load` / `dump`."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import field
from typing import Any, Callable

from search_spaces.errors import SpecError
from search_spaces.layouts.layout import Layout
from search_spaces.result import TrialResult

# what a declaration feeds
COLUMN = "leaderboard column"  # a column of the leaderboard (`status --csv`), after the replay-table columns
TABLE = "replay-table column"  # a column of the replay table (and so of the leaderboard too)
TAG = "MLflow tag"  # a tag of the trial's child run
PREDICTED = "predicted"  # the cost model predicts it too: `predicted_<name>` beside the measurement in MLflow
COMPARE = "predicted beside measured"  # the leaderboard and the MLflow runs view show predicted_<name> beside it
HEADLINE = "headline"  # the sweep summary's best_<name>; `check` compares the study's with MLflow's
VIEW = "MLflow runs view"  # a column of the MLflow runs view (the trials by tokens/s/GPU)
COMPOSED = "composed"  # a proxy trial's composed full-size figure, logged as composed_<name>
OBJECTIVE = "objective"  # one of the study's objectives (tokens/s/GPU, peak memory): a required replay-table column
EXTRA = "sweep's own"  # written by the sweep into result.extra (bookkeeping), not measured by the trainer


def stored(doc: str, *feeds: str, default: Any = None, factory: Callable[[], Any] | None = None,
           load: Callable[[Any], Any] | None = None, dump: Callable[[Any], Any] | None = None) -> Any:
    """A stored attribute: its docstring, what it feeds, and (for a typed value kept as JSON) how it is read
    from its stored form (`load`, None when it cannot be) and written (`dump`)."""
    meta = {"doc": doc, "feeds": frozenset(feeds), "load": load, "dump": dump}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# ---- typed values kept as JSON ------------------------------------------------------------------

def load_layout(data: Any) -> Layout | None:
    try:
        return Layout.from_dict(data) if isinstance(data, dict) and data else None
    except (SpecError, TypeError, ValueError):  # a proposal that was not even a Layout: its params are kept
        return None


def dump_layout(layout: Any) -> Any:
    return layout.to_dict() if isinstance(layout, Layout) else layout


def load_result(data: Any) -> TrialResult | None:
    """A stored TrialResult (its to_dict()), or None when it is not one."""
    if isinstance(data, TrialResult):
        return data
    try:
        return TrialResult.from_dict(data) if isinstance(data, dict) else None
    except (TypeError, ValueError):
        return None


def jsonable(data: Any) -> Any:
    """`data` as JSON can hold it: non-finite floats become None, anything else unknown its str."""
    if isinstance(data, dict):
        return {str(k): jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [jsonable(v) for v in data]
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if data is None or isinstance(data, (str, int, float, bool)):
        return data
    return str(data)


def dump_result(result: Any) -> Any:
    return jsonable(result.to_dict()) if isinstance(result, TrialResult) else result


def finite(value: Any) -> float | None:
    """A finite number, else None (a stored NaN, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


# ---- reading and writing stored fields -----------------------------------------------------------

def _runtime_types(hint: Any) -> tuple[type, ...]:
    """The classes a value of annotation `hint` may be (float takes an int too)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for part in typing.get_args(hint) for t in _runtime_types(part))
    if hint is type(None):
        return (type(None),)
    if hint is float:
        return (float, int)
    origin = typing.get_origin(hint)
    return (origin,) if isinstance(origin, type) else (hint,) if isinstance(hint, type) else (object,)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _declared(cls: type) -> tuple[dataclasses.Field, ...]:
    """The stored fields of a record class (each read and write asks: worked out once per class)."""
    return tuple(f for f in dataclasses.fields(cls) if "doc" in f.metadata)


@functools.cache
def _readers(cls: type) -> tuple[tuple[str, Callable[[Any], Any] | None, tuple[type, ...]], ...]:
    """(name, load, the classes a stored value may be) of each stored field of a record class."""
    hints = _hints(cls)
    return tuple((f.name, f.metadata["load"], _runtime_types(hints[f.name])) for f in _declared(cls))


@functools.cache
def _by_name(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in _declared(cls)}


class Stored:
    """Reading and writing the stored fields of a record class (a dataclass declared with `stored`)."""

    @classmethod
    def stored_fields(cls) -> tuple[dataclasses.Field, ...]:
        owner: type = cls  # as a plain type: mypy finds a class object Hashable only as one
        return _declared(owner)

    @classmethod
    def feeding(cls, feed: str) -> tuple[str, ...]:
        """The names of the stored fields that feed `feed` (COLUMN, TABLE, TAG), in declaration order."""
        return tuple(f.name for f in cls.stored_fields() if feed in f.metadata["feeds"])

    @classmethod
    def _read(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        owner: type = cls  # as a plain type: mypy finds a class object Hashable only as one
        out = {}
        for name, load, kinds in _readers(owner):
            raw = attrs.get(name)
            value = load(raw) if load is not None and raw is not None else raw
            if value is not None and isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
                out[name] = value
        return out

    @classmethod
    def attrs(cls, **values: Any) -> dict[str, Any]:
        """User attrs as stored: each name must be a stored field; typed values in their stored form."""
        owner: type = cls  # as a plain type: mypy finds a class object Hashable only as one
        by_name = _by_name(owner)
        unknown = [k for k in values if k not in by_name]
        if unknown:
            raise TypeError(f"{cls.__name__} has no stored attribute {unknown[0]!r}")
        return {k: (by_name[k].metadata["dump"] or (lambda v: v))(v) for k, v in values.items()}

    @classmethod
    def write(cls, target: Any, **values: Any) -> None:
        """Store attributes on an Optuna trial or study (each name a stored field of this record)."""
        for key, value in cls.attrs(**values).items():
            target.set_user_attr(key, value)

    def stored_attrs(self) -> dict[str, Any]:
        """This record's stored fields as user attrs (the ones it has)."""
        return self.attrs(**{f.name: getattr(self, f.name) for f in self.stored_fields()
                             if getattr(self, f.name) is not None})
