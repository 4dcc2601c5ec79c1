#!/usr/bin/env bash
# Regenerates src/numbax/_core.pyi, the type stub of numbax's C++ extension,
# from the extension installed in the active Python: rebuild numbax first
# after changing a binding in csrc/ (pip install --no-build-isolation
# --no-deps --force-reinstall .), then run
#
#   bash scripts/gen_stubs.sh           # rewrite src/numbax/_core.pyi
#   bash scripts/gen_stubs.sh --check   # exit 1 if it is out of date
#
# It runs nanobind's stubgen as the build does (CMakeLists.txt,
# nanobind_add_stub), so the checked-in stub, which mypy reads, is the one
# the wheel ships; tests/test_stub.py fails while they differ. Needs the
# nanobind that pyproject.toml pins (requirements-dev.txt installs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python}
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "gen_stubs.sh: unknown option $1" >&2; exit 2 ;;
esac
# The installed package's folder, found without importing numbax (or jax);
# from the repository root src/numbax is not on sys.path.
pkg=$("$PY" -c "import importlib.util as u; s = u.find_spec('numbax'); print(list(s.submodule_search_locations)[0])")
if ! compgen -G "$pkg/_core*.so" >/dev/null; then
  echo "gen_stubs.sh: no built extension in $pkg; install numbax first" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The extension imports as the top-level module _core, as in the build tree.
"$PY" -m nanobind.stubgen -q -i "$pkg" -m _core -o "$out/_core.pyi"
if [ "$check" = 1 ]; then
  if ! diff -u src/numbax/_core.pyi "$out/_core.pyi"; then
    echo "src/numbax/_core.pyi is out of date: bash scripts/gen_stubs.sh" >&2
    exit 1
  fi
  echo "src/numbax/_core.pyi is up to date"
else
  cp "$out/_core.pyi" src/numbax/_core.pyi
  echo "wrote src/numbax/_core.pyi"
fi
