export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
TEST_SHARDS=6 TEST_TIMEOUT=300 BENCH_TIMEOUT=150 BENCH_ARGS="--quick --rounds 10 --no-cold-start --no-workloads" bash scripts/gpu_check.sh > $OUT/gpu_check.log 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR) |refused as it must" $OUT/gpu_check.log | cut -c1-200 | head -20
sed -n '/== summary/,/^multigpu/p' $OUT/gpu_check.log | head -10
sed -n '/^== table/,$p' $OUT/gpu_check.log | cut -c1-200 | head -20
echo "== rebind + per-slice files alone"; PYTHONPATH=/tmp/numbax-site timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_capture_rebind.py tests/test_gpu_per_slice.py 2>&1 | tail -3
