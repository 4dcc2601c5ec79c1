"""numba_kernel: a Numba @njit kernel as a JAX op on the CPU.

numbax compiles a small native wrapper around the kernel once, when the op is
traced; XLA then calls it from C++ on every run, with no Python and no GIL
per call. This example checks the op, its jax.vmap and a jitted chain of 100
ops against numpy, then times the chain beside the same op written with
jax.pure_callback (a host round trip into Python per op).

It runs on JAX's CPU backend on any machine (on a GPU machine too: the arrays
are put on the CPU). No GPU, no CUDA and no simulator are needed.

    python examples/numba_kernel.py
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numba
import numpy as np

import numbax

N = 4096          # elements per op
BATCH = 64        # slices under jax.vmap
CHAIN = 100       # ops in the timed program


@numba.njit
def affine(x, y):
    """y = 2x + 1: the inputs first, then the outputs, which it writes."""
    for i in range(x.size):
        y[i] = np.float32(2) * x[i] + np.float32(1)


def chain_of(op):
    def chain(v):
        for _ in range(CHAIN):
            v = op(v)
        return v
    return jax.jit(chain)


def us_per_op(program, x, runs=20):
    """Median time of one program run, per op, in microseconds."""
    program(x).block_until_ready()          # compile and warm up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        program(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / CHAIN * 1e6


def main() -> int:
    rng = np.random.default_rng()
    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    op = numbax.numba_kernel(affine, spec)
    ok = True
    with jax.default_device(jax.devices("cpu")[0]):
        x = rng.uniform(-1, 1, N).astype(np.float32)
        got = jax.jit(op)(x)
        match = bool(np.allclose(got, 2 * x + 1, rtol=1e-6))
        print(f"numba_kernel matches numpy: {match}")
        ok &= match

        # One handler call for the whole batch: the wrapper loops the slices.
        xb = rng.uniform(-1, 1, (BATCH, N)).astype(np.float32)
        got = jax.jit(jax.vmap(op))(xb)
        match = bool(np.allclose(got, 2 * xb + 1, rtol=1e-6))
        print(f"vmap over {BATCH} x {N} matches numpy: {match}")
        ok &= match

        want = x.copy()
        for _ in range(CHAIN):
            want = np.float32(2) * want + np.float32(1)
        fast = chain_of(op)
        match = bool(np.allclose(fast(x), want, rtol=1e-5))
        print(f"chain of {CHAIN} matches numpy: {match}")
        ok &= match

        def host(v):
            return np.float32(2) * np.asarray(v) + np.float32(1)
        slow = chain_of(lambda v: jax.pure_callback(host, spec, v))
        t_kernel = us_per_op(fast, jnp.asarray(x))
        t_callback = us_per_op(slow, jnp.asarray(x))
        print(f"time per op, {N} float32 in a jitted chain of {CHAIN}: "
              f"numba_kernel {t_kernel:.2f} us, jax.pure_callback "
              f"{t_callback:.2f} us ({t_callback / t_kernel:.0f}x slower)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
