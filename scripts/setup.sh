#!/usr/bin/env bash
# Creates .venv in the repo (if missing), installs the pinned dependencies and
# builds numbax into it. Safe to run again: it only rebuilds numbax.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-dev.txt
# --no-build-isolation: build against the jaxlib just installed, whose XLA FFI
# headers must match the jaxlib that loads the extension.
python -m pip install -q --no-build-isolation --no-deps --force-reinstall .
python -c "import numbax, jax; print('numbax', numbax.__version__, 'built against jax', jax.__version__)"
