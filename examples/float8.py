"""float8 arrays in and out of Numba kernels: kernels get their bits.

A float8 buffer (``jnp.float8_e4m3fn``, ``float8_e5m2``, ...) reaches a
kernel as a ``uint8`` array of the same shape, a view of the same memory.
This example decodes float8_e4m3fn values to float32 with a 256-entry
table (computed by ml_dtypes, frozen into the kernel as a constant) and
takes absolute values in float8 by clearing the sign bit; both are checked
against ml_dtypes.

    python examples/float8.py                       # on a GPU
    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu python examples/float8.py
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from numba import cuda

import numbax

N = 512 if numbax.simulator_enabled() else 1 << 20

# --8<-- [start:decode]
# Every float8_e4m3fn code's float32 value: a module-level numpy array that
# a kernel reads becomes a constant array in the kernel's code.
E4M3FN_TO_F32 = np.arange(256, dtype=np.uint8).view(
    ml_dtypes.float8_e4m3fn).astype(np.float32)


@cuda.jit
def dequantize(x, scale, out):
    # x: uint8 (the float8 bits), scale: float32[1], out: float32.
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = E4M3FN_TO_F32[x[i]] * scale[0]


@cuda.jit
def absolute(x, out):
    # float8 in and out: clearing the sign bit is abs() in e4m3fn.
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] & 0x7F


dequantize_op = numbax.numba_cuda_kernel(
    dequantize, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
abs_op = numbax.numba_cuda_kernel(
    absolute, jax.ShapeDtypeStruct((N,), jnp.float8_e4m3fn), launch_dims=N)
# --8<-- [end:decode]


def main():
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(N) * 20).astype(np.float32)
    scale = np.float32(0.5)

    @jax.jit
    def f(v, s):
        q = v.astype(jnp.float8_e4m3fn)   # quantize in JAX (fused by XLA)
        return dequantize_op(q, s), abs_op(q)

    deq, absq = f(values, jnp.array([scale]))
    q = values.astype(ml_dtypes.float8_e4m3fn)
    expected_deq = q.astype(np.float32) * scale
    ok1 = np.array_equal(np.asarray(deq), expected_deq)
    ok2 = (absq.dtype == jnp.float8_e4m3fn and np.array_equal(
        np.asarray(absq).astype(np.float32), np.abs(q.astype(np.float32))))
    device = jax.devices()[0]
    mode = "Numba CUDA simulator" if numbax.simulator_enabled() else "CUDA"
    print(f"device: {device.device_kind} ({device.platform}), numba: {mode}")
    print("dequantized[:4]:", np.asarray(deq)[:4])
    print("dequantize matches ml_dtypes:", ok1)
    print("abs in float8 matches ml_dtypes:", ok2)
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
