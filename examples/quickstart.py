"""numbax quickstart: two Numba kernels and a temporary, as one JAX op under jit.

Runs on a GPU when there is one; else set NUMBA_ENABLE_CUDASIM=1 (and
JAX_PLATFORMS=cpu) and the same code runs through Numba's CUDA simulator.
"""

import jax
import jax.numpy as jnp
import numpy as np
from numba import cuda

import numbax


@cuda.jit
def add_kernel(x, y, temp, n):
    i = cuda.grid(1)
    if i < n:
        temp[i] = x[i] + y[i]


@cuda.jit
def scale_kernel(temp, out, scale, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = temp[i] * scale


def my_op(x, y, out, stream):
    n = x.shape[0]
    temp = cuda.device_array(n, dtype=x.dtype)
    threads = 256
    blocks = (n + threads - 1) // threads
    add_kernel[blocks, threads, stream](x, y, temp, n)
    scale_kernel[blocks, threads, stream](temp, out, 2.0, n)


def main():
    fn = numbax.numba_cuda_callable(
        my_op, outs=jax.ShapeDtypeStruct((1024,), jnp.float32))

    @jax.jit
    def f(a, b):
        return fn(a, b)

    rng = np.random.default_rng(0)
    a = rng.standard_normal(1024).astype(np.float32)
    b = rng.standard_normal(1024).astype(np.float32)
    out = np.asarray(f(a, b))
    expected = 2.0 * (a + b)
    device = jax.devices()[0]
    mode = "Numba CUDA simulator" if numbax.simulator_enabled() else "CUDA"
    print(f"device: {device.device_kind} ({device.platform}), numba: {mode}")
    print("result[:5]  :", np.round(out[:5], 4))
    print("expected[:5]:", np.round(expected[:5], 4))
    ok = np.allclose(out, expected, rtol=1e-6)
    print("matches numpy:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
