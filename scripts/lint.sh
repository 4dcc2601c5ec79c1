#!/usr/bin/env bash
# Static checks: ruff, mypy, clang-format, and the documentation site built in
# strict mode. Run from anywhere, with the project's venv active (or on PATH).
#
#   bash scripts/lint.sh                    # everything
#   bash scripts/lint.sh --no-clang-format  # skip the C++ format check
#
# Each check runs even if an earlier one failed; the exit status is 1 if any
# failed. Fix formatting with: clang-format -i csrc/*.h csrc/*.cc
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

clang=1
for arg in "$@"; do
  case "$arg" in
    --no-clang-format) clang=0 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "lint.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

failed=()
check() {
  local name=$1; shift
  echo "== lint: $name"
  if "$@"; then echo "   ok"; else failed+=("$name"); fi
}

check "ruff" ruff check src/numbax examples tests
# Paths and options come from [tool.mypy] in pyproject.toml.
check "mypy src/numbax" mypy
if [ "$clang" = 1 ]; then
  if command -v clang-format >/dev/null; then
    check "clang-format" clang-format --dry-run -Werror csrc/*.h csrc/*.cc
  else
    echo "== lint: clang-format"
    echo "   clang-format is not installed (apt-get install clang-format)" >&2
    failed+=("clang-format (not installed)")
  fi
fi
# The docs import nothing at build time (mkdocstrings reads the sources), and
# fetch nothing: a fresh site in build/site, warnings are errors.
check "mkdocs build --strict" env NO_MKDOCS_2_WARNING=1 \
  mkdocs build --strict --site-dir build/site

if [ ${#failed[@]} -gt 0 ]; then
  echo "lint FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "lint passed"
