#!/usr/bin/env bash
# Tests numbax's release wheel, not the source tree, at both ends of what
# numbax declares: the oldest and newest supported JAX, and the oldest and
# newest supported Python, each in a fresh venv with no build tools. One row
# runs the full CPU suite; the others a subset that covers what a JAX or
# Python release can break (the FFI targets and their registration, the
# callable, the kernel, XLACustomKernel, export, vmap, versions).
#
#   bash scripts/wheel_matrix.sh [--wheel PATH] [ROW...] [-- pytest args]
#
# ROW is JAX_VERSION:SCOPE[:PYTHON]; SCOPE is all (every test file), full
# (all but HEAVY), subset, or subset+heavy (SUBSET and HEAVY): the default
# rows run every test file at least once, the slowest on a row of the other
# lane so that the two lanes take about the same time. PYTHON a version
# (3.12) found as pythonX.Y on PATH or under ~/.pyenv/versions, else
# Debian's build of it fetched once by scripts/lib/python_from_debian.sh (how
# Python 3.14 comes to this machine) (default: the PYTHON variable, else
# python3). Default rows: see DEFAULT_ROWS: each end of the supported
# Python (3.11, 3.14) and JAX (0.8.1, 0.12) range, and the GPU machine's
# jax 0.11.2, on two Pythons only (one wheel to build besides the one
# test.sh passes: .ci/run stays within 10 minutes; 3.12 and 3.13 run in the
# release workflow, 3.12 on the GPU too). Every wheel a row tests must be
# tagged manylinux_2_28 or lower for this machine's architecture
# (scripts/lib/wheel_tag.py), or the row fails. A SCOPE ending in
# +multigpu also runs the `multigpu` tests (collected but skipped in the
# other runs, which have one CPU device) as their dry run on 2 fake CPU
# devices: XLA_FLAGS=--xla_force_host_platform_device_count=2
# (tests/conftest.py; about a minute). The rows
# run two at a time (this machine has 2 cores; the full row is the long
# one). --wheel names the wheel for rows of the Python that built it; the
# wheels of other Pythons are built by scripts/build_wheel.sh. Needs PyPI
# access (each venv installs its JAX). NUMBAX_MATRIX_DIR (default
# /tmp/numbax-matrix) holds the venvs and logs.
set -euo pipefail
cd "$(dirname "$0")/.."
DEFAULT_PY=${PYTHON:-python3}
DEFAULT_ROWS=("0.10.2:full:3.11" "0.8.1:subset:3.11"
              "0.11.2:subset+heavy+multigpu:3.14" "0.12.0.1:subset:3.14")
# test_scale_out.py and test_sharding.py: XLA's partitioning of numbax ops
# (fake devices in processes of their own, and two jax.distributed
# processes) is what a JAX release changes most readily (Shardy chose other
# shardings in 0.12 than in 0.10), so every row runs them (about 40 s).
SUBSET=(tests/test_callable.py tests/test_kernel.py tests/test_custom_kernel.py
        tests/test_export.py tests/test_versions.py tests/test_scale_out.py
        tests/test_sharding.py)
# Slow files (fresh processes, fault loops) that need no
# particular JAX: run on the jax 0.11.2 row (Python 3.14), not the full one.
HEAVY=(tests/test_export_keys.py tests/test_faults.py)
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

