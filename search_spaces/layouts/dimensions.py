"""What a layout dimension is: its value type, legal values, spellings and names in the tools around it.

Each dimension is declared once, as a field of `search_spaces.layouts.layout.Layout` (`dimension(...)` below), and
everything that spells a layout out derives from that declaration: the spec's free/fixed keys, the search's
parameters (one categorical Optuna parameter per dimension, values `encode`d), the replay/leaderboard CSV
columns, MLflow params, the trainer's and `estimate`'s flags, and the Megatron exports.

Pure Python, no third-party imports.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

from search_spaces.errors import SpecError

# The primitive a value becomes in Optuna params, CSV cells and MLflow params.
Primitive = int | float | str | bool | None
# canonical values a dimension remembers (Dimension.canonical): sizes and batches of every space explored
MAX_SEEN_CANONICAL = 1 << 14


@dataclass(frozen=True, eq=False)  # one object per dimension: identity is equality (and hashable)
class Dimension:
    """One layout dimension. `Layout` builds these from its field declarations."""
    name: str
    doc: str
    kind: str  # int | float | bool | choice | modules (names; "none" when empty) | recompute (none, full or modules)
    #          | sizes (a tuple of integers >= 2, e.g. hierarchical CP group sizes; "none" when empty)
    default: Any
    flag: str  # the flag of `moe-autotune estimate` and `python -m trainers.megatron_moe`
    megatron: str | None = None  # Megatron-Bridge ConfigContainer path (model.* is Megatron-Core's TransformerConfig)
    megatron_lm: str | None = None  # Megatron-LM (pretrain_gpt.py) flag
    # How Megatron-Core / Transformer Engine spell each value in the `megatron` field, where that is not our
    # spelling (None: the field is left unset). The one home of these spellings: the trainer's configs and
    # every export read them through `megatron_fields`.
    megatron_values: dict[str, Any] = field(default_factory=dict)
    # Further Megatron-Core config fields (TransformerConfig names) a value sets, beside the `megatron` one.
    megatron_extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Megatron-Bridge ConfigContainer entries a value sets outside its model (e.g. a mixed-precision recipe).
    bridge_extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    searchable: bool = False  # a sweep may vary it (spec `free`) and it is a search parameter
    parallel: bool = False  # a parallel size the trainer reports back as applied
    choices: tuple[str, ...] = ()  # legal values of a choice or modules dimension
    aliases: dict[str, str] = field(default_factory=dict)  # accepted spellings -> canonical value
    # choices that carry a number after a colon (routing's `capacity:1.25`) -> the number's (minimum, maximum);
    # the number is the value of the `megatron` field, `megatron_extra` is keyed by the choice (`mode`)
    parametrised: dict[str, tuple[float, float]] = field(default_factory=dict)
    # values for benchmarks only (routing's forced_balance): a sweep never proposes them, promote refuses them
    benchmark_only: tuple[str, ...] = ()
    # searchable, but a sweep varies it only when its spec lists it in `free` (the default `free` leaves it
    # out) and `space` holds it at its default unless fixed: a choice that changes what is trained
    opt_in: bool = False
    minimum: float | None = None
    maximum: float | None = None
    optional: bool = False  # None is a legal value (meaning "decided by the rest of the layout")
    # left out of Layout.to_dict (the JSON of records, `estimate` and `space`) while at its default: a lever added
    # after those outputs were published, so a layout that does not use it prints as it always did
    quiet_default: bool = False
    # the cost model's memoised terms whose value it changes (layout.COST_TERMS): a term is keyed by the dimensions
    # that name it (layout.fields_read_by), so one that changes a term's value and does not name it is a stale value
    read_by: tuple[str, ...] = ()

    # ---- values ------------------------------------------------------------------------------------
    def parse(self, value: Any) -> Any:
        """The canonical value of `value`, or a SpecError naming the dimension. Strict: no float for an
        int, no number for a name; text is accepted only through `decode`."""
        if value is None and self.optional:
            return None
        if self._canonical(value):  # the common case (enumerations build millions of layouts): no work
            return value
        return _PARSERS[self.kind](self, value)

    def canonical(self, value: Any) -> Any:
        """`parse(value)`, at the cost of a set lookup for a value seen before: Layout runs it on every field of
        every layout it builds (enumerations build hundreds of thousands). parse is idempotent, so what it
        returns is canonical and remembered, keyed with its type (True never passes for 1)."""
        seen = self.seen_canonical
        try:
            if (type(value), value) in seen:
                return value
        except TypeError:  # unhashable (a list): parsed below
            pass
        parsed = self.parse(value)
        if len(seen) < MAX_SEEN_CANONICAL:
            seen.add((type(parsed), parsed))
        return parsed

    @property
    def seen_canonical(self) -> set:
        """The canonical values seen (per dimension; not a field: equality and hashing are identity)."""
        try:
            return self.__dict__["_seen_canonical"]
        except KeyError:
            return self.__dict__.setdefault("_seen_canonical", set())

    def _canonical(self, value: Any) -> bool:
        kind = type(value)
        if self.kind == "int":
            return kind is int and (self.minimum is None or value >= self.minimum) and (
                self.maximum is None or value <= self.maximum)
        if self.kind == "choice":
            return kind is str and value in self.choices and value not in self.parametrised
        if self.kind == "bool":
            return kind is bool
        if self.kind == "modules":
            return kind is tuple and all(v in self.choices for v in value) and len(set(value)) == len(value)
        if self.kind == "sizes":
            return kind is tuple and all(type(v) is int and v >= 2 for v in value)
        return False

    def encode(self, value: Any) -> Primitive:
        """The canonical value as one primitive (Optuna param, CSV cell, MLflow param)."""
        if value is None:
            return "auto"
        if self.kind == "modules":
            return ",".join(value) or "none"
        if self.kind == "sizes":
            return ",".join(str(v) for v in value) or "none"
        return value

    def decode(self, text: Any) -> Any:
        """The canonical value of an encoded primitive or of its text (a CSV cell, an MLflow param, a flag)."""
        if not isinstance(text, str):
            return self.parse(text)
        raw = text.strip()
        if self.optional and raw.lower() in ("auto", "none", ""):
            return None
        try:
            if self.kind == "int":
                return self.parse(int(raw))
            if self.kind == "float":
                return self.parse(float(raw))
        except ValueError:
            raise SpecError(f"layout field {self.name} must be {_KIND_WORDS[self.kind]}, got {text!r}") from None
        if self.kind == "bool":
            if raw.lower() in ("true", "1", "yes", "on"):
                return True
            if raw.lower() in ("false", "0", "no", "off"):
                return False
            raise SpecError(f"layout field {self.name} must be true or false, got {text!r}")
        return self.parse(raw.replace(";", ","))

    def mode(self, value: Any) -> Any:
        """The choice a canonical value is of: `capacity` for `capacity:1.25`, the value itself otherwise."""
        return value.split(":", 1)[0] if self.parametrised and isinstance(value, str) else value

    def parameter(self, value: Any) -> float | None:
        """The number a parametrised choice carries (1.25 for `capacity:1.25`), else None."""
        return float(value.split(":", 1)[1]) if self.mode(value) in self.parametrised else None

    # ---- Megatron spellings -------------------------------------------------------------------------
    def megatron_value(self, value: Any) -> Any:
        """A canonical value as Megatron-Core spells it in the `megatron` field (names mapped one by one; a
        parametrised choice's number)."""
        if self.kind == "modules":
            return [self.megatron_values.get(v, v) for v in value]
        if self.kind == "choice":
            number = self.parameter(value)
            return number if number is not None else self.megatron_values.get(value, value)
        return value

    @property
    def megatron_field(self) -> str:
        """The `megatron` field's TransformerConfig name (the last part of its ConfigContainer path)."""
        if self.megatron is None:  # asked of a dimension Megatron has no field for: a caller's bug
            raise ValueError(f"dimension {self.name} has no Megatron field")
        return self.megatron.rsplit(".", 1)[-1]

    def megatron_field_names(self) -> tuple[str, ...]:
        """Every Megatron-Core config field a choice of this dimension sets (what to read back from a config)."""
        return tuple(dict.fromkeys([self.megatron_field,
                                    *(k for extra in self.megatron_extra.values() for k in extra)]))

    def megatron_fields(self, value: Any) -> dict[str, Any]:
        """The Megatron-Core config fields (by their TransformerConfig name) a choice value sets; a field
        spelled None is left out (Megatron's default)."""
        fields = {self.megatron_field: self.megatron_value(value), **self.megatron_extra.get(self.mode(value), {})}
        return {k: v for k, v in fields.items() if v is not None}

    def from_megatron(self, fields: dict[str, Any]) -> Any:
        """The choice value Megatron-Core config `fields` spell (the inverse of `megatron_fields`): the one
        whose spelling of the `megatron` field (missing or None: unset; a number for a parametrised choice) and
        whose further fields all match, or a SpecError naming the Megatron spelling."""
        spelled = fields.get(self.megatron_field)
        for choice in self.choices:
            if not all(fields.get(k) == v for k, v in self.megatron_extra.get(choice, {}).items()):
                continue
            if choice in self.parametrised:
                if _is_number(spelled):
                    return self.parse(f"{choice}:{spelled}")
            elif self.megatron_value(choice) == spelled:
                return choice
        shown = ", ".join(f"{k}={v!r}" for k, v in fields.items() if v is not None) or "nothing set"
        raise SpecError(f"no {self.name} is spelled {shown} in Megatron; allowed: " + "; ".join(
            self._spelling_text(c) for c in self.choices))

    def _spelling_text(self, choice: str) -> str:
        if choice in self.parametrised:
            extra = self.megatron_extra.get(choice, {})
            return ", ".join([f"{self.megatron_field}=F", *(f"{k}={v!r}" for k, v in extra.items())])
        return ", ".join(f"{k}={v!r}" for k, v in self.megatron_fields(choice).items()) or choice

    def values_text(self) -> str:
        """The legal values in words, for help texts and errors."""
        if self.choices:
            return " | ".join(f"{c}:F" if c in self.parametrised else c for c in self.choices)
        return _KIND_WORDS[self.kind]


_KIND_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "choice": "a name",
               "modules": "a comma list of names", "recompute": "none, full or a comma list of modules",
               "sizes": "none or a comma list of integers >= 2"}


