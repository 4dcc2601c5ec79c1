"""Where the plain callable's time goes: Numba's launch vs numbax's bridge.

python -m numbax.bench.bridge_cost   (or: python -m benchmarks.bridge_cost)

Times, in one process on a GPU: (a) the Numba launch alone, from a Python loop
over the same cached device arrays and stream object (what `func` costs);
(b) one op of a jitted chain of numbax callables; (c) the native plain FFI
handler's op in the same chain. (b) - (a) - (c) is numbax's own share.
"""

from __future__ import annotations

import statistics
import time


def _median_us(fn, inner: int, repeats: int = 7) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(inner)
        samples.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(samples)


def main() -> int:
    import jax
    import jax.numpy as jnp
    from numba import cuda

    import numbax

    from . import impls, timing
    from .kernels import affine
    from .native import build_and_register

    n, length = 4096, 100
    device = jax.devices()[0]
    env = impls.Env(on_gpu=True)
    env.native = build_and_register(getattr(device, "compute_capability", None), None)
    impls.warm_numba_kernel(env)

    x = cuda.to_device(jnp.ones(n, jnp.float32).__array__())
    y = cuda.device_array(n, dtype=x.dtype)
    stream = cuda.stream()
    blocks = -(-n // 256)

    def numba_only(k):
        for _ in range(k):
            affine[blocks, 256, stream](x, y)
        stream.synchronize()

    numba_only(100)
    launch = _median_us(numba_only, 2000)

    def per_op(op):
        chain = jax.jit(timing.chain_fn(op, length))
        v = jnp.ones(n, jnp.float32)
        chain(v).block_until_ready()

        def run(k):
            for _ in range(k):
                chain(v).block_until_ready()
        return _median_us(run, 10) / length

    callable_op = numbax.numba_cuda_callable(
        lambda a, b, s: affine[blocks, 256, s](a, b),
        jax.ShapeDtypeStruct((n,), jnp.float32))
    numbax_us = per_op(callable_op)
    native_call = jax.ffi.ffi_call(env.native.plain, jax.ShapeDtypeStruct((n,), jnp.float32))
    native_us = per_op(lambda v: native_call(v))
    kernel_op = numbax.numba_cuda_kernel(
        affine, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n)
    capture_op = numbax.numba_cuda_callable(
        lambda a, b, s: affine[blocks, 256, s](a, b),
        jax.ShapeDtypeStruct((n,), jnp.float32), capture=True)
    native_cb = jax.ffi.ffi_call(env.native.cmd_buffer,
                                 jax.ShapeDtypeStruct((n,), jnp.float32))
    numbax.reset_bridge_counters()
    v1 = jnp.ones(n, jnp.float32)

    def single_loop(jitted):
        def single(k):
            for _ in range(k):
                jitted(v1).block_until_ready()
        return single

    for name, op in [("native cmd-buffer op", lambda v: native_cb(v)),
                     ("numbax kernel op", kernel_op),
                     ("numbax capture op", capture_op)]:
        print(f"{name:24s}{per_op(op):7.2f} us  {numbax.bridge_counters()}")
        single = single_loop(jax.jit(op))
        single(5)
        print(f"{name + ' single':24s}{_median_us(single, 50):7.2f} us  "
              f"{numbax.bridge_counters()}")
    print(f"numba launch alone      {launch:7.2f} us")
    print(f"native plain op (chain) {native_us:7.2f} us")
    print(f"numbax callable op      {numbax_us:7.2f} us")
    print(f"numbax bridge share     {numbax_us - launch - native_us:7.2f} us "
          "(callable - numba launch - native op)")
    print(numbax.bridge_counters())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
