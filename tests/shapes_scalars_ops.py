"""Ops with shape functions and scalar parameters, defined once .

Imported by tests/test_shapes_and_scalars.py and by the fresh process it
starts (tests/shapes_scalars_child.py) under the same module name, so both
build the same keys: a program exported here runs there with nothing but
these ops created.
"""

import jax
import jax.numpy as jnp
import numpy as np
from numba import cuda

import numbax


@cuda.jit
def scale_add(x, alpha, shift, out):
    """out = alpha * x + shift, one thread per element of x (any rank 1)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = alpha * x[i] + shift


def same_as_first(x, *rest):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def extent_of_first(x, *rest):
    return x.shape[0]


# One op object for every shape: outs and launch_dims from the inputs.
scale_add_op = numbax.numba_cuda_kernel(
    scale_add, outs=same_as_first, launch_dims=extent_of_first)


def two_pass_launch(x, alpha, out, tmp, stream):
    """tmp = alpha * x; out = tmp + 1 (a scratch buffer between)."""
    blocks = (x.shape[0] + 31) // 32
    scale_add[blocks, 32, stream](x, alpha, 0.0, tmp)
    scale_add[blocks, 32, stream](tmp, 1.0, 1.0, out)


two_pass_op = numbax.numba_cuda_callable(
    two_pass_launch, outs=same_as_first, scratch=same_as_first)

SIZES = (5, 16, 33)


def program(a, b, c):
    """Three shapes through each op, scalars of three kinds."""
    return (scale_add_op(a, 2.0, np.float32(0.5)),
            scale_add_op(b, np.float32(-1.5), 3),
            scale_add_op(c, 3, True),
            two_pass_op(a, 0.25),
            two_pass_op(c, np.float32(4.0)))


def reference(a, b, c):
    f64 = np.float64
    return (2.0 * a.astype(f64) + 0.5, -1.5 * b.astype(f64) + 3,
            3 * c.astype(f64) + 1, 0.25 * a.astype(f64) + 1,
            4.0 * c.astype(f64) + 1)


SPECS = tuple(jax.ShapeDtypeStruct((n,), jnp.float32) for n in SIZES)


def inputs(seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(n).astype(np.float32) for n in SIZES)
