#!/usr/bin/env bash
# The aarch64 wheel, checked on this x86_64 machine: cross-built by
# scripts/build_wheel.sh (zig, -target aarch64-linux-gnu.2.28; the build
# fails above manylinux_2_28), its tag and the glibc symbol versions its
# extension needs (auditwheel show), then installed beside aarch64 wheels
# of its dependencies from PyPI and imported and tested on JAX's CPU backend
# through Numba's CUDA simulator, under QEMU's user-mode emulator
# (qemu-user-static) running Debian bookworm's aarch64 CPython 3.11.
#
#   bash scripts/aarch64_check.sh [--wheel PATH] [-- pytest args]
#
# Default tests: tests/test_callable.py tests/test_kernel.py (emulated, a
# test runs 10 to 50 times slower). No GPU, and no aarch64 machine: what
# this shows is that the wheel installs, its extension loads and numbax's
# ops run through XLA's FFI on aarch64 (jaxlib's own aarch64 build). The
# emulator runs one process: tests that start a Python subprocess cannot
# run here (this machine cannot exec aarch64 binaries without it).
# Needs PyPI and Debian's archive (apt-get, with an apt state of its own
# under build/aarch64/: the machine's apt configuration is left alone).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
work=$(pwd)/build/aarch64
wheel="" pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=$2; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "aarch64_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#pytest_args[@]} -gt 0 ] || pytest_args=(tests/test_callable.py tests/test_kernel.py)
mkdir -p "$work"
SECONDS=0

if ! command -v qemu-aarch64-static > /dev/null; then
  echo "== qemu-user-static (apt)"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq qemu-user-static > /dev/null
fi

if [ -z "$wheel" ]; then
  echo "== the aarch64 wheel (ARCH=aarch64 scripts/build_wheel.sh)"
  wheel=$(ARCH=aarch64 PYTHON="$PY" WHEEL_ONLY=1 DIST=build/dist-aarch64 bash scripts/build_wheel.sh)
fi
echo "   $wheel"
tools=$(ls "build/tools-py$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/bin/python" 2>/dev/null || echo "$PY")
"$tools" scripts/lib/wheel_tag.py --max 2_28 --arch aarch64 "$wheel"
"$tools" -m auditwheel show "$wheel" | tr -s ' \n' ' ' | sed 's/ In order to achieve.*//'
echo

# Debian bookworm's aarch64 CPython 3.11 and the libraries it and the
# dependencies' wheels load, unpacked into a root for QEMU (-L).
root=$work/root
if ! [ -x "$root/usr/bin/python3.11" ]; then
  echo "== Debian's aarch64 python3.11 (apt-get download, unpacked into $root)"
  apt_opts=(-o "APT::Architectures::=arm64" -o "Dir::State::Lists=$work/apt/lists"
            -o "Dir::Cache=$work/apt/cache" -o "Dir::State::status=/dev/null")
  mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/debs"
  apt-get "${apt_opts[@]}" update -qq
  pkgs=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libgcc-s1
        libstdc++6 libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0
        libuuid1 libncursesw6 libtinfo6 libreadline8 libdb5.3 libnsl2 libtirpc3
        libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1
        libcrypt1 libzstd1)
  (cd "$work/debs" && apt-get -qq "${apt_opts[@]}" download "${pkgs[@]/%/:arm64}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  rm -rf "$root.partial" && mkdir -p "$root.partial"
  for d in "$work"/debs/*_arm64.deb; do dpkg-deb -x "$d" "$root.partial"; done
  rm -rf "$root" && mv "$root.partial" "$root"
fi
run() {
  LD_LIBRARY_PATH="$work/site/nvidia/cu13/lib" NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu \
    qemu-aarch64-static -L "$root" "$root/usr/bin/python3.11" -c \
    "import site, sys; site.addsitedir('$work/numbax'); site.addsitedir('$work/site'); sys.argv[0] = 'python'; $1" "${@:2}"
}

# The dependencies' aarch64 wheels, at requirements-dev.txt's pins (kept
# while the pins are the same). numba-cuda 0.30.4 reads the CUDA runtime's
# version even in simulator mode: libcudart comes from nvidia-cuda-runtime.
grep -vE '^\s*(#|$)|\[' requirements-dev.txt | sed 's/\s*#.*//' > "$work/constraints.txt"
# pip takes exactly the platform tags named: every manylinux up to 2_28.
plat=(--only-binary=:all: --python-version 3.11 --implementation cp --platform manylinux2014_aarch64)
for minor in $(seq 17 28); do plat+=(--platform "manylinux_2_${minor}_aarch64"); done
if ! cmp -s "$work/constraints.txt" "$work/site.pins" 2>/dev/null; then
  echo "== the dependencies' aarch64 wheels (pip --platform)"
  rm -rf "$work/site"
  python3 -m pip install -q --disable-pip-version-check --target "$work/site" "${plat[@]}" \
    -c "$work/constraints.txt" jax jaxlib numpy numba numba-cuda cuda-bindings ml_dtypes \
    pytest hypothesis flatbuffers 2>&1 | grep -vE "^WARNING: (Location|Running pip)" || true
  python3 -m pip install -q --disable-pip-version-check --target "$work/site" "${plat[@]}" \
    --no-deps "nvidia-cuda-runtime==13.*" 2>&1 | grep -vE "^WARNING: (Location|Running pip)" || true
  cp "$work/constraints.txt" "$work/site.pins"
fi
rm -rf "$work/numbax"
python3 -m pip install -q --disable-pip-version-check --target "$work/numbax" "${plat[@]}" \
  --no-deps "$wheel" 2>&1 | grep -vE "^WARNING: (Location|Running pip)" || true
[ -d "$work/numbax/numbax" ] || { echo "aarch64_check.sh: $wheel did not install" >&2; exit 1; }

echo "== under qemu-aarch64: import numbax, python -m numbax info"
run "import platform, numbax, numbax._core as c; print(platform.machine(), 'numbax', numbax.__version__, c.__file__)"
run "from numbax.cli import main; sys.exit(main(['info']))" | grep -E "^(python|jax |XLA FFI|simulator|problems)" || true
echo "== under qemu-aarch64: pytest ${pytest_args[*]}"
status=0
run "import pytest; sys.exit(pytest.main(sys.argv[1:]))" -q -p no:cacheprovider "${pytest_args[@]}" || status=$?
echo "== done in ${SECONDS} s"
exit $status
