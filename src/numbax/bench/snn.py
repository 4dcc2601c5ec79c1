"""The spiking network both the workload rows (workloads.py) and the
cold-start rows (cold_start.py) run: N leaky integrate-and-fire neurons,
``fan_out`` random outgoing synapses each (weights +-1/64, exact in
float32), ``steps`` steps in ``lax.scan``, the synaptic input computed by
the op under test.

It imports only numpy and JAX (no numbax, no Numba): cold_start.py loads
it by path in processes that time their imports.
"""

from __future__ import annotations

import numpy as np


def network(neurons: int, fan_out: int, seed: int):
    """(post, weight, drive, v0): targets and weights per synapse, the
    constant drive and the initial potential per neuron."""
    rng = np.random.default_rng(seed)
    n, k = neurons, fan_out
    post = rng.integers(0, n, size=(n, k), dtype=np.int32)
    weight = np.where(rng.random((n, k)) < 0.8, 1.0, -1.0).astype(
        np.float32) / 64
    drive = rng.uniform(0.0, 0.1, n).astype(np.float32)
    v0 = rng.uniform(0.0, 1.0, n).astype(np.float32)
    return post, weight, drive, v0


def segment_sum_input(neurons: int):
    """The pure-JAX synaptic input: every synapse's weight where its
    source spiked, summed per target (``segment_sum``)."""
    import jax
    import jax.numpy as jnp

    def syn_input(spikes, post, weight):
        contrib = jnp.where(spikes[:, None], weight, 0.0).reshape(-1)
        return jax.ops.segment_sum(contrib, post.reshape(-1),
                                   num_segments=neurons)
    return syn_input


def simulate(syn_input, steps: int):
    """The jitted network: ``run(v0, drive, post, weight)`` returns the
    spike count of every step; ``syn_input(spikes, post, weight)`` is the
    op under test."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def run(v0, drive, post, weight):
        def step(carry, _):
            v, spikes = carry
            syn = syn_input(spikes.astype(jnp.uint8), post, weight)
            v = v * jnp.float32(0.95) + drive + syn
            fired = v > 1.0
            v = jnp.where(fired, jnp.float32(0.0), v)
            return (v, fired), jnp.sum(fired, dtype=jnp.int32)
        init = (v0, jnp.zeros(v0.shape, bool))
        _, counts = jax.lax.scan(step, init, None, length=steps)
        return counts
    return run