# find_python X.Y: a runnable interpreter of that version (a pyenv shim on
# PATH may name one it cannot run, so each candidate is tried).
find_python() {
  local want=$1 c
  for c in "$(command -v "python$want" 2>/dev/null)" \
           $(ls -d "$HOME"/.pyenv/versions/"$want".*/bin/python"$want" 2>/dev/null | sort -V -r); do
    if [ -n "$c" ] && "$c" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$want'" 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}
py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# Pins for everything but jax/jaxlib (requirements-dev.txt, as constraints:
# pip refuses extras there).
grep -vE '^\s*(#|$)|^(jax|jaxlib)[=<> ]|\[' requirements-dev.txt \
  | sed 's/\s*#.*//' > "$WORK/constraints.txt"

# The wheel of each Python the rows need: the one given, else built when a
# row first needs it (in that row's lane, so the full row starts at once).
declare -A wheel_for pyexe
if [ -n "$wheel" ]; then
  wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
  tag=$(basename "$wheel" | cut -d- -f3)             # cp311
  wheel_for["${tag:2:1}.${tag:3}"]=$wheel
fi
ensure_wheel() {
  local want=$1 exe built
  [ -n "${pyexe[$want]:-}" ] || {
    exe=$(find_python "$want") ||
      exe=$(bash scripts/lib/python_from_debian.sh "$want" | tail -1) ||
      { echo "no Python $want found (pyenv install $want)"; return 1; }
    pyexe[$want]=$exe
  }
  [ -n "${wheel_for[$want]:-}" ] && return 0
  echo "== build: the release wheel for Python $want (scripts/build_wheel.sh)"
  built=$(PYTHON="${pyexe[$want]}" DIST="build/dist-py$want-$BASHPID" WHEEL_ONLY=1 \
          bash scripts/build_wheel.sh) || return 1
  wheel_for[$want]=$(pwd)/$built
}

# run_row JAX_VERSION SCOPE PYTHON_VERSION: fresh venv, the wheel, the tests.
# Writes $WORK/result-<jax> (one summary line) and returns pytest's status.
run_row() {
  local jax_v=$1 scope=$2 want=$3 venv="$WORK/jax-$1" files rc versions
  if ! ensure_wheel "$want" > "$WORK/build-$jax_v.log" 2>&1; then
    cat "$WORK/build-$jax_v.log"
    echo "jax $jax_v, Python $want: no wheel (see $WORK/build-$jax_v.log)" > "$WORK/result-$jax_v"
    return 1
  fi
  if ! python3 scripts/lib/wheel_tag.py --max 2_28 --arch "$(uname -m)" "${wheel_for[$want]}" \
      > "$WORK/tag-$jax_v.log" 2>&1; then
    cat "$WORK/tag-$jax_v.log"
    echo "jax $jax_v, Python $want: wheel tag refused: $(tail -1 "$WORK/tag-$jax_v.log")" > "$WORK/result-$jax_v"
    return 1
  fi
  rm -rf "$venv"
  "${pyexe[$want]}" -m venv "$venv"
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      -c "$WORK/constraints.txt" "${wheel_for[$want]}[bench,cpu]" "jax==$jax_v" "jaxlib==$jax_v" \
      pytest hypothesis flatbuffers > "$WORK/pip-$jax_v.log" 2>&1; then
    tail -20 "$WORK/pip-$jax_v.log"
    echo "jax $jax_v, Python $want: install failed (see $WORK/pip-$jax_v.log)" > "$WORK/result-$jax_v"
    return 1
  fi
  # The full rows also check numbax's numba-cuda-mlir support that needs no
  # GPU (tests/test_mlir.py). Without its CUDA extras it adds only
  # typing-extensions to what numba-cuda brings (the pins still hold).
  local mlir=0
  case "$scope" in full|all) mlir=1 ;; esac
  if [ "$mlir" = 1 ] && ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      -c "$WORK/constraints.txt" "numba-cuda-mlir==${MLIR_VERSION:-0.6.0}" \
      >> "$WORK/pip-$jax_v.log" 2>&1; then
    echo "jax $jax_v: numba-cuda-mlir install failed (see $WORK/pip-$jax_v.log)" > "$WORK/result-$jax_v"
    return 1
  fi
  # No compiler or build tool in the venv: the wheel is all numbax needs.
  for tool in cmake ninja; do
    if [ -e "$venv/bin/$tool" ]; then
      echo "jax $jax_v: unexpected: $tool in the test venv" > "$WORK/result-$jax_v"; return 1
    fi
  done
  local multigpu=0
  case "$scope" in *+multigpu) multigpu=1; scope=${scope%+multigpu} ;; esac
  case "$scope" in
    all) files=(tests) ;;
    full) files=(tests); for f in "${HEAVY[@]}"; do files+=(--ignore "$f"); done ;;
    subset) files=("${SUBSET[@]}") ;;
    subset+heavy) files=("${SUBSET[@]}" "${HEAVY[@]}") ;;
    *) echo "jax $jax_v: unknown scope '$scope'" > "$WORK/result-$jax_v"; return 1 ;;
  esac
  # From the checkout: numbax lives under src/, never on sys.path here, so
  # every `import numbax` (the tests' subprocesses too) is the installed wheel.
  set +e
  NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${files[@]}" "${pytest_args[@]}" \
    > "$WORK/pytest-$jax_v.log" 2>&1
  rc=$?
  local dry=""
  rm -f "$WORK/pytest-multigpu-$jax_v.log"
  if [ "$multigpu" = 1 ]; then
    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu \
      XLA_FLAGS=--xla_force_host_platform_device_count=2 \
      "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider -m multigpu \
      tests/test_multigpu.py tests/test_multiprocess.py "${pytest_args[@]}" \
      > "$WORK/pytest-multigpu-$jax_v.log" 2>&1 || rc=1
    dry="; multigpu dry run (2 fake devices): $(tail -1 "$WORK/pytest-multigpu-$jax_v.log")"
    scope="$scope+multigpu"
  fi
  set -e
  versions=$(cd "$WORK" && "$venv/bin/python" -c "import sys, jax, jaxlib.version, numpy, numbax._build_info as b; print(f'Python {sys.version.split()[0]}, jax {jax.__version__} jaxlib {jaxlib.version.__version__} numpy {numpy.__version__}, numbax built against FFI {b.XLA_FFI_API[0]}.{b.XLA_FFI_API[1]} ({b.XLA_FFI_HEADERS_FROM})')" 2>&1 | tail -1)
  echo "$versions, wheel $(head -1 "$WORK/tag-$jax_v.log") [$scope]: $(tail -1 "$WORK/pytest-$jax_v.log")$dry" > "$WORK/result-$jax_v"
  return $rc
}

