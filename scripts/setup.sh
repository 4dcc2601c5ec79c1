#!/usr/bin/env bash
# Creates .venv in the repo (if missing), installs the pinned dependencies and
# builds numbax into it. Safe to run again: it only rebuilds numbax.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-dev.txt
# numbax is installed from its wheel, built the way a release is (isolated,
# against the oldest supported jaxlib's FFI headers: one binary for every
# supported jaxlib). NUMBAX_BUILD=source builds against the installed jaxlib
# instead (offline; that build runs only on jaxlibs at least as new);
# NUMBAX_BUILD=none only the tools (scripts/test.sh: its matrix tests wheels).
if [ "${NUMBAX_BUILD:-wheel}" = none ]; then
  exit 0
elif [ "${NUMBAX_BUILD:-wheel}" = source ]; then
  python -m pip install -q --no-build-isolation --no-deps --force-reinstall .
else
  wheel=$(PYTHON=python bash scripts/build_wheel.sh)
  python -m pip install -q --no-deps --force-reinstall "$wheel"
fi
python -c "import numbax, numbax._build_info as b, jax; print('numbax', numbax.__version__, 'built against XLA FFI API', '.'.join(map(str, b.XLA_FFI_API)), '(' + b.XLA_FFI_HEADERS_FROM + '), running on jax', jax.__version__)"
