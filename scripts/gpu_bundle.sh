#!/usr/bin/env bash
# Fills .whl/ with what scripts/gpu_check.sh installs on a GPU machine that
# has no network: the numbax release wheel for that machine's Python (built
# the release way, scripts/build_wheel.sh) and numpy<2.5 (numba-cuda 0.30
# cannot compile kernels under the numpy 2.5 such machines carry).
#
#   bash scripts/gpu_bundle.sh                 # for Python 3.12 (pyenv's, if any)
#   GPU_PYTHON=3.13 PYTHON=/path/python3.13 bash scripts/gpu_bundle.sh
#
# Then carry .whl (the device tool's `carry`), and run gpu_check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${GPU_PYTHON:-3.12}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  PY=$(ls -d "$HOME"/.pyenv/versions/"$ver".*/bin/python"$ver" 2>/dev/null | tail -1)
  # A pyenv shim on PATH may name a version it cannot run: try it.
  [ -n "$PY" ] || PY=$(command -v "python$ver" || true)
fi
[ -n "$PY" ] && "$PY" -c pass 2>/dev/null || { echo "gpu_bundle.sh: no python$ver found (set PYTHON)" >&2; exit 1; }
mkdir -p .whl
rm -f .whl/numbax-*.whl
wheel=$(PYTHON="$PY" DIST=build/gpu-dist WHEEL_ONLY=1 bash scripts/build_wheel.sh)
cp "$wheel" .whl/
numpy_pin=$(grep -E '^numpy==' requirements-dev.txt | sed 's/\s*#.*//')
cp=cp${ver/./}
rm -f .whl/numpy-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$ver" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$numpy_pin"
ls -la .whl
du -sh .whl
