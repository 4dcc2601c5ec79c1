#!/usr/bin/env bash
# Tests numbax's release wheel, not the source tree, at both ends of what
# numbax declares: the oldest and newest supported JAX, and the oldest and
# newest supported Python, each in a fresh venv with no build tools. One row
# runs every test file; the others a subset that covers what a JAX or
# Python release can break (the FFI targets and their registration, the
# callable, the kernel, XLACustomKernel, export, vmap, versions, XLA's
# partitioning of numbax ops).
#
#   bash scripts/wheel_matrix.sh [--wheel PATH] [--wheel-from X.Y:FILE]
#                                [ROW...] [-- pytest args]
#
# ROW is JAX_VERSION:SCOPE[:PYTHON]; SCOPE is all (every test file: the
# files are found by globbing tests/, scripts/lib/test_parts.py) or subset
# (SUBSET, below), either optionally followed by +multigpu, which also runs
# the `multigpu` tests (collected but skipped in the other runs, which have
# one CPU device) as their dry run on 2 fake CPU devices:
# XLA_FLAGS=--xla_force_host_platform_device_count=2 (tests/conftest.py;
# about a minute). PYTHON is a version (3.12) found as pythonX.Y on PATH or
# under ~/.pyenv/versions, else Debian's build of it fetched once by
# scripts/lib/python_from_debian.sh (how Python 3.14 comes to this machine)
# (default: the PYTHON variable, else python3). Default rows: see
# DEFAULT_ROWS: each end of the supported Python (3.11, 3.14) and JAX (0.8.1,
# 0.12) range, and the GPU machine's jax 0.11.2, on two Pythons only (one
# wheel to build besides the one test.sh's setup builds: .ci/run stays
# within 10 minutes; 3.12 and 3.13 run in the release workflow, 3.12 on the
# GPU too). Every wheel a row tests must be tagged manylinux_2_28 or lower
# for this machine's architecture (scripts/lib/wheel_tag.py), or the row
# fails.
#
# The work is a set of jobs run MATRIX_JOBS at a time (default: one more
# than the number of cores), each as soon as what it needs is done, the longest first: the
# wheel of each Python (--wheel names the wheel for rows of the Python that
# built it; --wheel-from X.Y:FILE says another process is building the
# wheel for Python X.Y and will write its path to FILE, or an empty FILE if
# that failed, as test.sh does for the wheel scripts/setup.sh builds; the
# wheels of other Pythons are built here by scripts/build_wheel.sh), each
# row's venv, and the row's pytest runs: an `all` row's files in
# MATRIX_PARTS parts of about equal time (default: the number of cores;
# scripts/lib/test_parts.py, by the times in scripts/lib/test_times.json),
# so that no single long process keeps one core busy alone at the end. On 2
# cores the matrix takes about 7 minutes (scripts/test.sh runs it beside
# the C++ tests, lint and fuzzing). Needs PyPI access (each venv installs
# its JAX). NUMBAX_MATRIX_DIR (default /tmp/numbax-matrix) holds the venvs,
# the logs and JUnit XML of every pytest run (scripts/lib/test_parts.py
# update $NUMBAX_MATRIX_DIR/junit-*.xml refreshes the times).
set -euo pipefail
cd "$(dirname "$0")/.."
DEFAULT_PY=${PYTHON:-python3}
DEFAULT_ROWS=("0.10.2:all:3.11" "0.8.1:subset:3.11"
              "0.11.2:subset+multigpu:3.14" "0.12.0.1:subset:3.14")
# test_scale_out.py and test_sharding.py: XLA's partitioning of numbax ops
# (fake devices in processes of their own, and two jax.distributed
# processes) is what a JAX release changes most readily (Shardy chose other
# shardings in 0.12 than in 0.10), so every row runs them (about 40 s).
SUBSET=(tests/test_callable.py tests/test_kernel.py tests/test_custom_kernel.py
        tests/test_export.py tests/test_versions.py tests/test_scale_out.py
        tests/test_sharding.py tests/test_numba_kernel.py
        tests/test_numba_kernel_vmap.py tests/test_numba_kernel_errors.py)
