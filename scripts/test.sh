#!/usr/bin/env bash
# Sets up everything and runs every test that can run without a GPU:
# the C++ unit tests (GoogleTest under CTest) and the Python tests on JAX's
# CPU backend through Numba's CUDA simulator, on numbax's wheel installed in
# fresh venvs with the oldest and the newest supported JAX
# (scripts/wheel_matrix.sh). GPU tests: scripts/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# GoogleTest for the C++ unit tests; clang and its runtime (libFuzzer,
# sanitizers) for scripts/fuzz.sh. Debian bookworm's names.
need=()
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
command -v clang++ >/dev/null || need+=(clang)
command -v clang-format >/dev/null || need+=(clang-format)
compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" \
  >/dev/null || need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
bash scripts/setup.sh
. .venv/bin/activate
echo "== C++ unit tests"
bash scripts/cpp_tests.sh
echo "== Lint: ruff, mypy, clang-format, docs (mkdocs build --strict)"
bash scripts/lint.sh
echo "== Fuzzing the call-frame decoding (libFuzzer, bounded)"
FUZZ_SECONDS=${FUZZ_SECONDS:-15} bash scripts/fuzz.sh
echo "== Python tests (CPU, Numba CUDA simulator) on the wheel, in fresh venvs:"
echo "   the newest supported JAX (full suite) and the oldest (a subset)"
# setup.sh built the wheel (unless NUMBAX_BUILD=source: then it is built now).
wheel=$(ls dist/numbax-*manylinux*.whl 2>/dev/null || true)
bash scripts/wheel_matrix.sh ${wheel:+--wheel "$wheel"} -- "$@"
