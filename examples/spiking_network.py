"""Event-driven spiking network: spikes through a CSR connectivity matrix, then
a neuron update, as one numbax op per time step.

One step of N leaky integrate-and-fire neurons is a ``numba_cuda_callable``
that launches three kernels on XLA's stream:

1. zero the synaptic current (a ``scratch`` buffer XLA allocates for the call),
2. propagate the spikes, event-driven: one thread per presynaptic neuron, and
   only neurons that spiked walk their CSR row and add their weights to their
   targets' current with atomics (the work grows with the number of spikes,
   not with the number of synapses),
3. update the neurons: ``v <- v/2 + I + bias``; a neuron spikes where
   ``v >= 1`` and is reset to 0.

``capture=True``: the step keeps the capture rules (launches only on the
stream, no allocation, no host synchronisation), so on a GPU it is replayed
as a CUDA graph without Python. ``jax.lax.scan`` runs every step in one jitted
program, and the spike raster is checked against the same model in numpy.

Weights, biases and voltages are multiples of 1/64 (dyadic), so every sum is
exact in float32 and the result does not depend on the order of the atomics.

    python examples/spiking_network.py                       # on a GPU
    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu python examples/spiking_network.py
"""

import jax
import jax.numpy as jnp
import numba
import numpy as np
from numba import cuda

import numbax

THREADS = 128
HALF, ONE, ZERO = numba.float32(0.5), numba.float32(1.0), numba.float32(0.0)


@cuda.jit
def zero(current):
    i = cuda.grid(1)
    if i < current.shape[0]:
        current[i] = ZERO


@cuda.jit
def propagate(spikes, indptr, indices, weights, current):
    pre = cuda.grid(1)
    if pre < spikes.shape[0] and spikes[pre]:
        for k in range(indptr[pre], indptr[pre + 1]):
            cuda.atomic.add(current, indices[k], weights[k])


@cuda.jit
def update(v, current, bias, v_out, spikes_out):
    i = cuda.grid(1)
    if i < v.shape[0]:
        x = v[i] * HALF + current[i] + bias[i]
        fired = x >= ONE
        spikes_out[i] = fired
        v_out[i] = ZERO if fired else x


def lif_step(v, spikes, indptr, indices, weights, bias,  # inputs
             v_out, spikes_out,                           # outputs
             current,                                     # scratch
             stream):
    blocks = (v.shape[0] + THREADS - 1) // THREADS
    zero[blocks, THREADS, stream](current)
    propagate[blocks, THREADS, stream](spikes, indptr, indices, weights, current)
    update[blocks, THREADS, stream](v, current, bias, v_out, spikes_out)


def random_network(rng, n, p):
    """CSR connectivity (rows: presynaptic), 80% excitatory neurons."""
    connected = rng.random((n, n)) < p
    np.fill_diagonal(connected, False)
    excitatory = rng.random(n) < 0.8
    magnitude = rng.integers(8, 25, size=(n, n)) / 64
    dense = np.where(excitatory[:, None], magnitude, -2 * magnitude)
    dense = np.where(connected, dense, 0).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum(connected.sum(1))]).astype(np.int32)
    indices = np.nonzero(connected)[1].astype(np.int32)
    return indptr, indices, dense[connected]


def reference(v, spikes, indptr, indices, weights, bias, steps):
    raster = []
    for _ in range(steps):
        current = np.zeros_like(v)
        for pre in np.flatnonzero(spikes):
            row = slice(indptr[pre], indptr[pre + 1])
            np.add.at(current, indices[row], weights[row])
        x = v * np.float32(0.5) + current + bias
        spikes = x >= 1
        v = np.where(spikes, np.float32(0), x).astype(np.float32)
        raster.append(spikes)
    return v, np.array(raster)


def main():
    simulator = numbax.simulator_enabled()
    # The simulator runs one Python thread per CUDA thread: keep it small there.
    n, steps, p = (96, 12, 0.1) if simulator else (4096, 200, 0.0025)
    rng = np.random.default_rng(0)
    indptr, indices, weights = random_network(rng, n, p)
    bias = (rng.integers(16, 33, size=n) / 64).astype(np.float32)
    v0 = (rng.integers(0, 64, size=n) / 64).astype(np.float32)
    spikes0 = rng.random(n) < 0.2

    step = numbax.numba_cuda_callable(
        lif_step,
        outs=(jax.ShapeDtypeStruct((n,), jnp.float32),
              jax.ShapeDtypeStruct((n,), jnp.bool_)),
        scratch=jax.ShapeDtypeStruct((n,), jnp.float32),
        capture=True)

    @jax.jit
    def simulate(v, spikes, indptr, indices, weights, bias):
        def body(state, _):
            v, spikes = step(state[0], state[1], indptr, indices, weights, bias)
            return (v, spikes), spikes
        (v, _), raster = jax.lax.scan(body, (v, spikes), None, length=steps)
        return v, raster

    v, raster = simulate(v0, spikes0, indptr, indices, weights, bias)
    v, raster = np.asarray(v), np.asarray(raster)
    want_v, want_raster = reference(v0, spikes0, indptr, indices, weights, bias,
                                    steps)

    device = jax.devices()[0]
    mode = "Numba CUDA simulator" if simulator else "CUDA"
    print(f"device: {device.device_kind} ({device.platform}), numba: {mode}")
    print(f"{n} neurons, {indices.size} synapses, {steps} steps")
    print("spikes per step:", raster.sum(1)[:12].tolist(),
          "..." if steps > 12 else "")
    ok = bool(np.array_equal(raster, want_raster) and
              np.allclose(v, want_v, rtol=0, atol=1e-6))
    print("matches numpy:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
