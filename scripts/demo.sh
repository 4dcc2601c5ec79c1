#!/usr/bin/env bash
# The quickstart from a fresh clone: sets up .venv with what numbax needs to
# run (not the test and docs tools), builds numbax against the same XLA FFI
# headers as the release wheel (the oldest supported jaxlib's), and runs
# examples/quickstart.py: on the GPU if there is one (JAX and Numba with
# CUDA are installed then), else on the CPU through Numba's CUDA simulator;
# without a GPU it then runs examples/numba_kernel.py too: an @njit kernel
# as a native CPU op (no simulator), timed beside jax.pure_callback.
# The build (this machine's compiler, both cores) runs while pip installs
# JAX and Numba; pip writes no bytecode (Python compiles what the quickstart
# imports, once). No compiler runs when a numbax wheel of the same sources
# was built before on this machine, by this script or by
# scripts/build_wheel.sh (the release wheel, then): it is kept under
# ~/.cache/numbax/wheels/, keyed by scripts/lib/source_key.py.
#
#   bash scripts/demo.sh
#   NUMBAX_OFFLINE=1 bash scripts/demo.sh   # a machine without PyPI access
#       (a GPU image with JAX and Numba): no venv; what its Python lacks
#       comes from .whl/ (scripts/gpu_bundle.sh) into build/demo-site, on
#       PYTHONPATH; a numbax wheel there is used as is
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  { echo "demo.sh: numbax needs Python >= 3.11 ($PY is $("$PY" -V 2>&1)); set PYTHON" >&2; exit 1; }
offline=${NUMBAX_OFFLINE:-0}
pin() { grep -E "^$1==" requirements-dev.txt | sed 's/\s*#.*//'; }

