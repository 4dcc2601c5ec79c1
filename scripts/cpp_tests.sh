#!/usr/bin/env bash
# Builds and runs the C++ unit tests in tests/cpp under CTest.
#
#   bash scripts/cpp_tests.sh                    # from the repo root, venv active
#   NUMBAX_SANITIZE=1 bash scripts/cpp_tests.sh  # under AddressSanitizer + UBSan
#
# The python first on PATH must be the project's venv: the top-level project
# asks it for nanobind. The tests compile against the XLA FFI headers the
# release wheel is built with (the oldest supported jaxlib's, fetched by
# scripts/lib/ffi_headers.py), so they check the binary users install;
# NUMBAX_XLA_FFI_INCLUDE_DIR picks others.
# NUMBAX_BUILD_TYPE overrides the build type (default RelWithDebInfo: the
# optimised code paths the wheel ships, with NDEBUG, plus line info).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

python_exe=$(command -v python || command -v python3) ||
  { echo "cpp_tests.sh: no python on PATH (activate the venv first)" >&2; exit 1; }
build_type=${NUMBAX_BUILD_TYPE:-RelWithDebInfo}
NUMBAX_XLA_FFI_INCLUDE_DIR=${NUMBAX_XLA_FFI_INCLUDE_DIR:-$("$python_exe" scripts/lib/ffi_headers.py)}
export NUMBAX_XLA_FFI_INCLUDE_DIR
build_dir=build/cpp-tests
cmake_args=()

if [[ "${NUMBAX_SANITIZE:-0}" != 0 ]]; then
  # Its own build dir, so switching back and forth never reuses objects
  # built with the other flags.
  build_dir=build/cpp-tests-sanitize
  san="-fsanitize=address,undefined -fno-sanitize-recover=all"
  cmake_args+=(
    "-DCMAKE_CXX_FLAGS=${san} -fno-omit-frame-pointer"
    "-DCMAKE_EXE_LINKER_FLAGS=${san}"
    "-DCMAKE_SHARED_LINKER_FLAGS=${san}"
    "-DCMAKE_MODULE_LINKER_FLAGS=${san}"
  )
  export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi

cmake -S . -B "$build_dir" \
  -DCMAKE_BUILD_TYPE="$build_type" \
  -DNUMBAX_BUILD_TESTS=ON \
  -DPython_EXECUTABLE="$python_exe" \
  "${cmake_args[@]}"
# Only the tests and what they link: the nanobind extension is configured
# (so a broken module target still fails here) but not compiled.
cmake --build "$build_dir" -j2 --target numbax_cpp_tests
cd "$build_dir"
ctest --output-on-failure
