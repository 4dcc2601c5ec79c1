"""numbax imported before or after JAX starts its backends.

Each order runs in a fresh process: importing numbax must log nothing, and a
program naming an op the process never created must get numbax's own
"not registered" error, which shows that numbax's FFI handlers are in place
without any op having been created. With ops made after the import, a
kernel op and a callable run right in either order, and nothing prints a
NameError, a registration warning or a traceback.
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


CHILD = r"""
import sys
order = sys.argv[1]
import jax
jax.config.update("jax_enable_x64", True)
if order == "jax_first":
    jax.devices()
import numbax
if order == "numbax_first":
    jax.devices()
import numpy as np, jax.numpy as jnp
from numba import cuda
@cuda.jit
def k(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 2
x = np.arange(100, dtype=np.float32)
op = numbax.numba_cuda_kernel(k, jax.ShapeDtypeStruct((100,), jnp.float32),
                              launch_dims=100)
def launch(x, out, stream):
    k[1, 128, stream](x, out)
c = numbax.numba_cuda_callable(launch, jax.ShapeDtypeStruct((100,), jnp.float32))
assert np.array_equal(np.asarray(jax.jit(op)(x)), x * 2)
assert np.array_equal(np.asarray(jax.jit(c)(x)), x * 2)
print("CHILD_OK")
"""


@pytest.mark.parametrize("order", ["jax_first", "numbax_first"])
def test_ops_run_in_either_import_order(order):
    proc = subprocess.run([sys.executable, "-c", CHILD, order], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "CHILD_OK" in proc.stdout, (
        f"exit status {proc.returncode}: {text[-3000:]}")
    for bad in ("NameError", "could not register", "Traceback"):
        assert bad not in text, f"printed {bad!r}: {text[-3000:]}"
