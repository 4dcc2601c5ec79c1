"""One op for every shape, and scalar kernel parameters (docs/shapes_and_scalars.md).

``outs=`` and ``launch_dims=`` are functions of the call's arguments, so the
same op object serves three batch sizes in one jitted program; ``alpha`` and
``n`` reach the kernel by value, as Python and NumPy scalars. A callable
takes its ``outs`` and ``scratch`` from the inputs the same way. Results are
checked against numpy.

    python examples/shapes_and_scalars.py                       # on a GPU
    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu python examples/shapes_and_scalars.py
"""

import jax
import numpy as np
from numba import cuda

import numbax


# --8<-- [start:kernel]
@cuda.jit
def scale(x, alpha, n, out):
    """out[i] = alpha * x[i] for the first n elements, 0 after."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] if i < n else 0


# outs and launch_dims from the call's arguments: x arrives as a
# jax.ShapeDtypeStruct, alpha and n as their values.
scale_op = numbax.numba_cuda_kernel(
    scale,
    outs=lambda x, alpha, n: jax.ShapeDtypeStruct(x.shape, x.dtype),
    launch_dims=lambda x, alpha, n: x.shape[0])


@jax.jit
def program(a, b, c):
    # One op object, three shapes; alpha and n are passed by value
    # (a Python float is float64 in the kernel, np.float32 float32, an int
    # int64). They are static: each new value is a new key.
    return (scale_op(a, 2.0, a.shape[0]),
            scale_op(b, np.float32(0.5), 10),
            scale_op(c, -1.0, c.shape[0]))
# --8<-- [end:kernel]


# --8<-- [start:callable]
def normalize_launch(x, eps, out, total, stream):
    """out = x / (sum(x) + eps); total is a scratch buffer of one element."""
    total_kernel[1, 1, stream](x, total)
    divide[(x.shape[0] + 127) // 128, 128, stream](x, total, eps, out)


@cuda.jit
def total_kernel(x, total):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
    total[0] = s


@cuda.jit
def divide(x, total, eps, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] / (total[0] + eps)


normalize_op = numbax.numba_cuda_callable(
    normalize_launch,
    outs=lambda x, eps: jax.ShapeDtypeStruct(x.shape, x.dtype),
    scratch=lambda x, eps: jax.ShapeDtypeStruct((1,), x.dtype))
# --8<-- [end:callable]


def main():
    rng = np.random.default_rng(0)
    sizes = (7, 100, 1000) if numbax.simulator_enabled() else (7, 1000, 10**6)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for n in sizes)
    got = [np.asarray(r) for r in program(a, b, c)]
    want_b = np.where(np.arange(b.size) < 10, np.float32(0.5) * b, 0)
    ok_kernel = (np.allclose(got[0], 2.0 * a, rtol=1e-6)
                 and np.allclose(got[1], want_b, rtol=1e-6)
                 and np.allclose(got[2], -c, rtol=1e-6))
    print("kernel op, three shapes, matches numpy:", ok_kernel)

    ok_callable = True
    for n in sizes[:2]:
        x = rng.random(n).astype(np.float32)
        out = np.asarray(jax.jit(normalize_op, static_argnums=1)(x, 1e-3))
        ok_callable &= bool(np.allclose(out, x / (x.sum() + 1e-3), rtol=1e-4))
    print("callable op, outs and scratch from the inputs, matches numpy:",
          ok_callable)
    # vmap: the scalar is never batched.
    batch = rng.standard_normal((4, 32)).astype(np.float32)
    out = jax.vmap(lambda r: scale_op(r, 3.0, 32))(batch)
    ok_vmap = bool(np.allclose(np.asarray(out), 3.0 * batch, rtol=1e-6))
    print("vmap with a scalar matches numpy:", ok_vmap)
    return 0 if ok_kernel and ok_callable and ok_vmap else 1


if __name__ == "__main__":
    raise SystemExit(main())
