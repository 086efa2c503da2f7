"""layout.yaml: a Layout as the file `--layout FILE` reads back (its Layout.to_dict() fields)."""

from __future__ import annotations

from typing import Any

import yaml

from search_spaces.layouts.layout import Layout


def layout_yaml(layout: Layout, **context: Any) -> str:
    """layout.yaml: the Layout.to_dict() fields (what `--layout FILE` reads), context as comments."""
    header = "".join(f"# {k}: {v}\n" for k, v in context.items() if v is not None)
    return header + yaml.safe_dump(layout.to_dict(), sort_keys=False)
