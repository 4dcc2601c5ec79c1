#!/usr/bin/env bash
# Runs the `gpu` tests under NVIDIA compute-sanitizer, one part per call so
# that each fits a time limit, and prints each tool's summary line last.
#
#   bash scripts/sanitizer_check.sh memcheck K/N   # memcheck, part K of N of the gpu suite
#   bash scripts/sanitizer_check.sh racecheck      # kernel and capture gpu tests
#   bash scripts/sanitizer_check.sh synccheck      # kernel and capture gpu tests
#   bash scripts/sanitizer_check.sh list N         # which test files each part runs
#
# Environment as scripts/gpu_check.sh: it reuses the numbax that gpu_check.sh
# installed in /tmp/numbax-site, or builds it there the same way. Extra
# pytest arguments go after `--`. Logs go to $OUT (default
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

# Test files that hold `gpu` tests, in a fixed order. racecheck and
# synccheck check shared-memory and barrier use, which only kernels
# launched by the kernel and capture paths exercise.
all_files() { grep -l "mark.gpu" tests/test_*.py | sort; }
kernel_files="tests/test_kernel.py tests/test_capture.py"

files_of_part() {  # K/N: every N-th file starting at K (round robin)
  local k=${1%/*} n=${1#*/} i=0 f
  for f in $(all_files); do
    i=$(( i + 1 ))
    [ $(( (i - 1) % n + 1 )) -eq "$k" ] && echo "$f"
  done
}

case "$tool" in
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
    sed -n '2,15p' "$0"; exit 2 ;;
esac
[ -n "$files" ] || { echo "no test files in part $part" >&2; exit 2; }

SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[ -x "$SAN" ] || { echo "compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2; exit 2; }

if ! PYTHONPATH="$site" $PY -c "import numbax" 2>/dev/null; then
  echo "== build (into $site)"
  rm -rf "$site" && mkdir -p "$site"
  if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
  fi
  $PY -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" . \
    > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

log="$OUT/$tool-${part//\//of}.log"
echo "== $tool ${part} over: $(echo $files | xargs)"
t0=$(date +%s)
# --target-processes all: several tests run numbax in child interpreters.
# -k: the recorded runs (docs/reliability.md) left bfloat16 out; override
# with SANITIZER_K="" to include it.
"$SAN" "${tool_args[@]}" --target-processes all --error-exitcode 99 \
  --print-limit 50 \
  $PY -m pytest -m gpu -q -p no:cacheprovider $files \
  -k "${SANITIZER_K-not bfloat16}" \
  "${pytest_args[@]}" > "$log" 2>&1
status=$?
echo "ran in $(( $(date +%s) - t0 ))s, exit $status; log: $log"
echo "== summary ($tool $part)"
grep -E "^[0-9]+ (passed|failed)|passed|failed|error" "$log" | grep -E " in [0-9.]+s" | tail -1
grep -E "(ERROR|RACECHECK) SUMMARY" "$log" | sort | uniq -c
exit $status
