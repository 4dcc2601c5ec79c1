"""Where the plain callable's time goes: launches, numbax's bridge, XLA.

python -m numbax.bench.bridge_cost

Times, in one process on a GPU:

(a) Numba's launch from a bare Python loop over cached device arrays and one
    stream object, and its configuration step alone (``kernel[grid, block,
    stream]`` without the call);
(b) the same launch made inside a plain callable's func, per launch: through
    numbax's fast path (the default) and through Numba (``fast_launch=False``);
(c) one op of a jitted chain of plain callables, with and without the fast
    path, next to the native plain FFI handler's op in the same chain, and
    single jitted calls of each;
(d) the ops XLA records into CUDA graphs (native command-buffer handler,
    numbax kernel, captured callable), chain and single;
(e) the plain callable's chain op stage by stage, in interleaved rounds (so
    the host's drift hits every row alike): a native handler that launches
    nothing (what XLA itself spends on a custom call); the callable's call
    stopped after each stage of the bridge (``_core.set_bridge_stop``: call
    frame decoded, GIL taken, func's arrays found, guard entered and left);
    func returning at once, with and without numbax's guard against JAX
    calls inside func; func only configuring the launch; the full fast
    launch, the same launching Numba's CUkernel handle instead of the
    context's CUfunction, and with the guard off;
(f) which thread XLA runs func on (the caller's, or one of its own).

numbax's bridge share is (callable op) - (its launch inside func) - (native
op): what the FFI call, the GIL and the call of func cost on their own.
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


def _line(label: str, us: float, note: str = "") -> None:
    print(f"{label:48s}{us:8.2f} us{('  ' + note) if note else ''}")


def main() -> int:
    import jax
    import jax.numpy as jnp
    from numba import cuda

    import numbax

    from . import impls, timing
    from .kernels import affine
    from .native import build_and_register

    n, length = 4096, 100
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    device = jax.devices()[0]
    env = impls.Env(on_gpu=True)
    env.native = build_and_register(getattr(device, "compute_capability", None), None)
    impls.warm_numba_kernel(env)
    blocks = -(-n // 256)

    # (a) Numba alone.
    x = cuda.to_device(jnp.ones(n, jnp.float32).__array__())
    y = cuda.device_array(n, dtype=x.dtype)
    stream = cuda.stream()

    def numba_only(k):
        for _ in range(k):
            affine[blocks, 256, stream](x, y)
        stream.synchronize()

    def configure_only(k):
        for _ in range(k):
            affine[blocks, 256, stream]

    numba_only(100)
    launch = _median_us(numba_only, 2000)
    configure = _median_us(configure_only, 20000)

    # (b) The launch inside func: func times its own launches.
    inside: dict[bool, list[float]] = {True: [], False: []}
    per_call = 200

    def timed_launches(fast):
        def func(a, b, s):
            t0 = time.perf_counter()
            for _ in range(per_call):
                affine[blocks, 256, s](a, b)
            inside[fast].append((time.perf_counter() - t0) / per_call * 1e6)
        func.__qualname__ = f"timed_launches_{'fast' if fast else 'numba'}"
        return jax.jit(numbax.numba_cuda_callable(func, spec,
                                                  fast_launch=fast))

    v0 = jnp.ones(n, jnp.float32)
    for fast in (True, False):
        op = timed_launches(fast)
        for _ in range(12):
            op(v0).block_until_ready()
    # The first call of each records the plan (a launch through Numba).
    in_func = {fast: statistics.median(s[2:]) for fast, s in inside.items()}

    def per_op(op):
        chain = jax.jit(timing.chain_fn(op, length))
        v = jnp.ones(n, jnp.float32)
        chain(v).block_until_ready()

        def run(k):
            for _ in range(k):
                chain(v).block_until_ready()
        return _median_us(run, 10) / length

    def single_us(op):
        jitted = jax.jit(op)
        v1 = jnp.ones(n, jnp.float32)

        def single(k):
            for _ in range(k):
                jitted(v1).block_until_ready()
        single(5)
        return _median_us(single, 50)

    def launch_op(fast, capture=False):
        return numbax.numba_cuda_callable(
            lambda a, b, s: affine[blocks, 256, s](a, b), spec,
            fast_launch=fast, capture=capture)

    # (c) Plain callables next to the native plain handler.
    native_call = jax.ffi.ffi_call(env.native.plain, spec)
    native_op = lambda v: native_call(v)  # noqa: E731
    fast_op, numba_op = launch_op(True), launch_op(False)
    numbax.reset_bridge_counters()
    native_us = per_op(native_op)
    fast_us = per_op(fast_op)
    counters_fast = numbax.bridge_counters()
    numba_us = per_op(numba_op)
    singles = {name: single_us(op) for name, op in
               [("native plain", native_op), ("callable, fast launch", fast_op),
                ("callable, Numba launch", numba_op)]}

    # (d) What XLA records into graphs.
    native_cb = jax.ffi.ffi_call(env.native.cmd_buffer, spec)
    recorded = [("native cmd-buffer op", lambda v: native_cb(v)),
                ("numbax kernel op", numbax.numba_cuda_kernel(
                    affine, spec, launch_dims=n)),
                ("numbax capture op", launch_op(True, capture=True))]

    print("== Numba's launch (no JAX)")
    _line("kernel[grid, block, stream](x, y), Python loop", launch)
    _line("kernel[grid, block, stream] (configuration only)", configure)
    print("== the same launch inside a plain callable's func, per launch")
    _line("numbax fast launch (default)", in_func[True])
    _line("Numba's launch (fast_launch=False)", in_func[False])
    print(f"== one op of a jitted chain of {length}")
    _line("native plain FFI handler", native_us)
    _line("numbax callable, fast launch", fast_us,
          f"{fast_us / native_us:.2f}x native plain")
    _line("numbax callable, Numba launch", numba_us,
          f"{numba_us / native_us:.2f}x native plain")
    _line("numbax bridge share (fast)", fast_us - in_func[True] - native_us,
          "callable - its launch in func - native op")
    _line("numbax bridge share (Numba launch)",
          numba_us - in_func[False] - native_us,
          "callable - its launch in func - native op")
    print("== single jitted call")
    for name, us in singles.items():
        _line(name, us, f"{us / singles['native plain']:.2f}x native plain")
    print("== ops XLA records into CUDA graphs: chain, single")
    for name, op in recorded:
        _line(name, per_op(op))
        _line(name + " single", single_us(op))
    _stages(native_op, env.native.no_launch, fast_op, spec, blocks, length)
    _report_thread(spec)
    c = counters_fast
    print(f"fast path over the fast chain: {c['fast_launches']} fast "
          f"launches, {c['fast_launch_fallbacks']} through Numba "
          + str({k[len('fallback_'):]: v for k, v in c.items()
                 if k.startswith("fallback_") and v}))
    print(numbax.bridge_counters())
    return 0


def _stages(native_op, no_launch_target: str, fast, spec, blocks: int,
            length: int, rounds: int = 15, inner: int = 20) -> None:
    """(e): what each stage of a plain callable's op adds, interleaved.
    `fast` is (c)'s plain callable with fast launches; `no_launch_target`
    the native handler that returns at once (what XLA spends on its own)."""
    import jax
    import jax.numpy as jnp

    import numbax
    from numbax import _core
    from numbax.runtime import guard as _guard

    from . import timing
    from .kernels import affine

    def callable_op(func):
        return numbax.numba_cuda_callable(func, spec)

    def returns_at_once(a, b, s):
        return None

    def configures_only(a, b, s):
        affine[blocks, 256, s]

    no_launch_call = jax.ffi.ffi_call(no_launch_target, spec)
    empty = callable_op(returns_at_once)
    # (label, op, launch the CUfunction?, guard on?, bridge stop, row it
    # differs from): the stops (_core.set_bridge_stop) end each call early.
    variants = [
        ("native plain FFI handler", native_op, True, True, 0, None),
        ("native FFI handler, no launch", lambda x: no_launch_call(x),
         True, True, 0, 0),
        ("callable, stop: call frame decoded", empty, True, True, 1, 1),
        ("callable, stop: GIL taken", empty, True, True, 2, 2),
        ("callable, stop: func's arrays found", empty, True, True, 3, 3),
        ("callable, stop: guard entered and left", empty, True, True, 4, 4),
        ("callable, func returns at once", empty, True, True, 0, 5),
        ("callable, func returns at once, guard off", empty, True, False, 0,
         6),
        ("callable, func configures only", callable_op(configures_only),
         True, True, 0, 6),
        ("callable, fast launch (CUfunction)", fast, True, True, 0, 8),
        ("callable, fast launch (Numba's CUkernel)", fast, False, True, 0, 9),
        ("callable, fast launch, guard off", fast, True, False, 0, 9),
    ]
    v = jnp.ones(spec.shape, spec.dtype)
    chains = [jax.jit(timing.chain_fn(op, length))
              for _, op, *_ in variants]
    samples: list[list[float]] = [[] for _ in variants]
    try:
        for _ in range(rounds):
            for i, (_, _, resolve, guard, stop, _) in enumerate(variants):
                _core.set_bridge_stop(stop)
                _core.set_fast_launch_resolves_function(resolve)
                _core.clear_launch_plans()  # re-recorded with `resolve`
                if guard:
                    _guard.install()
                else:
                    _guard.uninstall()
                chains[i](v).block_until_ready()  # records the plan
                t0 = time.perf_counter()
                for _ in range(inner):
                    chains[i](v).block_until_ready()
                samples[i].append(
                    (time.perf_counter() - t0) / inner / length * 1e6)
    finally:
        _core.set_bridge_stop(0)
        _core.set_fast_launch_resolves_function(True)
        _core.clear_launch_plans()
        _guard.install()
    print(f"== one op of the chain, stage by stage ({rounds} interleaved "
          "rounds; median, min-max)")
    medians = [statistics.median(s) for s in samples]
    for (label, *_, base), s, med in zip(variants, samples, medians):
        step = ("" if base is None else
                f"  {med - medians[base]:+.2f} vs row {base + 1}")
        _line(label, med, f"[{min(s):.2f}-{max(s):.2f}]{step}")


def _report_thread(spec) -> None:
    """Which thread XLA runs a plain callable's func on: the caller's
    (Python's) or one of XLA's own (numbax made its Python thread state)."""
    import threading

    import jax
    import jax.numpy as jnp

    import numbax

    seen = []

    def where(a, b, s):
        t = threading.current_thread()
        seen.append("the main thread" if t is threading.main_thread()
                    else f"{type(t).__name__} {t.name!r}")

    jax.jit(numbax.numba_cuda_callable(where, spec))(
        jnp.ones(spec.shape, spec.dtype)).block_until_ready()
    print(f"func ran on: {seen[0] if seen else 'no call'}")


if __name__ == "__main__":
    raise SystemExit(main())
