#!/usr/bin/env bash
# Sets up everything and runs every test that can run without a GPU, in
# about 10 minutes on a 2-core machine:
#   the C++ unit tests (GoogleTest under CTest), lint (ruff, mypy,
#   clang-format, the docs site), bounded fuzzing of the call-frame
#   decoding, and the Python tests on JAX's CPU backend through Numba's CUDA
#   simulator, run on numbax's release wheel in fresh venvs at both ends of
#   the supported range (scripts/wheel_matrix.sh: every test file on one row
#   or another, a subset on each), two at a time beside the C++ and lint
#   steps.
# GPU tests: scripts/gpu_check.sh on a GPU machine.
#
#   bash scripts/test.sh [-- pytest args for every matrix row]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
stamp() { echo "== $* (at ${SECONDS} s)"; }
# GoogleTest for the C++ unit tests; clang and its runtime (libFuzzer,
# sanitizers) for scripts/fuzz.sh. Debian bookworm's names.
need=()
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
command -v clang++ >/dev/null || need+=(clang)
command -v clang-format >/dev/null || need+=(clang-format)
compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" \
  >/dev/null || need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  stamp "apt: ${need[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
stamp "setup: .venv and the release wheel (scripts/setup.sh)"
bash scripts/setup.sh
. .venv/bin/activate
[ "${1:-}" = "--" ] && shift

# The wheel matrix runs in the background (two lanes of its own) while the
# C++ tests, lint and fuzzing take the cores' idle time.
wheel=$(ls dist/numbax-*manylinux*.whl 2>/dev/null || true)
matrix_log=$(mktemp)
stamp "Python tests on the wheel (scripts/wheel_matrix.sh), in the background"
bash scripts/wheel_matrix.sh ${wheel:+--wheel "$wheel"} -- "$@" > "$matrix_log" 2>&1 &
matrix_pid=$!

status=0
mkdir -p build
stamp "C++ unit tests"
bash scripts/cpp_tests.sh > build/cpp-tests.log 2>&1 || { cat build/cpp-tests.log; status=1; }
tail -3 build/cpp-tests.log | grep -E "tests passed|tests failed" || true
stamp "lint: ruff, mypy, clang-format, docs (mkdocs build --strict)"
bash scripts/lint.sh || status=1
stamp "fuzzing the call-frame decoding (libFuzzer, bounded)"
FUZZ_SECONDS=${FUZZ_SECONDS:-10} bash scripts/fuzz.sh > build/fuzz.log 2>&1 || { tail -40 build/fuzz.log; status=1; }
grep -E "^== |stat::number_of_executed_units" build/fuzz.log || true

stamp "waiting for the Python tests"
wait "$matrix_pid" || status=1
cat "$matrix_log"
rm -f "$matrix_log"
stamp "done"
exit $status
