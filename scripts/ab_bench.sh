#!/usr/bin/env bash
# Before/after benchmark on one GPU machine: quick benchmark runs of two
# numbax wheels, alternating which goes first (ABBA), then the comparison
# (python -m numbax.bench.compare) printed last.
#
#   bash scripts/ab_bench.sh BEFORE.whl AFTER.whl [ROUNDS]   # default 4
#
# Wheels in .whl/ that are not numbax (numpy<2.5 for numba-cuda 0.30) are
# installed beside each. DEADLINE (epoch seconds) stops starting rounds that
# would not finish (a quick run takes about 20 s on an H200). JSON and logs
# go to $OUT (default /tmp/numbax-ab). AB_ARGS adds options to every
# benchmark run (e.g. --no-workloads).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
before=$1 after=$2 rounds=${3:-4}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
unset NUMBA_ENABLE_CUDASIM
OUT=${OUT:-/tmp/numbax-ab}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)   # absolute: runs start in /tmp
rm -f "$OUT"/before-*.json "$OUT"/after-*.json "$OUT"/before-*.log "$OUT"/after-*.log
before=$(realpath "$before") after=$(realpath "$after")
PY=${PYTHON:-python3}
. scripts/lib/install_site.sh
for side in before after; do
  wheel=$before; [ "$side" = after ] && wheel=$after
  rm -rf "/tmp/numbax-ab-$side" && mkdir -p "/tmp/numbax-ab-$side"
  install_deps "/tmp/numbax-ab-$side" &&
    $PY -m pip install -q --no-index --no-deps --no-compile \
      --target "/tmp/numbax-ab-$side" "$wheel" || exit 1
done
failed=0
run() {  # side round
  local st
  # From /tmp: the checkout's own sources must not shadow the wheel.
  (cd /tmp && PYTHONPATH="/tmp/numbax-ab-$1" $PY -m numbax bench --quick \
     --no-progress ${AB_ARGS:-} --json "$OUT/$1-$2.json" > "$OUT/$1-$2.log" 2>&1)
  st=$?
  echo "$1 round $2: exit $st"
  if [ "$st" != 0 ]; then failed=1; rm -f "$OUT/$1-$2.json"; fi
}
for r in $(seq 1 "$rounds"); do
  # A round is both runs or neither, so the sides keep equal counts.
  if [ "${DEADLINE:-0}" != 0 ] && [ $(( DEADLINE - $(date +%s) )) -lt 80 ]; then
    echo "round $r: not started (DEADLINE)"; break
  fi
  if [ $(( r % 2 )) = 1 ]; then run before "$r"; run after "$r"
  else run after "$r"; run before "$r"; fi
done
echo "== before/after"
shopt -s nullglob
b=("$OUT"/before-*.json) a=("$OUT"/after-*.json)
if [ ${#b[@]} = 0 ] || [ ${#a[@]} = 0 ]; then
  echo "no complete runs to compare (${#b[@]} before, ${#a[@]} after)"; exit 1
fi
PYTHONPATH="/tmp/numbax-ab-after" $PY -m numbax.bench.compare "${b[@]}" -- "${a[@]}"
st=$?
[ "$failed" = 0 ] || { echo "a benchmark run failed (its log is in $OUT)"; exit 1; }
exit $st
