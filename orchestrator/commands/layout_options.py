"""Layout flags for typer commands, one per dimension of the registry (search_spaces.layouts.layout.DIMENSIONS).

`with_layout_options(command)` adds `--tp`, `--recompute`, ... (the flags `python -m trainers.megatron_moe`
takes too) to a typer command and hands the command the flags that were given as `layout_flags`
({field: text}); `Layout.from_params` decodes them, so a bad value is one line naming the field.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import typer

from search_spaces.layouts.layout import DIMENSIONS


def with_layout_options(command: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(command)
    kept = [p for p in signature.parameters.values() if p.name != "layout_flags"]
    added = [inspect.Parameter(
        dim.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
        default=typer.Option(None, dim.flag, help=f"{dim.doc} ({dim.values_text()}; default "
                                                  f"{dim.encode(dim.default)})", rich_help_panel="Layout"))
        for dim in DIMENSIONS]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        flags = {dim.name: kwargs.pop(dim.name) for dim in DIMENSIONS}
        return command(**kwargs, layout_flags={k: v for k, v in flags.items() if v is not None})

    # what typer reads (inspect's __signature__ hook, which typeshed's functools wrapper does not declare)
    wrapper.__signature__ = signature.replace(parameters=kept + added)  # type: ignore[attr-defined]
    return wrapper
