#!/usr/bin/env bash
# Sets up everything and runs every test that can run without a GPU:
# the C++ unit tests (GoogleTest under CTest) and the Python tests on JAX's
# CPU backend through Numba's CUDA simulator. GPU tests: scripts/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! [ -f /usr/include/gtest/gtest.h ] && command -v apt-get >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq libgtest-dev >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq libgtest-dev >/dev/null
  fi
fi
bash scripts/setup.sh
. .venv/bin/activate
echo "== C++ unit tests"
bash scripts/cpp_tests.sh
echo "== Python tests (CPU, Numba CUDA simulator)"
export NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu
python -m pytest -q -p no:cacheprovider tests "$@"
