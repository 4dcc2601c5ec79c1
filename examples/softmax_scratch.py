"""Row-wise softmax in two kernels, with the row statistics in a scratch buffer.

Kernel 1 computes each row's maximum and the sum of ``exp(x - max)`` into a
``(rows, 2)`` scratch buffer; kernel 2 normalises every element with them.
The scratch buffer is allocated by XLA for the call (no ``cuda.device_array``
inside the function, so the op may use ``capture=True`` and be replayed as a
CUDA graph) and is not returned. The op is used inside a larger jitted
function and the result is checked against numpy.

    python examples/softmax_scratch.py                       # on a GPU
    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu python examples/softmax_scratch.py
"""

import math

import jax
import jax.numpy as jnp
import numba
import numpy as np
from numba import cuda

import numbax


# --8<-- [start:softmax]
@cuda.jit
def row_stats(x, stats):
    """One thread per row: stats[r] = (max of the row, sum of exp(x - max))."""
    r = cuda.grid(1)
    if r < x.shape[0]:
        m = x[r, 0]
        for c in range(1, x.shape[1]):
            m = max(m, x[r, c])
        s = numba.float32(0.0)
        for c in range(x.shape[1]):
            s += math.exp(x[r, c] - m)
        stats[r, 0] = m
        stats[r, 1] = s


@cuda.jit
def normalize(x, stats, out):
    """One thread per element."""
    r, c = cuda.grid(2)
    if r < x.shape[0] and c < x.shape[1]:
        out[r, c] = math.exp(x[r, c] - stats[r, 0]) / stats[r, 1]


def softmax_launch(x, out, stats, stream):
    rows, cols = x.shape
    row_stats[(rows + 127) // 128, 128, stream](x, stats)
    block = (16, 16)
    grid = ((rows + 15) // 16, (cols + 15) // 16)
    normalize[grid, block, stream](x, stats, out)


def make_softmax(rows, cols):
    return numbax.numba_cuda_callable(
        softmax_launch,
        outs=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
        scratch=jax.ShapeDtypeStruct((rows, 2), jnp.float32),
        capture=True)
# --8<-- [end:softmax]


def main():
    simulator = numbax.simulator_enabled()
    rows, cols = (24, 40) if simulator else (2048, 1000)
    softmax = make_softmax(rows, cols)

    @jax.jit
    def attention_weights(logits, temperature):
        probs = softmax(logits / temperature)
        return probs, probs.sum(axis=1)

    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    probs, row_sums = attention_weights(logits, np.float32(0.5))
    probs = np.asarray(probs)

    scaled = logits.astype(np.float64) / 0.5
    e = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)

    device = jax.devices()[0]
    mode = "Numba CUDA simulator" if simulator else "CUDA"
    print(f"device: {device.device_kind} ({device.platform}), numba: {mode}")
    print(f"softmax of a {rows}x{cols} matrix; row sums in "
          f"[{float(row_sums.min()):.6f}, {float(row_sums.max()):.6f}]")
    print("probs[0, :4]   :", np.round(probs[0, :4], 6))
    print("expected[0, :4]:", np.round(expected[0, :4], 6))
    ok = bool(np.allclose(probs, expected, rtol=1e-5, atol=1e-7))
    print("matches numpy:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
