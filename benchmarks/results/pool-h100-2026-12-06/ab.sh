#!/usr/bin/env bash
# On the device: the wheel before (.whl/prev) and after (.whl) side by side,
# spin_sweep.py with each, then the CPU suite with the new one.
set -u
R=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$R"
PY=python3
. scripts/lib/install_site.sh
for v in old new; do
  site=/tmp/site-$v; rm -rf $site; mkdir -p $site
  install_deps $site || exit 1
  $PY -m pip install -q --no-index --no-deps --target $site .whl/be/*.whl 2>/dev/null
done
$PY -m pip install -q --no-index --no-deps --target /tmp/site-old .whl/prev/numbax-*.whl || exit 1
install_numbax /tmp/site-new /tmp/b.log wheel || exit 1
cd /tmp
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cpu
for round in 1 2; do
  for v in old new; do
    echo "== $v (round $round)"
    PYTHONPATH=/tmp/site-$v timeout 100 $PY "$R/benchmarks/results/pool-h100-2026-12-06/spin_sweep.py" 2>&1 | grep -v -i warn
  done
done
echo "== new, NUMBAX_CPU_POOL_SPIN_US=0"
NUMBAX_CPU_POOL_SPIN_US=0 PYTHONPATH=/tmp/site-new timeout 100 $PY "$R/benchmarks/results/pool-h100-2026-12-06/spin_sweep.py" 2>&1 | grep -v -i warn
PYTHONPATH=/tmp/site-new timeout 220 $PY -m numbax bench --cpu --no-progress --seed 44 \
  --json "$OUT/cpu-host.json" 2>"$OUT/cpu-stderr.log" | tee "$OUT/cpu-stdout.log" | tail -32
