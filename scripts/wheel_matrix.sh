#!/usr/bin/env bash
# Tests numbax's release wheel, not the source tree, in fresh venvs without
# build tools, at both ends of the supported JAX and Python ranges.
#
#   bash scripts/wheel_matrix.sh [--wheel PATH] [ROW...] [-- pytest args]
#
# ROW is JAX_VERSION:SCOPE:PYTHON, SCOPE all (every test file) or subset
# (SUBSET), +multigpu adding the `multigpu` tests' dry run on 2 fake CPU
# devices (its own pytest: XLA_FLAGS must be set before JAX starts).
# Default: ROWS, each end of Python and JAX (the GPU machine's 0.11.2 runs
# the whole suite in scripts/gpu_check.sh; like 0.12 it has no backend-start
# hook, the one difference numbax sees between them). Pythons come from
# PATH, ~/.pyenv or Debian (scripts/lib/python_from_debian.sh). --wheel is
# the wheel for its Python's rows; the others are built here, each tagged
# manylinux_2_28 or lower. pytest-xdist runs MATRIX_WORKERS (twice the
# cores: many tests wait on a child process; on 2 cores 4 workers took 253 s,
# 2 took 306). NUMBAX_MATRIX_DIR (/tmp/numbax-matrix) keeps venvs and logs.
# The last lines are each row's pytest closing line; the exit status is 1 if
# a row failed or ran no test (pytest's 5, unless pytest args were given).
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=("0.10.2:all:3.11" "0.8.1:subset:3.11" "0.12.0.1:subset+multigpu:3.14")
# The three GPU families and the CPU one, and what a JAX release changes most
# readily: XLA's partitioning of numbax ops (Shardy chose other shardings in
# 0.12 than in 0.10), export and the targets' registration (0.11 dropped the
# backend-start hook that export.md's loading recipe relied on), versions.
SUBSET=(tests/test_callable.py tests/test_kernel.py tests/test_custom_kernel.py
        tests/test_numba_kernel.py tests/test_numba_kernel_vmap.py
        tests/test_numba_kernel_errors.py tests/test_export.py
        tests/test_versions.py tests/test_scale_out.py tests/test_sharding.py)
WORK=${NUMBAX_MATRIX_DIR:-/tmp/numbax-matrix}
WORKERS=${MATRIX_WORKERS:-$(( 2 * $(nproc 2>/dev/null || echo 2) ))}

wheel="" rows=() pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=$(realpath "$2"); shift ;;
    --) shift; pytest_args=("$@"); break ;;
    *) rows+=("$1") ;;
  esac
  shift
