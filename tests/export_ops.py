"""numbax ops defined once, imported by the tests AND the fresh processes they start.

A compiled or exported program names each numbax op by a key built from the
function's module and qualified name and the call signature, so the process
that runs it must create the same ops: importing this module (as
``export_ops``, with tests/ on sys.path) in both processes does exactly that.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from numba import cuda

import numbax
from shared_kernels import affine as affine_kernel, row_scale as row_scale_kernel

N = 64
ROWS, COLS = 16, 4
F32 = jnp.float32


@cuda.jit
def square_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * x[i]


def affine_launch(x, out, stream):
    affine_kernel[(x.shape[0] + 31) // 32, 32, stream](x, out)


def row_scale_launch(m, s, out, stream):
    row_scale_kernel[(m.shape[0] + 31) // 32, 32, stream](m, s, out)


def offset_launch(x, out, stream):
    affine_kernel[(x.shape[0] + 31) // 32, 32, stream](x, out)


def captured_launch(x, out, stream):
    affine_kernel[(x.shape[0] + 31) // 32, 32, stream](x, out)


# Which ops importing this module creates: all of them, unless a fresh
# process of tests/test_export.py asks for fewer (EXPORT_OPS_CREATE=callable
# creates only callable_op, "none" none of them).
_CREATE = os.environ.get("EXPORT_OPS_CREATE", "all")
callable_op = kernel_op = rows_op = named_op = captured_op = None
if _CREATE in ("all", "callable"):
    callable_op = numbax.numba_cuda_callable(
        affine_launch, jax.ShapeDtypeStruct((N,), F32))
if _CREATE == "all":
    kernel_op = numbax.numba_cuda_kernel(
        square_kernel, jax.ShapeDtypeStruct((N,), F32), launch_dims=N)
    rows_op = numbax.numba_cuda_callable(
        row_scale_launch, jax.ShapeDtypeStruct((ROWS, COLS), F32),
        batch_partitionable=True)
    # An explicit name: the key no longer depends on where the function lives.
    named_op = numbax.numba_cuda_callable(
        offset_launch, jax.ShapeDtypeStruct((N,), F32), name="export_ops_named")
    captured_op = numbax.numba_cuda_callable(
        captured_launch, jax.ShapeDtypeStruct((N,), F32), capture=True)

SPECS = (jax.ShapeDtypeStruct((N,), F32),
         jax.ShapeDtypeStruct((ROWS, COLS), F32),
         jax.ShapeDtypeStruct((ROWS,), F32))


def program(x, m, s):
    y = kernel_op(callable_op(x))
    return y, rows_op(m, s), named_op(captured_op(y))


def reference(x, m, s):
    y = (2 * x + 1) ** 2
    rows = m * s[:, None] + np.arange(COLS, dtype=np.float32)
    return y, rows, 2 * (2 * y + 1) + 1


def inputs(seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(N).astype(np.float32),
            rng.standard_normal((ROWS, COLS)).astype(np.float32),
            rng.standard_normal(ROWS).astype(np.float32))


def mismatched_callable_op():
    """affine_launch with other outs than callable_op: not what a program
    exported with callable_op calls."""
    return numbax.numba_cuda_callable(
        affine_launch, jax.ShapeDtypeStruct((N // 2,), F32))
