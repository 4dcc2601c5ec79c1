#!/usr/bin/env bash
# The GPU check, in one call on a GPU machine with no network: installs the
# numbax release wheel that users install (built here by
# scripts/gpu_bundle.sh and carried in .whl/), runs the whole `gpu` test
# suite against it (every example included: tests/test_examples.py), the
# `multigpu` tests when the machine has 2 or more GPUs, then the benchmark
# suite (`python -m numbax bench`), and prints a short table last.
#
#   bash scripts/gpu_check.sh [--no-bench] [--quick] [--source] [-- pytest args]
#
# --source builds numbax from this checkout on the machine instead (against
# its jaxlib's FFI headers): a developer's check, not what users get.
# The other wheels in .whl/ (numpy<2.5 for numba-cuda 0.30) are installed
# first. Logs and JSON go to $OUT (default /tmp/numbax-gpu). TEST_TIMEOUT,
# MULTIGPU_TIMEOUT (default: TEST_TIMEOUT) and BENCH_TIMEOUT (seconds,
# default none) bound the gpu tests, the multigpu tests and the benchmarks;
# TEST_SHARDS=N spreads the gpu tests over N pytest-xdist workers;
# BENCH_ARGS adds options to the benchmark run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
unset NUMBA_ENABLE_CUDASIM
OUT=${OUT:-/tmp/numbax-gpu}
mkdir -p "$OUT"
bench=1 quick="" from=wheel
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --quick) quick="--quick" ;;
    --source) from=source ;;
    --) shift; pytest_args=("$@"); break ;;
  esac
  shift
done

PY=${PYTHON:-python3}
site=/tmp/numbax-site
rm -rf "$site" && mkdir -p "$site"
. scripts/lib/install_site.sh
install_deps "$site" || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

echo "== numbax ($from)"
t0=$(date +%s)
install_numbax "$site" "$OUT/build.log" "$from" || exit 1
echo "installed in $(( $(date +%s) - t0 ))s"
# The wheel checked is the one users install: manylinux_2_28 or lower.
if [ "$from" = wheel ]; then
  installed=$(ls "$site"/numbax-*.dist-info/WHEEL)
  py_tag=$(grep -m1 -E '^Tag:' "$installed" | awk '{print $2}' | cut -d- -f1,2)
  plats=$(grep -E '^Tag:' "$installed" | awk '{print $2}' | cut -d- -f3 | paste -sd. -)
  name="numbax-$(basename "$(dirname "$installed")" .dist-info | cut -d- -f2)-$py_tag-$plats.whl"
  echo "wheel: $name"
  $PY scripts/lib/wheel_tag.py --max 2_28 "$name" > /dev/null || exit 1
fi
# Bounded: a hang while JAX starts (as once with jax 0.11's plugin locks)
# must fail the check, not eat the machine's time.
rm -f "$OUT/gpu_count"
OUT="$OUT" timeout 180 $PY - <<'PY' || { echo "numbax or JAX failed to start (status $?)"; exit 1; }
import os, jax, numba, numpy, numbax, importlib.metadata as md
import numbax._build_info as b
print("jax", jax.__version__, "numba", numba.__version__, "numba-cuda",
      md.version("numba-cuda"), "numpy", numpy.__version__, "numbax", numbax.__version__,
      "(XLA FFI API %d.%d, %s)" % (*b.XLA_FFI_API, b.XLA_FFI_HEADERS_FROM),
      "from", os.path.dirname(numbax.__file__))
print("devices", jax.devices())
# JAX's count of GPUs, not nvidia-smi's: it honours CUDA_VISIBLE_DEVICES.
with open(os.path.join(os.environ["OUT"], "gpu_count"), "w") as f:
    f.write(str(sum(d.platform in ("gpu", "cuda") for d in jax.local_devices())))
PY
$PY -m numbax info > "$OUT/info.log" 2>&1
grep -E "^(XLA FFI API|problems)" "$OUT/info.log"

