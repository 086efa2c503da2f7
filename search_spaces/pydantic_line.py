"""One line for a pydantic validation error: what every file format (spec, Slurm settings, config.json,
calibration file) says when its input is refused. The first error only, where it is and why; never a traceback.

    unknown {noun} 'where'; allowed: a, b, c          a field the model does not declare
    lacks a required {noun} 'where'                   a field that must be given
    {noun} where.inner: why[, got value]              a value refused
    {whole}: why                                      a check across fields (the model's own validator)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from search_spaces.inputs import bounded_message, excerpt

# pydantic error types where the offending value helps (`nodes: 1.7`, `seed: -1`, `trial_timeout_s: .inf`)
SHOW_INPUT = {"int_from_float", "int_parsing", "finite_number", "greater_than", "greater_than_equal",
              "less_than", "less_than_equal"}
VALUE_ERROR_PREFIX = "Value error, "


def one_line(exc: ValidationError, root: type[BaseModel], noun: str = "field", whole: str = "") -> str:
    """The first error of `exc` (raised validating `root`) as one line; `noun` names what a location is,
    `whole` what the model is (the prefix of an error that belongs to no one field)."""
    err = exc.errors()[0]
    loc = err["loc"]
    where = ".".join(str(p) for p in loc)  # keys come from the file: quoted as an excerpt (inputs.excerpt)
    if err["type"] == "extra_forbidden":
        parent = model_at(root, loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent else ""
        return f"unknown {noun} {excerpt(where, 60)}" + (f"; allowed: {allowed}" if allowed else "")
    if err["type"] == "missing":
        return f"lacks a required {noun} {excerpt(where, 60)}"
    value = err.get("input")  # a validator's message may quote the value read from the file: as an excerpt
    msg = bounded_message(err["msg"].removeprefix(VALUE_ERROR_PREFIX), [value] if isinstance(value, str) else [])
    if not loc:
        return f"{whole}: {msg}" if whole else msg
    where = where if len(where) <= 60 and where.isprintable() else excerpt(where, 60)
    if err["type"] == "literal_error" or err["type"].endswith("_type") or err["type"] in SHOW_INPUT:
        return f"{noun} {where}: {msg}, got {short(err.get('input'))}"
    return f"{noun} {where}: {msg}"


def short(value: Any) -> str:
    """A value as a user can read it in one line: cut, a huge integer by its size, text as an excerpt (escaped,
    obvious secrets masked: it was read from a file)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, str):
        return excerpt(value, 60)
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The nested model at `loc` (a field path) under `root`; None where the path leaves the models."""
    model = root
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model
