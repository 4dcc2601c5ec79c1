"""The Numba kernel every Numba-based row launches.

A module of its own, with numba.cuda as a module global, so that Numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1) can swap in its fake `cuda` module.
"""

import numba
from numba import cuda


@cuda.jit
def affine(x, y):
    """y = 2x + 1, one element per thread."""
    i = cuda.grid(1)
    if i < x.size:
        y[i] = numba.float32(2.0) * x[i] + numba.float32(1.0)


@cuda.jit
def affine_per_slice(x, y):
    """affine, plus a read of gridDim.y/z (both 1 in its own launch): the
    read makes jax.vmap launch it once per slice (docs/quickstart.md, vmap)."""
    i = cuda.grid(1)
    if i < x.size and cuda.gridDim.y * cuda.gridDim.z == 1:
        y[i] = numba.float32(2.0) * x[i] + numba.float32(1.0)


@cuda.jit
def zero_fill(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = numba.float32(0.0)


@cuda.jit
def spike_scatter(spikes, post, weight, out):
    """Event-driven synaptic input: a thread per presynaptic neuron; a neuron
    that spiked adds each synapse's weight to its target (atomics)."""
    i = cuda.grid(1)
    if i < spikes.size and spikes[i]:
        fan_out = post.shape[1]
        for k in range(fan_out):
            cuda.atomic.add(out, post[i, k], weight[i, k])


@cuda.jit
def spike_scatter_into(spikes, post, weight, zeros, out):
    """spike_scatter into an aliased zero buffer (zeros and out share it)."""
    i = cuda.grid(1)
    if i < spikes.size and spikes[i]:
        fan_out = post.shape[1]
        for k in range(fan_out):
            cuda.atomic.add(out, post[i, k], weight[i, k])


def affine_bf16_kernels():
    """(folded, per slice) bfloat16 kernels: y = fma(x, c[0], c[1]) through
    numba-cuda's bf16 intrinsics (linked code numbax reads through); the
    per-slice one also reads gridDim.y/z. Built on request: the simulator
    has no bf16 intrinsics (ImportError there)."""
    from numba.cuda.bf16 import hfma

    @cuda.jit
    def affine_bf16(x, c, y):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = hfma(x[i], c[0], c[1])

    @cuda.jit
    def affine_bf16_per_slice(x, c, y):
        i = cuda.grid(1)
        if i < x.size and cuda.gridDim.y * cuda.gridDim.z == 1:
            y[i] = hfma(x[i], c[0], c[1])

    return affine_bf16, affine_bf16_per_slice
