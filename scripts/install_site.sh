# Sourced by scripts/gpu_check.sh, sanitizer_check.sh and ab_bench.sh: how a
# GPU machine without network gets numbax and its pinned dependencies into a
# plain directory on PYTHONPATH. Needs $PY; run from the repository root.

# install_deps DIR: the wheels in .whl/ that are not numbax (numpy<2.5 for
# numba-cuda 0.30, which the machine's numpy 2.5 breaks).
install_deps() {
  local w deps=()
  for w in .whl/*.whl; do
    case "$(basename "$w")" in numbax-*) ;; *) [ -f "$w" ] && deps+=("$w") ;; esac
  done
  [ ${#deps[@]} -eq 0 ] ||
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$1" "${deps[@]}"
}

# install_numbax DIR LOG: numbax from a wheel, as users get it: a numbax wheel
# for this Python in .whl/ or dist/ (scripts/build_wheel.sh) if there is
# one, else one built here (offline, so against this jaxlib's FFI headers).
# Pip's output goes to LOG; its tail is printed when both ways fail.
install_numbax() {
  local dir=$1 log=$2 wheels
  $PY -m pip install -q --no-index --no-deps --only-binary numbax \
      --find-links .whl --find-links dist --target "$dir" numbax > "$log" 2>&1 && return 0
  wheels=$(mktemp -d)
  if { $PY -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$wheels" . &&
       $PY -m pip install -q --no-index --no-deps --target "$dir" "$wheels"/numbax-*.whl; } \
      >> "$log" 2>&1; then
    rm -rf "$wheels"; return 0
  fi
  rm -rf "$wheels"; tail -50 "$log"; return 1
}
