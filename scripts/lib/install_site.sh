# Sourced by scripts/gpu_check.sh, sanitizer_check.sh and ab_bench.sh: how a
# GPU machine without network gets numbax and its pinned dependencies into a
# plain directory on PYTHONPATH. Needs $PY; run from the repository root.

# install_deps DIR: the wheels in .whl/ that are not numbax (numpy<2.5 for
# numba-cuda 0.30, which the machine's numpy 2.5 breaks), and any .tar.xz
# there: an unpacked wheel packed small enough to carry (a wheel's tree
# unpacks into DIR as pip would install it; numba-cuda-mlir's 71 MB wheel
# is 48 MB so).
install_deps() {
  local w deps=()
  for w in .whl/*.whl; do
    case "$(basename "$w")" in numbax-*) ;; *) [ -f "$w" ] && deps+=("$w") ;; esac
  done
  [ ${#deps[@]} -eq 0 ] ||
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$1" "${deps[@]}" || return 1
  for w in .whl/*.tar.xz; do
    [ -f "$w" ] && { tar -C "$1" -xJf "$w" || return 1; }
  done
  return 0
}

# install_numbax DIR LOG [wheel|source]: numbax as users get it, the
# release wheel for this Python from .whl/ or dist/ (scripts/gpu_bundle.sh
# puts it there); refused when there is none. "source" builds this checkout
# instead (offline, so against this jaxlib's FFI headers). Pip's output goes
# to LOG; its tail is printed on failure.
install_numbax() {
  local dir=$1 log=$2 from=${3:-wheel} wheels
  if [ "$from" = wheel ]; then
    if $PY -m pip install -q --no-index --no-deps --only-binary numbax \
        --find-links .whl --find-links dist --target "$dir" numbax > "$log" 2>&1; then
      return 0
    fi
    tail -20 "$log"
    echo "no numbax release wheel for $($PY -c 'import sys; print("Python %d.%d" % sys.version_info[:2])') in .whl/ or dist/:"
    echo "build one on a machine with PyPI access (bash scripts/gpu_bundle.sh), carry .whl,"
    echo "or test a source build with --source"
    return 1
  fi
  wheels=$(mktemp -d)
  if { $PY -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$wheels" . &&
       $PY -m pip install -q --no-index --no-deps --target "$dir" "$wheels"/numbax-*.whl; } \
      >> "$log" 2>&1; then
    rm -rf "$wheels"; return 0
  fi
  rm -rf "$wheels"; tail -50 "$log"; return 1
}
