#!/usr/bin/env bash
# Runs the `gpu` tests under NVIDIA compute-sanitizer, one part per call so
# that each fits a time limit, and prints each tool's summary line last.
#
#   bash scripts/sanitizer_check.sh memcheck K/N   # memcheck, part K of N of the gpu suite
#   bash scripts/sanitizer_check.sh racecheck      # kernel and capture gpu tests
#   bash scripts/sanitizer_check.sh synccheck      # kernel and capture gpu tests
#   bash scripts/sanitizer_check.sh list N         # which test files each part runs
#   bash scripts/sanitizer_check.sh all N          # all of the above at once, memcheck in N parts
#
# Environment as scripts/gpu_check.sh: it reuses the numbax that gpu_check.sh
# installed in /tmp/numbax-site, or builds it there the same way. Extra
# pytest arguments go after `--`. SANITIZER_FILES runs these test files
# instead of a part; SANITIZER_TIMEOUT (seconds) bounds each run;
# SANITIZER_K is the -k expression; SANITIZER_BACKTRACE the tool's
# --show-backtrace (device by default: see below). Logs go to $OUT (default
# /tmp/numbax-sanitizer). Exit status: 0 only if the tests passed and the
# tool reported nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
unset NUMBA_ENABLE_CUDASIM
OUT=${OUT:-/tmp/numbax-sanitizer}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
site=/tmp/numbax-site

tool=${1:-}
[ $# -gt 0 ] && shift
part=1/1
if [ $# -gt 0 ] && [ "$1" != "--" ]; then part=$1; shift; fi
[ "${1:-}" = "--" ] && shift
pytest_args=("$@")

# racecheck and synccheck check shared-memory and barrier use, which only
# kernels launched by the kernel and capture paths exercise.
kernel_files="tests/test_kernel.py tests/test_capture.py"

files_of_part() {  # K/N: every Nth file holding `gpu` tests, from the Kth
  grep -lE '^[^#]*\bpytest\.mark\.gpu\b' tests/test_*.py | awk -v n="${1#*/}" -v k="${1%/*}" 'NR % n == k % n'
}

# numbax in $site: kept from an earlier run, else installed as
# scripts/gpu_check.sh does (scripts/lib/install_site.sh).
. scripts/lib/install_site.sh
ensure_numbax() {
  # From $site itself, not a numbax the Python environment has.
  PYTHONPATH="$site" $PY -c "import numbax, sys; sys.exit(not numbax.__file__.startswith('$site/'))" \
    2>/dev/null && return 0
  # A part started by `all` never installs: its siblings use $site.
  [ -z "${NUMBAX_SANITIZER_PART:-}" ] || { echo "numbax does not import from $site" >&2; exit 1; }
  echo "== install (into $site)"
  rm -rf "$site" && mkdir -p "$site"
  install_deps "$site" || exit 1
  install_numbax "$site" "$OUT/build.log" || exit 1
}

case "$tool" in
  all)
    # Every part of memcheck, racecheck and synccheck at once, as separate
    # processes (the tools slow the GPU work, not the CPU-bound compiles,
    # so on a machine with cores to spare this divides the wall time).
    [ -z "${SANITIZER_FILES:-}" ] || { echo "'all' runs the parts; unset SANITIZER_FILES" >&2; exit 2; }
    n=${part%/*}; [ "$part" = "1/1" ] && n=4
    ensure_numbax  # once, before the parts start; they only check it
    rm -f "$OUT"/run-*.txt
    pids=() runs=()
    for k in $(seq 1 "$n"); do
      runs+=("$OUT/run-memcheck-$k-of-$n.txt")
      NUMBAX_SANITIZER_PART=1 bash "$0" memcheck "$k/$n" -- "${pytest_args[@]}" > "${runs[-1]}" 2>&1 &
      pids+=($!)
    done
    for t in racecheck synccheck; do
      runs+=("$OUT/run-$t.txt")
      NUMBAX_SANITIZER_PART=1 bash "$0" "$t" -- "${pytest_args[@]}" > "${runs[-1]}" 2>&1 &
      pids+=($!)
    done
    worst=0
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}"; st=$?
      [ "$st" = 0 ] || worst=$st
      # Printed as each run ends, so a limit on the whole keeps what ended.
      if grep -q '^ran in ' "${runs[$i]}"; then
        sed -n '/^ran in /,$p' "${runs[$i]}"
      else
        echo "== $(basename "${runs[$i]}" .txt): no summary (exit $st)"; tail -3 "${runs[$i]}"
      fi
    done
    exit "$worst" ;;
  list)
    n=${part%/*}; [ "$part" = "1/1" ] && n=1
    for k in $(seq 1 "$n"); do echo "part $k/$n: $(files_of_part "$k/$n" | xargs)"; done
    exit 0 ;;
  memcheck)
    case "$part" in */*) ;; *) echo "part must be K/N, e.g. 1/4" >&2; exit 2 ;; esac
    files=$(files_of_part "$part")
    # XLA's allocator hands out slices of one pool, so memcheck could not
    # see a write past one buffer into the next; one allocation per buffer
    # lets it.
    export XLA_PYTHON_CLIENT_ALLOCATOR=platform
    # cuda-bindings probes driver entry points with cuGetProcAddress and
    # gets CUDA_ERROR_INVALID_VALUE for absent ones: API return codes, not
    # memory errors (docs/reliability.md).
    tool_args=(--tool memcheck --report-api-errors no --leak-check no) ;;
  racecheck)
    files=$kernel_files
    tool_args=(--tool racecheck --racecheck-report all) ;;
  synccheck)
    files=$kernel_files
    tool_args=(--tool synccheck) ;;
  *)
    sed -n '2,18p' "$0"; exit 2 ;;
