"""The cold-start benchmark's kernels (cold_start.py), compiled with
``cache=True`` so that Numba's on-disk cache can hold them between
processes. Imported only by the numbax variants of that benchmark, whose
processes set ``NUMBA_CACHE_DIR`` (the suite's kernels, kernels.py, keep no
cache: they must not write next to an installed package)."""

from numba import cuda


@cuda.jit(cache=True)
def zero_fill(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 0.0


@cuda.jit(cache=True)
def spike_scatter(spikes, post, weight, out):
    """A thread per presynaptic neuron: one that spiked adds each synapse's
    weight to its target."""
    i = cuda.grid(1)
    if i < spikes.size and spikes[i]:
        for k in range(post.shape[1]):
            cuda.atomic.add(out, post[i, k], weight[i, k])


@cuda.jit(cache=True)
def spike_scatter_into(spikes, post, weight, zeros, out):
    """spike_scatter into an aliased zero buffer (zeros and out share it)."""
    i = cuda.grid(1)
    if i < spikes.size and spikes[i]:
        for k in range(post.shape[1]):
            cuda.atomic.add(out, post[i, k], weight[i, k])
