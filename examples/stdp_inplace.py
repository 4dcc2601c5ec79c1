"""An STDP weight update, in place, through input/output aliasing.

Pair-based spike-timing-dependent plasticity on CSR synapses: for a synapse
from presynaptic neuron i to postsynaptic neuron j,

    w <- clip(w + A_plus * x_pre[i] * post_spike[j]
                - A_minus * y_post[j] * pre_spike[i], 0, w_max)

where x_pre and y_post are the neurons' spike traces. The weights are input 0
and output 0 of the op (``input_output_aliases={0: 0}``), so the kernel
writes them where they are; with ``donate_argnums`` under ``jax.jit``, XLA
reuses the caller's buffer too, and no copy of the weights is made per step.
Several steps are checked against numpy, and the example prints whether the
weights stayed in the same buffer.

    python examples/stdp_inplace.py                       # on a GPU
    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu python examples/stdp_inplace.py
"""

from functools import partial

import jax
import jax.numpy as jnp
import numba
import numpy as np
from numba import cuda

import numbax

A_PLUS, A_MINUS, W_MAX = numba.float32(0.01), numba.float32(0.012), numba.float32(1.0)
ZERO = numba.float32(0.0)
THREADS = 128


@cuda.jit
def stdp_kernel(w, pre_of, post_of, x_pre, y_post, pre_spike, post_spike, w_out):
    k = cuda.grid(1)
    if k < w.shape[0]:
        i, j = pre_of[k], post_of[k]
        dw = ZERO
        if post_spike[j]:
            dw += A_PLUS * x_pre[i]
        if pre_spike[i]:
            dw -= A_MINUS * y_post[j]
        w_out[k] = min(max(w[k] + dw, ZERO), W_MAX)   # w_out is w (aliased)


def stdp_launch(w, pre_of, post_of, x_pre, y_post, pre_spike, post_spike,
                w_out, stream):
    blocks = (w.shape[0] + THREADS - 1) // THREADS
    stdp_kernel[blocks, THREADS, stream](w, pre_of, post_of, x_pre, y_post,
                                         pre_spike, post_spike, w_out)


def reference(w, pre_of, post_of, x_pre, y_post, pre_spike, post_spike):
    dw = (np.float32(A_PLUS) * x_pre[pre_of] * post_spike[post_of]
          - np.float32(A_MINUS) * y_post[post_of] * pre_spike[pre_of])
    return np.clip(w + dw.astype(np.float32), 0, 1).astype(np.float32)


def main():
    simulator = numbax.simulator_enabled()
    n_pre, n_post, p, steps = (40, 30, 0.3, 4) if simulator else \
        (4096, 4096, 0.05, 50)
    rng = np.random.default_rng(0)
    connected = rng.random((n_pre, n_post)) < p
    pre_of, post_of = (a.astype(np.int32) for a in np.nonzero(connected))
    w0 = rng.uniform(0, 1, size=pre_of.size).astype(np.float32)

    update = numbax.numba_cuda_callable(
        stdp_launch, outs=jax.ShapeDtypeStruct(w0.shape, jnp.float32),
        input_output_aliases={0: 0})

    @partial(jax.jit, donate_argnums=0)
    def stdp_step(w, pre_of, post_of, x_pre, y_post, pre_spike, post_spike):
        return update(w, pre_of, post_of, x_pre, y_post, pre_spike, post_spike)

    w = jnp.asarray(w0)
    synapse_pre, synapse_post = jnp.asarray(pre_of), jnp.asarray(post_of)
    first_buffer = w.unsafe_buffer_pointer()
    same_buffer = True
    expected = w0
    for _ in range(steps):
        x_pre = rng.uniform(0, 1, n_pre).astype(np.float32)
        y_post = rng.uniform(0, 1, n_post).astype(np.float32)
        pre_spike = rng.random(n_pre) < 0.3
        post_spike = rng.random(n_post) < 0.3
        w = stdp_step(w, synapse_pre, synapse_post, x_pre, y_post, pre_spike,
                      post_spike)
        same_buffer &= w.unsafe_buffer_pointer() == first_buffer
        expected = reference(expected, pre_of, post_of, x_pre, y_post,
                             pre_spike, post_spike)
    got = np.asarray(w)

    device = jax.devices()[0]
    mode = "Numba CUDA simulator" if simulator else "CUDA"
    print(f"device: {device.device_kind} ({device.platform}), numba: {mode}")
    print(f"{pre_of.size} synapses, {steps} STDP steps; weights in "
          f"[{got.min():.4f}, {got.max():.4f}]")
    print("weights updated in place (same buffer every step):", bool(same_buffer))
    ok = bool(np.allclose(got, expected, rtol=1e-5, atol=1e-6))
    print("matches numpy:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
