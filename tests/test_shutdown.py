"""Interpreter shutdown while compiled programs still exist: no crash at exit.

Each scenario runs in a fresh interpreter, leaves numbax ops, jitted and
ahead-of-time compiled programs (whose C++ call sites hold Python objects)
alive until exit, and must exit 0 with nothing on stderr that looks like a
crash. On a GPU machine the same scenarios run on real CUDA (the `gpu`
mark), with numba_cuda_kernel launched from C++.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import SIMULATOR

pytestmark = pytest.mark.gpu

PRELUDE = textwrap.dedent("""
    import atexit, gc, sys, threading, time
    import jax, jax.numpy as jnp, numpy as np
    from numba import cuda
    import numbax

    N = 64
    SPEC = jax.ShapeDtypeStruct((N,), jnp.float32)

    @cuda.jit
    def affine(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = 2 * x[i] + 1

    def launch(x, out, stream):
        affine[1, N, stream](x, out)

    plain = numbax.numba_cuda_callable(launch, SPEC)
    captured = numbax.numba_cuda_callable(launch, SPEC, capture=True)
    kernel = numbax.numba_cuda_kernel(affine, SPEC, launch_dims=N)
    x = jnp.arange(N, dtype=jnp.float32)
    expected = 2 * np.arange(N, dtype=np.float32) + 1
""")

SCENARIOS = {
    # Jitted and AOT-compiled programs of every op kind, alive at exit, some
    # only reachable through a reference cycle (freed by the final GC).
    "live-programs": """
        jitted = [jax.jit(op) for op in (plain, captured, kernel)]
        compiled = [jax.jit(op).lower(x).compile() for op in (plain, kernel)]
        for f in jitted + compiled:
            np.testing.assert_allclose(f(x), expected)

        class Cycle:
            pass
        c = Cycle()
        c.self = c
        c.programs = [jax.jit(lambda v: plain(kernel(v))).lower(x).compile()]
        np.testing.assert_allclose(c.programs[0](x), 2 * expected + 1)
        del c
        print("OK", flush=True)
    """,
    # The op's function itself is gone from Python's namespace; only the
    # compiled program's call site keeps it.
    "only-the-program-holds-func": """
        def local_launch(x, out, stream):
            affine[1, N, stream](x, out)
        op = numbax.numba_cuda_callable(local_launch, SPEC)
        program = jax.jit(op).lower(x).compile()
        del op, local_launch
        gc.collect()
        np.testing.assert_allclose(program(x), expected)
        print("OK", flush=True)
    """,
    # A failed call's error (traceback, frames, arrays) is still referenced.
    "pending-error": """
        def failing(x, out, stream):
            raise ValueError("kept until exit")
        op = jax.jit(numbax.numba_cuda_callable(failing, SPEC))
        try:
            jax.block_until_ready(op(x))
        except Exception as exc:
            kept = exc
        assert "kept until exit" in str(kept)
        print("OK", flush=True)
    """,
    # An atexit handler still runs ops (before the interpreter finalises).
    "ops-in-atexit": """
        jitted = jax.jit(plain)
        def at_exit():
            np.testing.assert_allclose(jitted(x), expected)
            np.testing.assert_allclose(jax.jit(kernel)(x), expected)
            print("ATEXIT-OK", flush=True)
        atexit.register(at_exit)
        print("OK", flush=True)
    """,
    # The main thread exits with programs still queued: XLA's own threads
    # may be running func (or about to take the GIL for it) as Python
    # finalises. (Python *daemon threads* that call JAX at exit crash
    # CPython <= 3.13 with plain JAX too: docs/reliability.md.)
    "exit-with-work-in-flight": """
        def slow(x, out, stream):
            time.sleep(0.02)
            affine[1, N, stream](x, out)
        op = jax.jit(numbax.numba_cuda_callable(slow, SPEC))
        chain = jax.jit(lambda v: kernel(op(plain(v))))
        y = x
        for _ in range(40):
            y = chain(y)
        print("OK", flush=True)
    """,
    # What numbax's atexit hook does first: from then on handlers refuse to
    # run Python, with an error (never a wait for the GIL that Python's
    # finalisation would turn into an abort).
    "calls-after-the-exit-hook": """
        jitted = jax.jit(plain)
        np.testing.assert_allclose(jitted(x), expected)
        assert numbax._core.prepare_for_exit(1.0) == 0
        for f in (jitted, jax.jit(lambda v: plain(v) + 1)):
            try:
                jax.block_until_ready(f(x))
            except Exception as exc:
                assert "shutting down" in str(exc) or "exiting" in str(exc), exc
            else:
                raise AssertionError("a handler ran Python after the exit hook")
        print("OK", flush=True)
    """,
}

CRASH_SIGNS = ("Fatal Python error", "Segmentation fault", "core dumped",
               "terminate called", "Aborted", "Check failed", "Traceback",
               "AddressSanitizer")


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_shutdown_with_live_programs(scenario):
    code = PRELUDE + textwrap.dedent(SCENARIOS[scenario])
    env = dict(os.environ)
    if SIMULATOR:
        env.update(NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=300)
    report = (f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}"
              f"\n--- stderr\n{proc.stderr}")
    assert proc.returncode == 0, report
    assert "OK" in proc.stdout.split(), report
    if scenario == "ops-in-atexit":
        assert "ATEXIT-OK" in proc.stdout, report
    crash = [s for s in CRASH_SIGNS if s in proc.stderr]
    assert not crash, report
