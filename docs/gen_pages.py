"""mkdocs-gen-files script: writes the reference pages docs/refgen.py derives from the code into the build."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parent))
import refgen

for path, text in refgen.pages().items():
    with mkdocs_gen_files.open(path, "w") as out:
        out.write(text)
