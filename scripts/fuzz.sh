#!/usr/bin/env bash
# Builds the libFuzzer harnesses in tests/fuzz (clang, with AddressSanitizer
# and UndefinedBehaviorSanitizer) and runs each for a bounded time.
#
#   bash scripts/fuzz.sh                        # FUZZ_SECONDS=20 per harness
#   FUZZ_SECONDS=3600 bash scripts/fuzz.sh      # longer, by hand
#   FUZZ_HARNESSES=call_frame_fuzz bash scripts/fuzz.sh
#
# Needs clang and its runtime (Debian: apt-get install clang
# libclang-rt-14-dev; scripts/test.sh installs them) and the project's venv
# first on PATH (for the XLA FFI headers of the installed jaxlib). Every input
# in tests/fuzz/regressions/<harness>/ is replayed first. A crash exits
# non-zero and leaves the input in build/fuzz/artifacts/: add it to
# tests/fuzz/regressions/<harness>/ and as a GoogleTest case in
# tests/cpp/fuzz_regressions_test.cc. The corpus grows in build/fuzz/corpus/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${FUZZ_SECONDS:-20}
harnesses=${FUZZ_HARNESSES:-"call_frame_fuzz kernel_args_fuzz"}
out=build/fuzz

# clang++, else the newest clang++-N on PATH.
cxx=${CXX_FUZZ:-$(command -v clang++ || compgen -c clang++- | sort -V | tail -1 || true)}
[[ -n "$cxx" ]] ||
  { echo "fuzz.sh: no clang++ found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
python_exe=$(command -v python || command -v python3)
ffi_include=$("$python_exe" -c "import jax.ffi; print(jax.ffi.include_dir())")

mkdir -p "$out/artifacts"
flags=(-std=c++17 -g -O1 -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
       -Icsrc -Itests/fuzz -isystem "$ffi_include")
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

echo "fuzz.sh: $($cxx --version | head -1); ${seconds}s per harness"
status=0
for h in $harnesses; do
  echo "== $h: build"
  "$cxx" "${flags[@]}" "tests/fuzz/$h.cc" csrc/call_frame.cc csrc/kernel_args.cc \
    -o "$out/$h"
  regressions=tests/fuzz/regressions/$h
  if compgen -G "$regressions/*" >/dev/null; then
    echo "== $h: replay $(ls "$regressions" | wc -l) regression input(s)"
    "$out/$h" "$regressions"/* || { status=1; continue; }
  fi
  echo "== $h: fuzz ${seconds}s"
  mkdir -p "$out/corpus/$h"
  if ! "$out/$h" "$out/corpus/$h" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
        -artifact_prefix="$out/artifacts/$h-" 2>"$out/$h.log"; then
    tail -60 "$out/$h.log"
    echo "fuzz.sh: $h found a crash; the input is in $out/artifacts/" >&2
    status=1
    continue
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added|cov:" \
    "$out/$h.log" | tail -3
done
exit $status