esac
# SANITIZER_FILES: run these test files instead (e.g. to re-run one file
# of a part that ran out of time).
files=${SANITIZER_FILES:-$files}
[ -n "$files" ] || { echo "no test files in part $part" >&2; exit 2; }

SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[ -x "$SAN" ] || { echo "compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2; exit 2; }

ensure_numbax
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

tag=${part//\//of}
[ -n "${SANITIZER_FILES:-}" ] && tag=$(basename "${SANITIZER_FILES%% *}" .py)
log="$OUT/$tool-$tag.log"
echo "== $tool ${part} over: $(echo $files | xargs)"
t0=$(date +%s)
# --target-processes all: several tests run numbax in child interpreters.
# -k: test_faults' device_fault tests write far out of bounds on purpose
# (to check that a fault surfaces as an error); memcheck reports exactly
# those writes. SANITIZER_K="" includes them.
# A test that stops making progress writes every thread's Python stack to
# the stalls file (tests/conftest.py), every NUMBAX_TEST_STALL_S seconds.
export NUMBAX_TEST_STALL_S=${NUMBAX_TEST_STALL_S:-120}
export NUMBAX_TEST_STALL_FILE="$OUT/stalls-$tool-$tag.txt"
rm -f "$NUMBAX_TEST_STALL_FILE"
# --show-backtrace device: with host backtraces on, the tool takes the GIL
# inside driver calls to record Python stacks. A launch made with the GIL
# released (numbax's fast path, as Numba's) then waits for the GIL while
# holding the driver's lock, and a thread that holds the GIL and waits for
# that lock (XLA freeing a buffer) deadlocks with it: seen on the H200 in
# test_threads_share_plans (2026-11-30). Those stacks also hold references
# to func's arrays for a while, which numbax's kept-array check counts.
# SANITIZER_BACKTRACE=yes restores them.
timeout -k 30 "${SANITIZER_TIMEOUT:-0}" "$SAN" "${tool_args[@]}" \
  --show-backtrace "${SANITIZER_BACKTRACE:-device}" \
  --target-processes all --error-exitcode 99 \
  --print-limit 50 \
  $PY -m pytest -m gpu -q -p no:cacheprovider $files \
  -k "${SANITIZER_K-not device_fault}" \
  "${pytest_args[@]}" > "$log" 2>&1
status=$?
echo "ran in $(( $(date +%s) - t0 ))s, exit $status; log: $log"
echo "== summary ($tool $part)"
grep -E "^[0-9]+ (passed|failed)|passed|failed|error" "$log" | grep -E " in [0-9.]+s" | tail -1
grep -E "(ERROR|RACECHECK) SUMMARY" "$log" | sort | uniq -c
# Tests that ran past NUMBAX_TEST_STALL_S: their stacks are in the file.
if grep -q "^Thread\|^Current thread" "$NUMBAX_TEST_STALL_FILE" 2>/dev/null; then
  echo "stacks of tests that ran over ${NUMBAX_TEST_STALL_S}s: $NUMBAX_TEST_STALL_FILE"
fi
exit $status
