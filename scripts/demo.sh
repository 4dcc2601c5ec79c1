#!/usr/bin/env bash
# Sets up everything and runs the quickstart: on the GPU if there is one,
# else on the CPU through Numba's CUDA simulator.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
. .venv/bin/activate
if ! python -c "import ctypes; ctypes.CDLL('libcuda.so.1')" 2>/dev/null; then
  export NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu
fi
python examples/quickstart.py