# Two lanes: the full rows in one, the subset rows in the other.
status=0
lane() {
  local st=0 row jax_v scope want
  for row in "$@"; do
    IFS=: read -r jax_v scope want <<< "$row"
    [ -n "$want" ] || want=$(py_version "$DEFAULT_PY")
    echo "== jax $jax_v, Python $want: fresh venv, the wheel, CPU tests ($scope)"
    run_row "$jax_v" "$scope" "$want" || st=1
  done
  return $st
}
full=() rest=()
for row in "${rows[@]}"; do
  case "$row" in *:full*|*:all*) full+=("$row") ;; *) rest+=("$row") ;; esac
done
pids=()
[ ${#full[@]} -gt 0 ] && { lane "${full[@]}" & pids+=($!); }
[ ${#rest[@]} -gt 0 ] && { lane "${rest[@]}" & pids+=($!); }
for pid in "${pids[@]}"; do wait "$pid" || status=1; done

echo "== wheel matrix"
for row in "${rows[@]}"; do
  IFS=: read -r jax_v _ _ <<< "$row"
  # Failures first, in full, so CI's log shows them.
  if ! grep -qE ' passed' "$WORK/result-$jax_v" 2>/dev/null || grep -qE 'failed|error' "$WORK/result-$jax_v"; then
    grep -hE "^(FAILED|ERROR)" "$WORK/pytest-$jax_v.log" \
      "$WORK/pytest-multigpu-$jax_v.log" 2>/dev/null | head -40 || true
  fi
done
for row in "${rows[@]}"; do
  IFS=: read -r jax_v _ _ <<< "$row"
  echo "  $(cat "$WORK/result-$jax_v" 2>/dev/null || echo "jax $jax_v: no result")"
done
exit $status
