#!/usr/bin/env bash
# Tests numbax's release wheel, not the source tree, at both ends of what
# numbax declares: the oldest and newest supported JAX, and the oldest and
# newest supported Python, each in a fresh venv with no build tools.
#
#   bash scripts/wheel_matrix.sh [--wheel PATH] [ROW...] [-- pytest args]
#
# ROW is JAX_VERSION:SCOPE:PYTHON. SCOPE is all (every test file) or subset
# (SUBSET, below: what a JAX or Python release can break), either optionally
# followed by +multigpu: the `multigpu` tests' dry run on 2 fake CPU devices
# too. PYTHON is found as pythonX.Y on PATH or under ~/.pyenv/versions, else
# Debian's build is fetched (scripts/lib/python_from_debian.sh: how 3.14
# comes to this machine). Default: ROWS, each end of the supported Python
# (3.11, 3.14) and JAX (0.8.1, 0.12) range and the GPU machine's jax 0.11.2,
# on two Pythons, so one wheel per Python is built (3.12 and 3.13 run in the
# release workflow). --wheel names the wheel for rows of its Python; the
# others are built here (scripts/build_wheel.sh), each Python's beside the
# others. Every wheel must be tagged manylinux_2_28 or lower for this
# machine (scripts/lib/wheel_tag.py), or its rows fail.
#
# Each row runs its files in one pytest process whose tests pytest-xdist
# spreads over MATRIX_WORKERS workers (default: the cores). The multigpu
# dry run is a pytest run of its own: XLA_FLAGS must be set before JAX
# starts (tests/conftest.py). Needs PyPI access (each venv installs its JAX).
# NUMBAX_MATRIX_DIR (default /tmp/numbax-matrix) keeps the venvs and logs.
# The last lines are each row's pytest closing line; the exit status is 1
# if any row failed or ran no test.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=("0.10.2:all:3.11" "0.8.1:subset:3.11"
      "0.11.2:subset+multigpu:3.14" "0.12.0.1:subset:3.14")
# test_scale_out.py and test_sharding.py: XLA's partitioning of numbax ops is
# what a JAX release changes most readily (Shardy chose other shardings in
# 0.12 than in 0.10), so every row runs them.
SUBSET=(tests/test_callable.py tests/test_kernel.py tests/test_custom_kernel.py
        tests/test_export.py tests/test_versions.py tests/test_scale_out.py
        tests/test_sharding.py tests/test_numba_kernel.py
        tests/test_numba_kernel_vmap.py tests/test_numba_kernel_errors.py)
WORK=${NUMBAX_MATRIX_DIR:-/tmp/numbax-matrix}
WORKERS=${MATRIX_WORKERS:-$(nproc 2>/dev/null || echo 2)}

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

# Pins for everything but jax/jaxlib (requirements-dev.txt, as constraints:
# pip refuses extras there).
grep -vE '^\s*(#|$)|^(jax|jaxlib)[=<> ]|\[' requirements-dev.txt \
  | sed 's/\s*#.*//' > "$WORK/constraints.txt"
pin() { grep -E "^$1==" requirements-dev.txt | sed 's/\s*#.*//'; }

# find_python X.Y: a runnable interpreter of that version (a pyenv shim on
# PATH may name one it cannot run, so each candidate is tried), else
# Debian's.
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
  # From the checkout, with numbax's sources under src/ (never on sys.path):
  # every `import numbax`, the tests' subprocesses' too, is the wheel's.
  # Bytecode is written even where PYTHONDONTWRITEBYTECODE is set.
  pytest_in() {  # LOG [ENV...] -- pytest args
    local log=$1 env=(); shift
    while [ "$1" != -- ]; do env+=("$1"); shift; done; shift
    env -u PYTHONDONTWRITEBYTECODE NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu "${env[@]}" \
      "$venv/bin/python" -m pytest -q -rfE -p no:cacheprovider "$@" "${pytest_args[@]}" > "$log" 2>&1
  }
  pytest_in "$WORK/pytest-$jax_v.log" -- -n "$WORKERS" "${files[@]}" || rc=$?
  closing "${rc:-0}" "$WORK/pytest-$jax_v.log" || st=1
  result[$1]="$(versions "$venv") [$scope]: $(tail -1 "$WORK/pytest-$jax_v.log")"
  if [[ $scope == *+multigpu ]]; then
    rc=0
    pytest_in "$WORK/multigpu-$jax_v.log" XLA_FLAGS=--xla_force_host_platform_device_count=2 \
      -- -rs -m multigpu -n "$WORKERS" --dist loadfile \
      $(grep -lE '^[^#]*\bpytest\.mark\.multigpu\b' tests/test_*.py) || rc=$?
    closing "$rc" "$WORK/multigpu-$jax_v.log" || st=1
    result[$1]+="; multigpu dry run (2 fake devices): $(tail -1 "$WORK/multigpu-$jax_v.log")"
  fi
  return $st
}
# closing RC LOG: pytest's status, 5 (no test selected) a failure unless
# pytest args were given; a failing run's failures are printed.
closing() {
  [ "$1" = 0 ] || { [ "$1" = 5 ] && [ ${#pytest_args[@]} -gt 0 ]; } && return 0
  grep -E "^(FAILED|ERROR) " "$2" | head -40 || tail -30 "$2"
  return 1
}
versions() {
  (cd "$WORK" && "$1/bin/python" -c "import sys, jax, jaxlib.version, numbax._build_info as b; print(f'Python {sys.version.split()[0]}, jax {jax.__version__} jaxlib {jaxlib.version.__version__}, numbax built against FFI {b.XLA_FFI_API[0]}.{b.XLA_FFI_API[1]}')" 2>&1 | tail -1)
}

status=0
for row in "${rows[@]}"; do
  IFS=: read -r jax_v scope py <<< "$row"
  echo "== jax $jax_v, Python $py: $scope (at ${SECONDS} s)"
  run_row "$jax_v" "$scope" "$py" || status=1
done
echo "== wheel matrix (at ${SECONDS} s)"
for row in "${rows[@]}"; do
  jax_v=${row%%:*}
  echo "  jax $jax_v: ${result[$jax_v]}"
done
exit $status
