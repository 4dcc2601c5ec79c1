#!/usr/bin/env bash
# What CI runs (.ci/run): every test that runs without a GPU, in two lanes
# side by side, the checks (build/checks.log: .venv with the pinned tools,
# C++ unit tests, lint, bounded fuzzing) and the Python tests on the release
# wheel through Numba's CUDA simulator (scripts/wheel_matrix.sh). The last
# lines are each row's pytest closing line and the verdict; the exit status
# is 1 if anything failed. GPU tests: scripts/gpu_check.sh.
#
#   bash scripts/test.sh [-- pytest args for every matrix row]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
# GoogleTest for the C++ unit tests; clang and its runtime (libFuzzer,
# sanitizers) for scripts/fuzz.sh. Debian bookworm's names.
need=()
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
command -v clang++ >/dev/null || need+=(clang)
command -v clang-format >/dev/null || need+=(clang-format)
compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" \
  >/dev/null || need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  echo "== apt: ${need[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ "${1:-}" = "--" ] && shift
mkdir -p build

checks() {
  # No numbax build: the checks need the tools only; the matrix tests wheels.
  NUMBAX_BUILD=none bash scripts/setup.sh || return 1
  . .venv/bin/activate
  local st=0
  echo "== C++ unit tests (at ${SECONDS} s)"
  bash scripts/cpp_tests.sh > build/cpp-tests.log 2>&1 || { cat build/cpp-tests.log; st=1; }
  tail -3 build/cpp-tests.log | grep -E "tests passed|tests failed" || true
  echo "== lint (at ${SECONDS} s)"
  bash scripts/lint.sh || st=1
  echo "== fuzzing (at ${SECONDS} s)"
  FUZZ_SECONDS=${FUZZ_SECONDS:-10} bash scripts/fuzz.sh > build/fuzz.log 2>&1 ||
    { tail -40 build/fuzz.log; st=1; }
  grep -E "^== |stat::number_of_executed_units" build/fuzz.log || true
  echo "== checks done (at ${SECONDS} s)"
  return $st
}
echo "== checks in the background (build/checks.log); Python tests on the wheel"
checks > build/checks.log 2>&1 &
checks_pid=$!
trap 'kill "$checks_pid" 2>/dev/null || true' EXIT

status=0
bash scripts/wheel_matrix.sh -- "$@" > build/matrix.log 2>&1 || status=1
wait "$checks_pid" || status=1
cat build/checks.log build/matrix.log
[ "$status" = 0 ] && echo "== test.sh: passed in ${SECONDS} s" || echo "== test.sh: FAILED (${SECONDS} s)"
exit $status
