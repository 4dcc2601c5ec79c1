export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TEST_SHARDS=6 TEST_TIMEOUT=330 BENCH_TIMEOUT=200 BENCH_ARGS="--quick --rounds 10 --no-cold-start" bash scripts/gpu_check.sh > $OUT/gpu_check.log 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR) |tag|refused|NOT" $OUT/gpu_check.log | cut -c1-300 | head -30
sed -n '/== summary/,/^== vmap\|^== launch/p' $OUT/gpu_check.log | head -12
sed -n '/^== table/,$p' $OUT/gpu_check.log | cut -c1-230
echo "== profiling example"; PYTHONPATH=/tmp/numbax-site timeout 60 python3 examples/profiling.py 2>&1 | tail -3
echo "== probe3 (hit vs rebind)"; PYTHONPATH=/tmp/numbax-site timeout 120 python3 .whl/probe3.py > $OUT/probe_hit_vs_rebind.log 2>&1; grep -v -i warn $OUT/probe_hit_vs_rebind.log | tail -4
echo "== new per-slice test alone"; PYTHONPATH=/tmp/numbax-site timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_per_slice.py 2>&1 | tail -3
