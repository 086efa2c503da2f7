#!/usr/bin/env bash
# The wheels a lent GPU machine lacks (shared/notes/gpu-device.md): megatron-core, pydantic (search_spaces/ validates
# with it) and flash-linear-attention for the delta-net timing, into .whl/ (ignored; carry it: about 6 MB).
# Usage: bash scripts/gpu_wheels.sh   then on the device: pip install --no-index --no-deps --target .site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
[ -x "$python" ] || python="$(pyenv root)/versions/3.12.1/bin/python"
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || printf "/.whl/\n/.site/\n" >> .git/info/exclude
binary=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl)
pydantic_version=$("$python" -c 'import pydantic; print(pydantic.VERSION)')
"$python" -m pip download -q --no-deps "${binary[@]}" megatron-core==0.19.2
"$python" -m pip download -q "${binary[@]}" "pydantic==$pydantic_version"  # with pydantic-core and its pure deps
"$python" -m pip download -q --no-deps -d .whl fla-core==0.6.0 einops
ls .whl
