"""Memo tables for the cost model's terms: a term is computed once per distinct value of what it reads.

`space` estimates tens of thousands of layouts that differ in one or two features, and most terms read only
some of a layout's fields (a layer's saved activations do not read the CUDA graphs, the optimizer offload or the
CP communication), so most of their values repeat. A term keeps a `Memo`; its table is found by the *identity*
of the objects of the situation it is computed for (the model, the GPU, the calibration: all frozen) and keyed
by the layout fields the term declares it reads (`fields(...)`, beside the term) and its other arguments.
A table holds its owners, so no other object can take their ids while it lives. Tables are bounded: a Memo keeps
MAX_OWNERS situations (a calibration fit makes many) and empties a table grown past MAX_ENTRIES.

A stale value would be a wrong figure, silently: tests/search_spaces/test_speed_identity.py pins today's figures and
recomputes warm estimates from scratch (`clear_all`) over many neighbouring layouts.
"""

from __future__ import annotations

from operator import attrgetter, is_
from typing import Any, Callable

MAX_OWNERS = 8
MAX_ENTRIES = 1 << 17

_ALL: list["Memo"] = []


class Memo:
    """One term's tables, one per situation (its owner objects)."""

    def __init__(self, name: str):
        self.name = name
        self._tables: dict[tuple[int, ...], tuple[tuple[Any, ...], dict]] = {}
        # the situation asked for last (the next call is nearly always for it again): its owners and table
        self._last_owners: tuple[Any, ...] = (None,)
        self._last_table: dict = {}
        _ALL.append(self)

    def table(self, owners: tuple[Any, ...]) -> dict:
        """The table of the situation these objects make (found by identity: a table holds its owners, so ids
        that match are theirs)."""
        last = self._last_owners
        if len(owners) == len(last) and owners[0] is last[0] and (len(owners) == 1 or all(map(is_, owners, last))):
            return self._last_table
        ids = tuple(map(id, owners))
        entry = self._tables.get(ids)
        if entry is None:
            if len(self._tables) >= MAX_OWNERS:
                del self._tables[next(iter(self._tables))]  # the oldest situation
            entry = self._tables[ids] = (owners, {})
        self._last_owners, self._last_table = entry
        return entry[1]

    def get(self, owners: tuple[Any, ...], key: Any, compute: Callable[[], Any]) -> Any:
        """The value of `key` in the owners' table, computed (and kept) on a miss."""
        last = self._last_owners  # table(owners), inline: this runs hundreds of thousands of times
        if len(owners) == len(last) and owners[0] is last[0] and (len(owners) == 1 or all(map(is_, owners, last))):
            table = self._last_table
        else:
            table = self.table(owners)
        try:
            return table[key]
        except KeyError:
            if len(table) >= MAX_ENTRIES:
                table.clear()
            value = table[key] = compute()
            return value

    def get_for(self, owners: tuple[Any, ...], obj: Any, compute: Callable[[], Any]) -> Any:
        """The value for the object `obj` itself (found by identity, kept with it: a rank's units tuple, whose
        hash would cost more than the term), computed on a miss."""
        table = self.table(owners)
        entry = table.get(id(obj))
        if entry is None or entry[0] is not obj:
            if len(table) >= MAX_ENTRIES:
                table.clear()
            entry = table[id(obj)] = (obj, compute())
        return entry[1]

    def clear(self) -> None:
        self._tables.clear()
        self._last_owners, self._last_table = (None,), {}


class HashOnce(tuple):
    """A tuple whose hash is computed once: a long key (a chunk's make-up) looked up many times."""

    def __hash__(self) -> int:
        try:
            return self.__dict__["hash"]
        except KeyError:
            value = self.__dict__["hash"] = tuple.__hash__(self)
            return value


def fields(*names: str) -> Callable[[Any], tuple[Any, ...]]:
    """A reader of these layout fields as one tuple: a term's key (what it declares it reads)."""
    if len(names) == 1:
        single = attrgetter(names[0])
        return lambda layout: (single(layout),)
    return attrgetter(*names)


def clear_all() -> None:
    """Forget every memoised value (tests compare warm values with ones computed from scratch)."""
    for memo in _ALL:
        memo.clear()
