#!/usr/bin/env bash
# Fills .whl/ with what scripts/gpu_check.sh installs on a GPU machine that
# has no network: the numbax release wheel for that machine's Python (built
# the release way, scripts/build_wheel.sh: zig for glibc 2.28, tagged
# manylinux_2_28 or lower, so the GPU check runs the wheel users install;
# gpu_check.sh checks that tag again), numpy<2.5 (numba-cuda 0.30
# cannot compile kernels under the numpy 2.5 such machines carry) and
# pytest-xdist (gpu_check.sh's TEST_SHARDS).
#
#   bash scripts/gpu_bundle.sh                 # for Python 3.12 (pyenv's, if any)
#   GPU_PYTHON=3.13 PYTHON=/path/python3.13 bash scripts/gpu_bundle.sh
#   WITH_MLIR=1 bash scripts/gpu_bundle.sh     # numba-cuda-mlir too
#
# A device call carries 64 MiB: the dependencies go as unpacked wheels
# re-packed with xz (.tar.xz, unpacked by gpu_check.sh: numpy 17 -> 10 MB,
# numba-cuda-mlir 71 -> 48 MB).
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
# A deliberately mismatched build for gpu_check.sh to import: compiled
# against the newest FFI headers known (jaxlib 0.12.0.1: API 0.5), newer
# than the GPU machine's jaxlib, so importing it must refuse with a message
# naming both versions.
rm -rf .whl/mismatch && mkdir -p .whl/mismatch
headers=$(python3 scripts/lib/ffi_headers.py "${MISMATCH_JAXLIB:-0.12.0.1}")
NUMBAX_XLA_FFI_INCLUDE_DIR=$headers PYTHON="$PY" DIST=build/gpu-dist-mismatch WHEEL_ONLY=1 \
  bash scripts/build_wheel.sh > /dev/null
cp build/gpu-dist-mismatch/numbax-*manylinux*.whl .whl/mismatch/
# pack NAME==VERSION: its wheel for the GPU's Python, as .whl/NAME-cpXY.tar.xz
# (kept from an earlier run when its version file matches).
pack() {
  local tmp out=".whl/${1%%=*}-cp${ver/./}.tar.xz"
  if [ -f "$out" ] && [ "$(cat "$out.version" 2>/dev/null)" = "$1" ]; then return 0; fi
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$ver" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$tmp" "$1"
  mkdir "$tmp/tree"
  (cd "$tmp/tree" && python3 -m zipfile -e "$tmp"/*.whl .)
  tar -C "$tmp/tree" -cf - . | xz -9 -T2 > "$out"
  echo "$1" > "$out.version"
  rm -rf "$tmp"
}
[ "${WITH_MLIR:-0}" = 1 ] || rm -f .whl/numba-cuda-mlir-*
for dep in numpy pytest-xdist execnet; do
  pack "$(grep -E "^$dep==" requirements-dev.txt | sed 's/\s*#.*//')"
done
[ "${WITH_MLIR:-0}" = 1 ] && pack "numba-cuda-mlir==${MLIR_VERSION:-0.6.0}"
ls -la .whl
du -sh .whl