# A build that cannot serve this jaxlib (gpu_bundle.sh compiles one against
# newer FFI headers) must refuse at import, naming both versions.
mismatch_status=0
if compgen -G ".whl/mismatch/numbax-*.whl" > /dev/null; then
  echo "== a deliberately mismatched build"
  rm -rf /tmp/numbax-mismatch
  $PY -m pip install -q --no-index --no-deps --target /tmp/numbax-mismatch .whl/mismatch/numbax-*.whl
  PYTHONPATH=/tmp/numbax-mismatch:$PYTHONPATH $PY -c "import numbax" > "$OUT/mismatch.log" 2>&1
  if [ $? -ne 0 ] && grep -q "ImportError: numbax cannot run here: numbax's extension was compiled against XLA FFI API" "$OUT/mismatch.log"; then
    echo "refused as it must: $(grep -o "ImportError: .*" "$OUT/mismatch.log" | cut -c1-400)"
  else
    echo "NOT refused: $(tail -3 "$OUT/mismatch.log")"; mismatch_status=1
  fi
fi

ngpu=$(cat "$OUT/gpu_count" 2>/dev/null)
case "$ngpu" in ''|*[!0-9]*) ngpu=0 ;; esac

# TEST_SHARDS=N spreads the gpu tests over N pytest-xdist workers (the
# suite is mostly CPU-bound compiles, so this divides its wall time on a
# machine with cores to spare).
shards=${TEST_SHARDS:-1}
case "$shards" in ''|*[!0-9]*|0) shards=1 ;; esac
xdist=()
[ "$shards" = 1 ] || xdist=(-n "$shards")
echo "== gpu tests${xdist[*]:+ ($shards workers)}"
timeout -k 30 "${TEST_TIMEOUT:-0}" $PY -m pytest -m gpu -q -rfE -p no:cacheprovider "${xdist[@]}" \
  tests "${pytest_args[@]}" 2>&1 | tee "$OUT/pytest.log"
test_status=${PIPESTATUS[0]}

# tests/test_multigpu.py and tests/test_multiprocess.py: not marked `gpu`, so
# the run above leaves them out; they need 2 GPUs.
multigpu_status=0
rm -f "$OUT/pytest-multigpu.log"
if [ "$ngpu" -ge 2 ]; then
  echo "== multigpu tests ($ngpu GPUs)"
  timeout "${MULTIGPU_TIMEOUT:-${TEST_TIMEOUT:-0}}" $PY -m pytest -m multigpu -q -rs -p no:cacheprovider tests "${pytest_args[@]}" 2>&1 | tee "$OUT/pytest-multigpu.log"
  multigpu_status=${PIPESTATUS[0]}
  # 5: the extra pytest args selected none of them; not a failure.
  [ "$multigpu_status" = 5 ] && multigpu_status=0
fi

bench_status=0
if [ "$bench" = 1 ]; then
  echo "== benchmarks"
  # From outside the checkout: the installed numbax runs its own suite.
  (cd /tmp && timeout "${BENCH_TIMEOUT:-0}" $PY -m numbax bench $quick ${BENCH_ARGS:-} \
     --no-progress --json "$OUT/bench.json") 2>&1 | tee "$OUT/bench.log"
  bench_status=${PIPESTATUS[0]}
fi

echo "== summary"
# pytest's own closing line ("N passed, M skipped in Ts"), not whatever line
# came last (a warnings footer when pytest runs quietly).
closing_line() {
  grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped|deselected)|^(=+ )?no tests ran' "$1" | tail -1
}
# A process killed by a signal after pytest's summary (an abort or a crash
# while it exits) must not read as a clean run.
died() {
  if [ "$1" = 124 ] || [ "$1" = 137 ]; then
    echo " -- stopped by its timeout (exit status $1)"
  elif [ "$1" -gt 128 ]; then
    echo " -- then the process died with signal $(( $1 - 128 )) (exit status $1)"
  fi
}
summary=$(closing_line "$OUT/pytest.log")
echo "gpu tests: ${summary:-no pytest summary line (see $OUT/pytest.log)}$(died "$test_status")"
if [ -f "$OUT/pytest-multigpu.log" ]; then
  summary=$(closing_line "$OUT/pytest-multigpu.log")
  echo "multigpu tests: ${summary:-no pytest summary line (see $OUT/pytest-multigpu.log)}$(died "$multigpu_status")"
else
  echo "multigpu tests: not run ($ngpu GPU(s); they need 2)"
fi
if [ -f "$OUT/bench.log" ]; then
  start='^== table'
  grep -q '^== vmap (' "$OUT/bench.log" && start='^== vmap ('
  sed -n "/$start/,\$p" "$OUT/bench.log"
fi
[ "$mismatch_status" = 0 ] || echo "mismatched build: NOT refused at import"
exit $(( test_status != 0 || multigpu_status != 0 || bench_status != 0 || mismatch_status != 0 ))