WORK=${NUMBAX_MATRIX_DIR:-/tmp/numbax-matrix}
CORES=$(nproc 2>/dev/null || echo 2)
# One job more than the cores: a pytest run keeps about 80% of a core busy
# (it waits for its subprocesses, and the simulator's threads for each
# other), so two left a fifth of 2 cores idle; a third fills that in.
JOBS=${MATRIX_JOBS:-$((CORES + 1))}
PARTS=${MATRIX_PARTS:-$CORES}

wheel="" wheel_from="" rows=() pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=$2; shift ;;
    --wheel-from) wheel_from=$2; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    *) rows+=("$1") ;;
  esac
  shift
done
[ ${#rows[@]} -gt 0 ] || rows=("${DEFAULT_ROWS[@]}")
mkdir -p "$WORK"
rm -f "$WORK"/result-* "$WORK"/python-* "$WORK"/wheel-* "$WORK"/parts-* \
      "$WORK"/pytest-*.log "$WORK"/junit-*.xml "$WORK"/job-*.log "$WORK"/cpu-*

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

given_py=""
if [ -n "$wheel" ]; then
  wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
  tag=$(basename "$wheel" | cut -d- -f3)             # cp311
  given_py="${tag:2:1}.${tag:3}"
fi
from_py=${wheel_from%%:*} from_file=${wheel_from#*:}

# ---------------------------------------------------------------------------
# The jobs. Each runs in a subshell of its own, with its output in
# $WORK/job-NAME.log; what later jobs need goes through files in $WORK.

# job_wheel X.Y: the interpreter ($WORK/python-X.Y) and the wheel
# ($WORK/wheel-X.Y) of that Python: given, awaited or built.
job_wheel() {
  local want=$1 exe built
  exe=$(find_python "$want") ||
    exe=$(bash scripts/lib/python_from_debian.sh "$want" | tail -1) ||
    { echo "no Python $want found (pyenv install $want)"; return 1; }
  echo "$exe" > "$WORK/python-$want"
  if [ "$want" = "$given_py" ]; then
    built=$wheel
  elif [ "$want" = "$from_py" ]; then
    # Another process builds it (test.sh: scripts/setup.sh): this job only
    # waits, holding a slot for the cores that build uses.
    echo "waiting for the wheel for Python $want ($from_file)"
    while [ ! -f "$from_file" ]; do sleep 1; done
    built=$(cat "$from_file")
    [ -n "$built" ] && [ -f "$built" ] || { echo "no wheel for Python $want: its build failed"; return 1; }
    built=$(cd "$(dirname "$built")" && pwd)/$(basename "$built")
  else
    echo "build: the release wheel for Python $want (scripts/build_wheel.sh)"
    built=$(PYTHON="$exe" DIST="build/dist-py$want-$BASHPID" WHEEL_ONLY=1 \
            bash scripts/build_wheel.sh) || return 1
    built=$(pwd)/$built
  fi
  echo "$built" > "$WORK/wheel-$want"
}

# job_venv JAX_VERSION SCOPE X.Y: the wheel's tag checked, a fresh venv with
# the wheel and that JAX, no build tool in it.
job_venv() {
  local jax_v=$1 scope=$2 want=$3 venv="$WORK/jax-$1" exe whl tool extra=()
  exe=$(cat "$WORK/python-$want") whl=$(cat "$WORK/wheel-$want")
  if ! python3 scripts/lib/wheel_tag.py --max 2_28 --arch "$(uname -m)" "$whl" \
      > "$WORK/tag-$jax_v.log" 2>&1; then
    cat "$WORK/tag-$jax_v.log"
    echo "jax $jax_v, Python $want: wheel tag refused: $(tail -1 "$WORK/tag-$jax_v.log")" > "$WORK/result-$jax_v"
    return 1
  fi
  # The all rows also check numbax's numba-cuda-mlir support that needs no
  # GPU (tests/test_mlir.py). Without its CUDA extras it adds only
  # typing-extensions to what numba-cuda brings (the pins still hold).
  case "$scope" in all*) extra=("numba-cuda-mlir==${MLIR_VERSION:-0.6.0}") ;; esac
  rm -rf "$venv"
  "$exe" -m venv "$venv"
  # --no-compile: the tests write the bytecode of what they import (job_test),
  # a fifth of what pip would compile (all of jax, scipy, numba, matplotlib):
  # about 12 s of CPU less per venv.
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
      -c "$WORK/constraints.txt" "$whl[bench,cpu]" "jax==$jax_v" "jaxlib==$jax_v" \
      pytest hypothesis flatbuffers "${extra[@]}" > "$WORK/pip-$jax_v.log" 2>&1; then
    tail -20 "$WORK/pip-$jax_v.log"
    echo "jax $jax_v, Python $want: install failed (see $WORK/pip-$jax_v.log)" > "$WORK/result-$jax_v"
    return 1
  fi
  # No compiler or build tool in the venv: the wheel is all numbax needs.
  for tool in cmake ninja; do
    if [ -e "$venv/bin/$tool" ]; then
      echo "jax $jax_v: unexpected: $tool in the test venv" > "$WORK/result-$jax_v"; return 1
    fi
  done
}

# job_test JAX_VERSION PART: pytest on the files in $WORK/parts-JAX-PART
# (PART multigpu: the multigpu tests' dry run on 2 fake CPU devices).
# From the checkout: numbax lives under src/, never on sys.path here, so
# every `import numbax` (the tests' subprocesses too) is the installed wheel.
job_test() {
  local jax_v=$1 part=$2 venv="$WORK/jax-$1" files=() env=() opts=()
  read -r -a files < "$WORK/parts-$jax_v-$part"
  if [ "$part" = multigpu ]; then
    env=(XLA_FLAGS=--xla_force_host_platform_device_count=2)
    opts=(-rs -m multigpu)
  fi
  # Bytecode is written (even where PYTHONDONTWRITEBYTECODE is set, as on
  # this project's machines): the venv has none (job_venv), and the first
  # process to import a module compiles it for all the others.
  env -u PYTHONDONTWRITEBYTECODE NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu "${env[@]}" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${opts[@]}" \
    --junitxml="$WORK/junit-$jax_v-$part.xml" "${files[@]}" "${pytest_args[@]}" \
    > "$WORK/pytest-$jax_v-$part.log" 2>&1
}

# ---------------------------------------------------------------------------
# The plan: every job with what it needs and its estimated seconds.
declare -A job_cmd job_deps job_state job_t0 job_est
order=()
add_job() {  # NAME "DEPS" SECONDS COMMAND...
  local name=$1 deps=$2 est=$3; shift 3
  order+=("$name"); job_deps[$name]=$deps job_est[$name]=$est
  job_cmd[$name]="$*" job_state[$name]=pending
}
# Files with a real multigpu marker (decorator, pytestmark or marks=).
multigpu_files=$(grep -lE '^[^#]*\bpytest\.mark\.multigpu\b' tests/test_*.py | tr '\n' ' ' || true)
# The multigpu dry run's time, for ordering only (about a minute).
MULTIGPU_EST=60

declare -A wheel_job
row_jobs=() test_jobs=()
for row in "${rows[@]}"; do
  IFS=: read -r jax_v scope want <<< "$row"
  [ -n "$want" ] || want=$(py_version "$DEFAULT_PY")
  if [ -z "${wheel_job[$want]:-}" ]; then
    wheel_job[$want]=wheel-$want
    add_job "wheel-$want" "" 0 job_wheel "$want"
  fi
  multigpu=0
  case "$scope" in *+multigpu) multigpu=1; scope=${scope%+multigpu} ;; esac
  case "$scope" in
    all) python3 scripts/lib/test_parts.py parts "$PARTS" > "$WORK/parts-$jax_v" ;;
    subset) echo "${SUBSET[*]}" > "$WORK/parts-$jax_v" ;;
    *) echo "jax $jax_v: unknown scope '$scope' (all or subset, +multigpu)"; exit 2 ;;
  esac
  k=0 row_est=0
  while read -r line; do
    [ -n "$line" ] || continue
    k=$((k + 1)); echo "$line" > "$WORK/parts-$jax_v-$k"
    # shellcheck disable=SC2086
    est=$(python3 scripts/lib/test_parts.py seconds $line)
    test_jobs+=("$est test-$jax_v-$k $jax_v $k"); row_est=$((row_est + est))
  done < "$WORK/parts-$jax_v"
  if [ "$multigpu" = 1 ]; then
    echo "$multigpu_files" > "$WORK/parts-$jax_v-multigpu"
    test_jobs+=("$MULTIGPU_EST test-$jax_v-multigpu $jax_v multigpu")
    row_est=$((row_est + MULTIGPU_EST))
  fi
  row_jobs+=("$row_est venv-$jax_v $jax_v $scope $want")