def _range_check(dim: Dimension, value: float) -> None:
    if dim.minimum is not None and value < dim.minimum:
        raise SpecError(f"layout field {dim.name} must be >= {dim.minimum:g}, got {value}")
    if dim.maximum is not None and value > dim.maximum:
        raise SpecError(f"layout field {dim.name} must be <= {dim.maximum:g}, got {value}")


def _parse_int(dim: Dimension, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SpecError(f"layout field {dim.name} must be an integer, got {value!r}")
    value = int(value)
    _range_check(dim, value)
    return value


def _parse_float(dim: Dimension, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise SpecError(f"layout field {dim.name} must be a finite number, got {value!r}")
    value = float(value)
    _range_check(dim, value)
    return value


def _parse_bool(dim: Dimension, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"layout field {dim.name} must be true or false, got {value!r}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _parse_choice(dim: Dimension, value: Any) -> str:
    if not isinstance(value, str):
        raise SpecError(f"layout field {dim.name} must be one of {dim.values_text()}, got {value!r}")
    text, _, number = value.strip().lower().partition(":")
    name = dim.aliases.get(text.strip(), text.strip())
    if name not in dim.choices:
        aliases = f" (aliases: {', '.join(dim.aliases)})" if dim.aliases else ""
        raise SpecError(f"unknown {dim.name} {value!r}; allowed: {dim.values_text()}{aliases}")
    if name in dim.parametrised:
        return _parametrised_choice(dim, name, number.strip())
    if number:
        raise SpecError(f"{dim.name} {name} takes no number, got {value!r}")
    return name


@functools.lru_cache(maxsize=1024)
def _parametrised_choice(dim: Dimension, name: str, number: str) -> str:
    """`capacity` + `1.25` -> `capacity:1.25` (the number as Python's shortest float spelling), or a SpecError."""
    low, high = dim.parametrised[name]
    try:
        x = float(number)
    except ValueError:
        raise SpecError(f"{dim.name} {name} needs a number: {name}:F with F in [{low:g}, {high:g}] "
                        f"(e.g. {name}:1.25), got {number!r}") from None
    if not math.isfinite(x) or not low <= x <= high:
        raise SpecError(f"{dim.name} {name}:F needs F in [{low:g}, {high:g}], got {number}")
    return f"{name}:{x!r}"


def _parse_modules(dim: Dimension, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.replace(";", ",").split(",")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"layout field {dim.name} must be none or a comma list of "
                        f"{', '.join(dim.choices)}, got {value!r}")
    items = [v.strip() for v in value if v.strip()]
    if items == ["none"]:
        return ()
    out = []
    for item in items:
        name = dim.aliases.get(item, item)
        if name not in dim.choices:
            aliases = f" (aliases: {', '.join(dim.aliases)})" if dim.aliases else ""
            raise SpecError(f"unknown {dim.name} value {item!r}; allowed: none, {', '.join(dim.choices)}{aliases}")
        out.append(name)
    return tuple(dict.fromkeys(out))


def _parse_sizes(dim: Dimension, value: Any) -> tuple[int, ...]:
    """none | a comma list ("8,4") or a list of integers >= 2 -> a tuple of ints (empty for none)."""
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.replace(";", ",").replace("x", ",").strip()
        if text.lower() in ("", "none", "auto"):
            return ()
        try:
            value = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise SpecError(f"layout field {dim.name} must be {_KIND_WORDS['sizes']}, got {value!r}") from None
    if not isinstance(value, (list, tuple)) or any(
            isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in value):
        raise SpecError(f"layout field {dim.name} must be {_KIND_WORDS['sizes']}, got {value!r}")
    sizes = tuple(int(v) for v in value)
    if any(v < 2 for v in sizes):
        raise SpecError(f"layout field {dim.name}: every size must be >= 2, got {value!r}")
    return sizes


def _parse_recompute(dim: Dimension, value: Any) -> str:
    return _recompute_text(dim, value) if not isinstance(value, str) else _recompute_str(dim, value)


@functools.lru_cache(maxsize=4096)
def _recompute_str(dim: Dimension, value: str) -> str:
    return _recompute_text(dim, value)


def _recompute_text(dim: Dimension, value: Any) -> str:
    """none | full | the selectively recomputed modules, as the --recompute flag spells them."""
    if isinstance(value, str) and value.strip().lower() in ("none", "full"):
        return value.strip().lower()
    if isinstance(value, (list, tuple)) and [str(v).strip().lower() for v in value] == ["full"]:
        return "full"
    if (isinstance(value, str) and "full" in value.replace(";", ",").split(",")) or (
            isinstance(value, (list, tuple)) and "full" in value):
        raise SpecError("recompute 'full' cannot be combined with selective modules")
    return ",".join(_parse_modules(dim, value)) or "none"


_PARSERS: dict[str, Callable[[Dimension, Any], Any]] = {
    "int": _parse_int, "float": _parse_float, "bool": _parse_bool, "choice": _parse_choice, "modules": _parse_modules,
    "recompute": _parse_recompute, "sizes": _parse_sizes,
}


def dimension(default: Any, doc: str, *, kind: str, flag: str, **declared: Any) -> Any:
    """Declare a Layout field and its dimension (name and type come from the field)."""
    return dataclasses.field(default=default, metadata={"dimension": {"doc": doc, "kind": kind, "flag": flag,
                                                                      **declared}})


def dimensions_of(cls: type) -> tuple[Dimension, ...]:
    """The Dimensions a dataclass declared with `dimension(...)`, in field order."""
    out = []
    for f in dataclasses.fields(cls):
        declared = f.metadata.get("dimension")
        if declared is not None:
            out.append(Dimension(name=f.name, default=f.default, **declared))
    return tuple(out)
