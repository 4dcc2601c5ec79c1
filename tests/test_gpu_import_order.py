"""numbax imported before or after JAX starts its backends, in a fresh
process each: a kernel op and a callable run right, and nothing prints a
NameError, a registration warning or a traceback. (test_import_order.py
checks the same orders with no op made.)
"""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

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