done
[ ${#rows[@]} -gt 0 ] || rows=("${ROWS[@]}")
rm -rf "$WORK" && mkdir -p "$WORK"

# requirements-dev.txt's pins but jax's, as constraints (no extras there).
grep -vE '^\s*(#|$)|^(jax|jaxlib)[=<> ]|\[' requirements-dev.txt \
  | sed 's/\s*#.*//' > "$WORK/constraints.txt"
pin() { grep -E "^$1==" requirements-dev.txt | sed 's/\s*#.*//'; }

# find_python X.Y: one that runs (a pyenv shim may name one it cannot).
find_python() {
  local c
  for c in "$(command -v "python$1" 2>/dev/null)" \
           $(ls -d "$HOME"/.pyenv/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V -r); do
    [ -n "$c" ] && "$c" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$1'" \
      2>/dev/null && { echo "$c"; return 0; }
  done
  bash scripts/lib/python_from_debian.sh "$1" | tail -1
}

# 1. One interpreter and one wheel per Python, the wheels built side by side.
declare -A python_of wheel_of
for row in "${rows[@]}"; do python_of[${row##*:}]=""; done
for py in "${!python_of[@]}"; do
  python_of[$py]=$(find_python "$py" 2> "$WORK/python-$py.log") ||
    { echo "no Python $py: $(tail -3 "$WORK/python-$py.log")"; python_of[$py]=""; continue; }
  if [ -n "$wheel" ] && [[ $(basename "$wheel") == *-cp${py/./}-* ]]; then
    wheel_of[$py]=$wheel
  else
    wheel_of[$py]=$WORK/dist-$py
    PYTHON=${python_of[$py]} DIST=$WORK/dist-$py WHEEL_ONLY=1 \
      bash scripts/build_wheel.sh > "$WORK/wheel-$py.log" 2>&1 &
  fi
done
wait

# 2. Each row: a fresh venv with the wheel and its JAX, then pytest.
declare -A result
run_row() {
  local jax_v=$1 scope=$2 py=$3 venv="$WORK/jax-$1" whl files=() extra=() st=0 rc
  [ -n "${python_of[$py]}" ] || { result[$1]="no Python $py"; return 1; }
  whl=${wheel_of[$py]}
  [ -f "$whl" ] || whl=$(ls "$whl"/numbax-*manylinux*.whl 2>/dev/null) ||
    { tail -20 "$WORK/wheel-$py.log"; result[$1]="no wheel for Python $py"; return 1; }
  python3 scripts/lib/wheel_tag.py --max 2_28 --arch "$(uname -m)" "$whl" \
    > "$WORK/tag-$jax_v.log" 2>&1 || { result[$1]="wheel tag refused: $(tail -1 "$WORK/tag-$jax_v.log")"; return 1; }
  case "$scope" in
    all*) files=(tests)
          # numbax's numba-cuda-mlir support that needs no GPU (tests/test_mlir.py).
          extra=("numba-cuda-mlir==${MLIR_VERSION:-0.6.0}") ;;
    subset*) files=("${SUBSET[@]}") ;;
    *) result[$1]="unknown scope '$scope' (all or subset, +multigpu)"; return 1 ;;
  esac
  "${python_of[$py]}" -m venv "$venv"
  # --no-compile: the tests write the bytecode of what they import, a fifth
  # of what pip would compile.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
    -c "$WORK/constraints.txt" "$whl[bench,cpu]" "jax==$jax_v" "jaxlib==$jax_v" \
    "$(pin pytest)" "$(pin pytest-xdist)" hypothesis flatbuffers "${extra[@]}" \
    > "$WORK/pip-$jax_v.log" 2>&1 || { tail -20 "$WORK/pip-$jax_v.log"; result[$1]="install failed"; return 1; }
  # No compiler or build tool in the venv: the wheel is all numbax needs.
  ! ls "$venv"/bin/{cmake,ninja} 2>/dev/null || { result[$1]="a build tool in the test venv"; return 1; }
  # From the checkout (src/ never on sys.path): every `import numbax` is the
  # wheel's. Bytecode is written even where PYTHONDONTWRITEBYTECODE is set.
  pytest_in() {  # LOG [ENV...] -- pytest args
    local log=$1 env=(); shift
    while [ "$1" != -- ]; do env+=("$1"); shift; done; shift
    env -u PYTHONDONTWRITEBYTECODE NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu "${env[@]}" \
      "$venv/bin/python" -m pytest -q -rfE -p no:cacheprovider "$@" "${pytest_args[@]}" > "$log" 2>&1
  }
  pytest_in "$WORK/pytest-$jax_v.log" -- -n "$WORKERS" "${files[@]}" || rc=$?
  closing "${rc:-0}" "$WORK/pytest-$jax_v.log" || st=1
  result[$1]="$(cd "$WORK" && "$venv/bin/python" -c "import sys, jax, jaxlib.version, numbax._build_info as b; print(f'Python {sys.version.split()[0]}, jax {jax.__version__} jaxlib {jaxlib.version.__version__}, numbax built against FFI {b.XLA_FFI_API[0]}.{b.XLA_FFI_API[1]}')" 2>&1 | tail -1) [$scope]: $(tail -1 "$WORK/pytest-$jax_v.log")"
  if [[ $scope == *+multigpu ]]; then
    rc=0
    pytest_in "$WORK/multigpu-$jax_v.log" XLA_FLAGS=--xla_force_host_platform_device_count=2 \
      -- -rs -m multigpu -n 2 --dist loadfile \
      $(grep -lE '^[^#]*\bpytest\.mark\.multigpu\b' tests/test_*.py) || rc=$?
    closing "$rc" "$WORK/multigpu-$jax_v.log" || st=1
    result[$1]+="; multigpu dry run (2 fake devices): $(tail -1 "$WORK/multigpu-$jax_v.log")"
  fi
  return $st
}
# closing RC LOG: 0, or 5 with pytest args given; else prints the failures.
closing() {
  [ "$1" = 0 ] || { [ "$1" = 5 ] && [ ${#pytest_args[@]} -gt 0 ]; } && return 0
  { grep -E "^(FAILED|ERROR) " "$2" || tail -30 "$2"; } | head -40
  return 1
}

status=0
for row in "${rows[@]}"; do
  IFS=: read -r jax_v scope py <<< "$row"
  echo "== jax $jax_v, Python $py: $scope (at ${SECONDS} s)"
  run_row "$jax_v" "$scope" "$py" || status=1
done
echo "== wheel matrix (at ${SECONDS} s)"
for row in "${rows[@]}"; do echo "  jax ${row%%:*}: ${result[${row%%:*}]}"; done
exit $status
