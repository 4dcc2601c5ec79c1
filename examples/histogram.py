"""A histogram with atomics, accumulated over chunks of data in place.

One ``@cuda.jit`` kernel, wrapped with ``numba_cuda_kernel`` (launched from
C++, no Python per call). Each block counts into a private histogram in
shared memory with ``cuda.atomic.add``, then adds it to the global one with
one atomic per bin, so contention on global memory stays low.

The running histogram is an input aliased to the output
(``input_output_aliases={1: 0}``): each call adds a chunk's counts to it in
place, and ``jax.lax.fori_loop`` streams every chunk through one jitted
program. Integer data and bins make the counts exact; they are checked
against ``np.bincount``.

    python examples/histogram.py                       # on a GPU
    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu python examples/histogram.py
"""

import jax
import jax.numpy as jnp
import numba
import numpy as np
from numba import cuda

import numbax

NUM_BINS = 64
BIN_WIDTH = 16          # values in [0, NUM_BINS * BIN_WIDTH)
ONE = numba.int32(1)


@cuda.jit
def histogram_kernel(values, counts_in, counts):
    # counts is counts_in (aliased): the kernel adds to the running histogram.
    local = cuda.shared.array(NUM_BINS, numba.int32)
    t = cuda.threadIdx.x
    for b in range(t, NUM_BINS, cuda.blockDim.x):
        local[b] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), values.shape[0], cuda.gridsize(1)):
        b = values[i] // BIN_WIDTH
        if 0 <= b < NUM_BINS:
            cuda.atomic.add(local, b, ONE)
    cuda.syncthreads()
    for b in range(t, NUM_BINS, cuda.blockDim.x):
        if local[b] != 0:
            cuda.atomic.add(counts, b, local[b])


def main():
    simulator = numbax.simulator_enabled()
    # Grid-stride loop: a fixed, small grid covers any chunk size.
    chunks, chunk, grid, block = (3, 512, 2, 64) if simulator else \
        (16, 1 << 20, 264, 256)
    hist = numbax.numba_cuda_kernel(
        histogram_kernel, jax.ShapeDtypeStruct((NUM_BINS,), jnp.int32),
        grid=grid, block=block, input_output_aliases={1: 0})

    @jax.jit
    def histogram_of(data):
        def body(k, counts):
            values = jax.lax.dynamic_slice_in_dim(data, k * chunk, chunk)
            return hist(values, counts)
        return jax.lax.fori_loop(0, chunks, body,
                                 jnp.zeros(NUM_BINS, jnp.int32))

    rng = np.random.default_rng(0)
    # A skewed distribution, with some values outside the binned range.
    data = (rng.gamma(2.0, 150.0, size=chunks * chunk)).astype(np.int32)
    counts = np.asarray(histogram_of(data))
    in_range = data[data < NUM_BINS * BIN_WIDTH]
    expected = np.bincount(in_range // BIN_WIDTH, minlength=NUM_BINS)

    device = jax.devices()[0]
    mode = "Numba CUDA simulator" if simulator else "CUDA"
    print(f"device: {device.device_kind} ({device.platform}), numba: {mode}")
    print(f"{data.size} values in {chunks} chunks, {NUM_BINS} bins; "
          f"{int(counts.sum())} counted, {data.size - in_range.size} out of range")
    print("counts[:8]  :", counts[:8].tolist())
    print("expected[:8]:", expected[:8].tolist())
    ok = bool(np.array_equal(counts, expected))
    print("matches numpy:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
