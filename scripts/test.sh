#!/usr/bin/env bash
# Sets up everything and runs every test that can run without a GPU, in
# about 8 minutes on a 2-core machine:
#   the C++ unit tests (GoogleTest under CTest), lint (ruff, mypy,
#   clang-format, the docs site), bounded fuzzing of the call-frame
#   decoding, and the Python tests on JAX's CPU backend through Numba's CUDA
#   simulator, run on numbax's release wheel in fresh venvs at both ends of
#   the supported range (scripts/wheel_matrix.sh: every test file on one row,
#   a subset on each of the others).
# The wheel matrix starts at once, in the background (its jobs two at a
# time: the other Python's wheel, the venvs, the pytest runs), while this
# script sets up .venv and builds the release wheel for its Python
# (scripts/setup.sh: the matrix waits for that wheel and never builds it
# again), then runs the C++ tests, lint and fuzzing: both cores stay busy
# from the start to the end. Each step's start and each matrix job's start
# and end are printed with the seconds since the start ("at N s").
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
[ "${1:-}" = "--" ] && shift
mkdir -p build

# The wheel setup.sh builds is the matrix's wheel for this Python: its path
# goes to $wheel_note once built (an empty file if setup failed), and the
# matrix's rows of this Python wait for it.
py_v=$("${PYTHON:-python3}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
wheel_note=build/setup-wheel.path matrix_log=build/wheel-matrix.log
rm -f "$wheel_note"
stamp "Python tests on the wheel (scripts/wheel_matrix.sh), in the background"
# In a process group of its own (setsid), so that an early exit stops all of it.
launch=()
command -v setsid >/dev/null && launch=(setsid)
"${launch[@]}" bash scripts/wheel_matrix.sh --wheel-from "$py_v:$wheel_note" -- "$@" \
  > "$matrix_log" 2>&1 &
matrix_pid=$! matrix_running=1
on_exit() {
  [ -f "$wheel_note" ] || : > "$wheel_note"
  if [ "$matrix_running" = 1 ]; then
    kill -TERM -- "-$matrix_pid" 2>/dev/null || kill -TERM "$matrix_pid" 2>/dev/null || true
  fi
}
trap on_exit EXIT

stamp "setup: .venv and the release wheel (scripts/setup.sh)"
bash scripts/setup.sh
ls dist/numbax-*manylinux*.whl | head -1 > "$wheel_note.tmp"
mv "$wheel_note.tmp" "$wheel_note"
. .venv/bin/activate

status=0
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
matrix_running=0
cat "$matrix_log"
# User + system time of everything this script ran: against the wall time,
# how busy it kept the cores (other work on the machine shows here too).
times > build/times.txt  # here, not in a subshell, which would time only itself
cpu=$(tail -1 build/times.txt | tr 'ms' '  ' | awk '{ printf "%.0f", $1 * 60 + $2 + $3 * 60 + $4 }')
stamp "done, $cpu s of CPU"
exit $status