done
# The wheels first (everything waits for them), then the venvs of the
# longest rows, then the pytest runs, longest first, so the short ones fill
# in at the end.
while read -r est name jax_v scope want; do
  add_job "$name" "${wheel_job[$want]}" "$est" job_venv "$jax_v" "$scope" "$want"
done < <(printf '%s\n' "${row_jobs[@]}" | sort -k1,1nr)
while read -r est name jax_v part; do
  add_job "$name" "venv-$jax_v" "$est" job_test "$jax_v" "$part"
done < <(printf '%s\n' "${test_jobs[@]}" | sort -k1,1nr)

# cpu_seconds FILE: user + sys of the children in the output of `times`.
cpu_seconds() {
  tail -1 "$1" 2>/dev/null | tr 'ms' '  ' |
    awk '{ printf "%.0f", $1 * 60 + $2 + $3 * 60 + $4 } END { if (NR == 0) printf "?" }'
}

# run_jobs: starts each pending job whose dependencies are done, JOBS at a
# time, in the order of the plan; a job whose dependency failed is skipped.
run_jobs() {
  local -A pid_of=()
  local name d ready done_pid rc st=0
  while :; do
    for name in "${order[@]}"; do
      [ "${job_state[$name]}" = pending ] || continue
      ready=1
      for d in ${job_deps[$name]}; do
        case "${job_state[$d]}" in
          ok) ;;
          failed|skipped) ready=skip; break ;;
          *) ready=0 ;;
        esac
      done
      if [ "$ready" = skip ]; then
        job_state[$name]=skipped; echo "== $name: not run (a job it needs failed)"; st=1; continue
      fi
      [ "$ready" = 1 ] && [ ${#pid_of[@]} -lt "$JOBS" ] || continue
      echo "== $name: start (at ${SECONDS} s)"
      # The CPU time of all the job ran, from `times` as it exits.
      ( trap 'times > "$WORK/cpu-$name"' EXIT; ${job_cmd[$name]} ) > "$WORK/job-$name.log" 2>&1 &
      pid_of[$!]=$name job_state[$name]=running job_t0[$name]=$SECONDS
    done
    [ ${#pid_of[@]} -gt 0 ] || break
    rc=0; wait -n -p done_pid || rc=$?
    name=${pid_of[$done_pid]}; unset "pid_of[$done_pid]"
    took="took $((SECONDS - job_t0[$name])) s, $(cpu_seconds "$WORK/cpu-$name") s of CPU"
    if [ "$rc" = 0 ]; then
      job_state[$name]=ok
      echo "== $name: done (at ${SECONDS} s, $took)"
    else
      job_state[$name]=failed st=1
      echo "== $name: FAILED (at ${SECONDS} s, $took)"
      case "$name" in test-*) ;; *) tail -20 "$WORK/job-$name.log" ;; esac
    fi
  done
  return $st
}

echo "== wheel matrix: ${#rows[@]} rows, ${#order[@]} jobs, $JOBS at a time"
status=0
run_jobs || status=1

# One line per row: what ran, and pytest's counts summed over its runs.
echo "== wheel matrix"
for row in "${rows[@]}"; do
  IFS=: read -r jax_v scope want <<< "$row"
  [ -n "$want" ] || want=$(py_version "$DEFAULT_PY")
  [ -f "$WORK/result-$jax_v" ] && continue  # a venv job said why it failed
  if [ "${job_state[venv-$jax_v]}" != ok ]; then
    echo "jax $jax_v, Python $want: no venv (see $WORK/job-wheel-$want.log and job-venv-$jax_v.log)" > "$WORK/result-$jax_v"
    continue
  fi
  logs=()
  for f in "$WORK/parts-$jax_v"-*; do
    p=${f##*-}; [ "$p" = multigpu ] || logs+=("$WORK/pytest-$jax_v-$p.log")
  done
  summary=$(python3 - "${logs[@]}" <<'EOF'
import re, sys
counts, secs, bad = {}, 0.0, []
for path in sys.argv[1:]:
    try:
        last = open(path).read().rstrip().splitlines()[-1]
    except (OSError, IndexError):
        last = ""
    m = re.search(r" in ([0-9.]+)s", last)
    if not m:
        bad.append(f"{path}: no pytest summary")
        continue
    secs = max(secs, float(m.group(1)))
    for n, word in re.findall(r"(\d+) (\w+)", last[: m.start()]):
        counts[word] = counts.get(word, 0) + int(n)
order = ["failed", "errors", "error", "passed", "skipped", "deselected", "xfailed", "xpassed", "warnings", "warning"]
text = ", ".join(f"{counts[w]} {w}" for w in sorted(counts, key=lambda w: (order.index(w) if w in order else 99, w)))
parts = len(sys.argv) - 1
print(f"{text} in {secs:.0f} s ({parts} pytest run{'s' if parts > 1 else ''} beside each other)" + "".join("; " + b for b in bad))
EOF
)
  dry=""
  if [ -f "$WORK/parts-$jax_v-multigpu" ]; then
    dry="; multigpu dry run (2 fake devices): $(tail -1 "$WORK/pytest-$jax_v-multigpu.log" 2>/dev/null || echo "did not run")"
  fi
  versions=$(cd "$WORK" && "$WORK/jax-$jax_v/bin/python" -c "import sys, jax, jaxlib.version, numpy, numbax._build_info as b; print(f'Python {sys.version.split()[0]}, jax {jax.__version__} jaxlib {jaxlib.version.__version__} numpy {numpy.__version__}, numbax built against FFI {b.XLA_FFI_API[0]}.{b.XLA_FFI_API[1]} ({b.XLA_FFI_HEADERS_FROM})')" 2>&1 | tail -1)
  echo "$versions, wheel $(head -1 "$WORK/tag-$jax_v.log" 2>/dev/null) [$scope]: $summary$dry" > "$WORK/result-$jax_v"
done
for row in "${rows[@]}"; do
  IFS=: read -r jax_v _ _ <<< "$row"
  # Failures first, in full, so CI's log shows them.
  if ! grep -qE ' passed' "$WORK/result-$jax_v" 2>/dev/null || grep -qE 'failed|error|no pytest summary|did not run' "$WORK/result-$jax_v"; then
    grep -hE "^(FAILED|ERROR)" "$WORK/pytest-$jax_v"-*.log 2>/dev/null | head -40 || true
    status=1
  fi
done
for row in "${rows[@]}"; do
  IFS=: read -r jax_v _ _ <<< "$row"
  echo "  $(cat "$WORK/result-$jax_v" 2>/dev/null || echo "jax $jax_v: no result")"
done
exit $status
