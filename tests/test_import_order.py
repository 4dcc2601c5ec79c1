"""numbax imported before or after JAX starts its backends.

Each order runs in a fresh process: importing numbax must log nothing, and a
program naming an op the process never created must get numbax's own
"not registered" error, which shows that numbax's FFI handlers are in place
without any op having been created.
"""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# A program calling numbax's callable target with a key no op made: only
# numbax's handler can answer it with numbax's message.
_CHILD = r"""
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
ORDER = sys.argv[1]
if ORDER == "jax-first":
    import jax
    jax.devices()
    import numbax
else:
    import numbax
    import jax
    jax.devices()
import jax.numpy as jnp
spec = jax.ShapeDtypeStruct((4,), jnp.float32)
target = numbax.runtime.targets.CALLABLE_TARGET
try:
    out = jax.jit(lambda v: jax.ffi.ffi_call(target, spec)(
        v, key="no.such/op;x=1/in=float32[4]"))(jnp.ones(4))
    jax.block_until_ready(out)
except Exception as exc:
    print("ERROR:", type(exc).__name__, str(exc)[-3000:])
"""


@pytest.mark.parametrize("order", ["jax-first", "numbax-first"])
def test_import_order_registers_targets_without_a_name_error(order):
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", _CHILD, order], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Before the fix: "could not register its FFI targets ... (NameError:
    # name '_resolve_callable' is not defined)" when JAX started first.
    assert "NameError" not in proc.stderr, proc.stderr[-3000:]
    assert "could not register" not in proc.stderr, proc.stderr[-3000:]
    # numbax's handler answered (XLA's would be "No FFI handler registered").
    assert "is not registered in this process" in proc.stdout, (
        proc.stdout[-2000:] + proc.stderr[-2000:])
    assert "No FFI handler" not in proc.stdout