# CUDA major version of the driver (0: no GPU, or no driver).
cuda_major=$("$PY" - <<'PY'
import ctypes
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    version = ctypes.c_int(0)
    ok = cuda.cuInit(0) == 0 and cuda.cuDriverGetVersion(ctypes.byref(version)) == 0
    count = ctypes.c_int(0)
    ok = ok and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    print(version.value // 1000 if ok else 0)
except OSError:
    print(0)
PY
)

if [ "$offline" = 1 ]; then
  # The machine's own Python, with its packages (a venv made from it would
  # not see them when it is itself a venv).
  site=build/demo-site
  rm -rf "$site" && mkdir -p "$site"
  export PYTHONPATH="$(pwd)/$site${PYTHONPATH:+:$PYTHONPATH}"
  python() { "$PY" "$@"; }
  pip_args=(--no-index --find-links .whl --target "$site")
else
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  . .venv/bin/activate
  pip_args=()
fi
pip_install() { python -m pip install -q --disable-pip-version-check "${pip_args[@]}" "$@"; }

echo "== setting up $([ "$offline" = 1 ] && echo "$site" || echo .venv) ($([ "$cuda_major" -gt 0 ] && echo "GPU, CUDA $cuda_major" || echo "no GPU: the CPU simulator"))"
t0=$(date +%s)
if [ "$offline" = 1 ]; then
  # What the system lacks or has too new (numpy 2.5 breaks numba-cuda 0.30):
  # carried as wheels, or as unpacked wheels packed with xz, which unpack
  # as pip would install them.
  for t in .whl/*.tar.xz; do [ -f "$t" ] && tar -C "$site" -xJf "$t"; done
  python - <<'PY'
import importlib.metadata as md
for d in ("jax", "jaxlib", "numba", "numba-cuda", "cuda-bindings", "ml_dtypes", "numpy"):
    try:
        print(f"   {d} {md.version(d)}")
    except md.PackageNotFoundError:
        raise SystemExit(f"demo.sh: {d} is not installed, and NUMBAX_OFFLINE=1 installs "
                         "nothing from PyPI: install it, or run without NUMBAX_OFFLINE")
import numpy
if tuple(int(p) for p in numpy.__version__.split(".")[:2]) >= (2, 5):
    raise SystemExit("demo.sh: numpy %s is too new for numba-cuda 0.30: carry numpy<2.5 "
                     "in .whl/ (scripts/gpu_bundle.sh)" % numpy.__version__)
PY
else
  jax_pin=$(pin jax) jaxv=${jax_pin#jax==}
  gpu=()
  if [ "$cuda_major" -ge 12 ]; then
    cu=$(( cuda_major >= 13 ? 13 : 12 ))
    gpu=("jax[cuda$cu]==$jaxv" "$(pin numba-cuda | sed "s/numba-cuda/numba-cuda[cu$cu]/")")
  else
    # numbax[cpu]: numba-cuda 0.30 reads the CUDA runtime's version even in
    # simulator mode (no CUDA toolkit: no libcudart, no numba.cuda).
    gpu=("nvidia-cuda-runtime>=13,<14")
  fi
  # What the build needs first (small), so that it can start at once.
  pip_install --no-compile "$(pin nanobind)" "$(pin scikit-build-core)" cmake ninja
fi

# numbax: a wheel of this checkout, built in the background while the rest
# installs, unless one of the same sources was built before on this machine.
wheel_dir=build/demo-wheel
build_pid=""
kept=${XDG_CACHE_HOME:-$HOME/.cache}/numbax/wheels/$(python scripts/lib/source_key.py)
if [ "$offline" = 1 ] && ls .whl/numbax-*.whl >/dev/null 2>&1; then
  :
elif compgen -G "$kept/numbax-*.whl" > /dev/null; then
  rm -rf "$wheel_dir" && mkdir -p "$wheel_dir"
  cp "$(ls -t "$kept"/numbax-*.whl | head -1)" "$wheel_dir/"
  echo "   numbax: $(basename "$wheel_dir"/numbax-*.whl), built before from the same sources ($kept)"
else
  # The release wheel's headers (the oldest supported jaxlib's; fetched once
  # into build/ffi-headers/), else, offline, the installed jaxlib's.
  headers=$(python scripts/lib/ffi_headers.py 2>/dev/null || true)
  rm -rf "$wheel_dir" && mkdir -p "$wheel_dir"
  NUMBAX_XLA_FFI_INCLUDE_DIR=$headers CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    python -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
    -w "$wheel_dir" . > build/demo-build.log 2>&1 &
  build_pid=$!
fi
if [ "$offline" != 1 ]; then
  pip_install --no-compile "$jax_pin" "$(pin jaxlib)" "$(pin numpy)" "$(pin numba)" \
    "$(pin numba-cuda)" "$(pin cuda-bindings)" "$(pin ml_dtypes)" "${gpu[@]}"
fi

echo "== numbax"
if [ "$offline" = 1 ] && ls .whl/numbax-*.whl >/dev/null 2>&1; then
  pip_install --no-deps --force-reinstall --only-binary numbax --find-links .whl numbax
else
  if [ -n "$build_pid" ]; then
    if ! wait "$build_pid"; then
      tail -40 build/demo-build.log >&2
      echo "demo.sh: building numbax failed (build/demo-build.log)" >&2
      exit 1
    fi
    mkdir -p "$kept" && cp "$wheel_dir"/numbax-*.whl "$kept/" 2>/dev/null || true
  fi
  pip_install --no-deps --force-reinstall "$wheel_dir"/numbax-*.whl
fi
python -c "import numbax, numbax._build_info as b, jax; print('numbax', numbax.__version__, 'built against XLA FFI API %d.%d (%s), on jax' % (*b.XLA_FFI_API, b.XLA_FFI_HEADERS_FROM), jax.__version__)"
echo "   ready in $(( $(date +%s) - t0 )) s"

if [ "$cuda_major" -eq 0 ]; then
  export NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu
fi
echo "== examples/quickstart.py"
python examples/quickstart.py
if [ "$cuda_major" -eq 0 ]; then
  # numba_kernel needs no simulator: the CPU's own op, at native speed.
  echo "== examples/numba_kernel.py (the CPU path: @njit kernels as native XLA ops)"
  python examples/numba_kernel.py
fi
