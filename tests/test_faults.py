"""Faults: an exception in func leaves the process healthy; a kernel that
faults on the GPU surfaces as an error from JAX (docs/reliability.md says
what state CUDA is in afterwards)."""

import gc
import os
import subprocess
import sys
import textwrap
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR

pytestmark = pytest.mark.gpu

F32 = jnp.float32
N = 4
SPEC = jax.ShapeDtypeStruct((N,), F32)
RuntimeFailure = jax.errors.JaxRuntimeError


class Sentinel:
    """Referenced from func's frame: a leaked frame or traceback keeps it."""


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
def test_1000_alternating_failures_and_successes(capture):
    if capture and not SIMULATOR:
        pytest.skip("on a GPU a captured func is replayed without Python")
    sentinel = Sentinel()
    state = {"calls": 0}

    def func(x, out, stream):
        held = sentinel  # noqa: F841  (kept in the frame on purpose)
        state["calls"] += 1
        if state["calls"] % 2:
            raise ValueError(f"planted failure {state['calls']}")
        out.copy_to_device(x, stream=stream)  # no kernel: fast everywhere

    fn = jax.jit(numbax.numba_cuda_callable(func, SPEC, capture=capture))
    x = jnp.arange(N, dtype=F32)

    def call(i):
        if i % 2 == 0:
            expected = f"ValueError: planted failure {state['calls'] + 1}\n"
            try:
                jax.block_until_ready(fn(x))
            except RuntimeFailure as exc:
                assert expected in str(exc)
            else:
                raise AssertionError("the failing call did not fail")
        else:
            np.testing.assert_array_equal(fn(x), np.arange(N))

    for i in range(20):  # warm-up: array and stream caches fill
        call(i)
    gc.collect()
    refcount = sys.getrefcount(sentinel)
    before = numbax.bridge_counters()
    tracemalloc.start()
    start = tracemalloc.take_snapshot()
    for i in range(1000):
        call(i)
    gc.collect()
    diff = tracemalloc.take_snapshot().compare_to(start, "lineno")
    tracemalloc.stop()
    growth = sum(d.size_diff for d in diff)
    after = numbax.bridge_counters()
    assert after["calls"] - before["calls"] == 1000
    assert after["errors"] - before["errors"] == 500
    assert sys.getrefcount(sentinel) == refcount, "a failed call kept frames"
    assert growth < 64 * 1024, (f"{growth} bytes kept by 1000 calls:\n" +
                                "\n".join(str(d) for d in diff[:8]))
    # Still healthy: new ops compile and run, and funcs still may not call JAX.
    np.testing.assert_array_equal(
        jax.jit(numbax.numba_cuda_callable(
            lambda a, o, s: o.copy_to_device(a, stream=s), SPEC))(x),
        np.arange(N))
    with pytest.raises(RuntimeFailure, match="func called JAX"):
        jax.block_until_ready(jax.jit(numbax.numba_cuda_callable(
            lambda a, o, s: jnp.ones(2), SPEC))(x))


def test_failures_from_several_threads_stay_separate():
    import threading

    def func(x, out, stream):
        first = x.copy_to_host(stream=stream)[0]
        stream.synchronize()  # allowed outside capture mode
        if first < 0:
            raise ValueError(f"negative input {first:.0f}")
        out.copy_to_device(x, stream=stream)

    fn = jax.jit(numbax.numba_cuda_callable(func, SPEC))
    results = []

    def worker(sign):
        for i in range(50):
            v = jnp.full((N,), sign * (i + 1), F32)
            try:
                out = np.asarray(fn(v))
                results.append(sign > 0 and out[0] == i + 1)
            # jaxlib's jit fast path raises an execution error as ValueError
            # when calls race from several threads (plain JAX does the same
            # with jax.pure_callback): docs/errors.md.
            except (RuntimeFailure, ValueError) as exc:
                results.append(sign < 0 and f"negative input {-(i + 1)}"
                               in str(exc))

    threads = [threading.Thread(target=worker, args=(s,)) for s in (1, -1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 100 and all(results)


def test_simulated_out_of_bounds_write_then_healthy(simulator_only):
    # The simulator checks bounds: the CPU analogue of a device fault is a
    # clean error, and the next call works.
    @cuda.jit
    def wild(x, out):
        i = cuda.grid(1)
        out[i + 1000] = x[i]

    bad = numbax.numba_cuda_kernel(wild, SPEC, launch_dims=N)
    with pytest.raises(RuntimeFailure, match="(?s)IndexError"):
        jax.block_until_ready(jax.jit(bad)(jnp.ones(N)))
    good = numbax.numba_cuda_callable(
        lambda a, o, s: o.copy_to_device(a, stream=s), SPEC)
    np.testing.assert_array_equal(jax.jit(good)(jnp.ones(N)), np.ones(N))


# -- a real device fault (GPU only, each in its own process) -----------------

DEVICE_FAULT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from numba import cuda
    import numbax

    N = 1024
    SPEC = jax.ShapeDtypeStruct((N,), jnp.float32)

    @cuda.jit
    def wild_write(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i]
            if i == 0:
                out[i + (1 << 40)] = 1.0  # 4 TiB past the buffer: unmapped

    def launch(x, out, stream):
        wild_write[N // 128, 128, stream](x, out)

    @cuda.jit
    def copy(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i]

    mode = sys.argv[1]
    if mode == "kernel":
        bad = numbax.numba_cuda_kernel(wild_write, SPEC, launch_dims=N)
    else:
        bad = numbax.numba_cuda_callable(launch, SPEC)
    good = numbax.numba_cuda_kernel(copy, SPEC, launch_dims=N)
    x = jnp.ones(N, jnp.float32)
    np.testing.assert_array_equal(jax.jit(good)(x), np.ones(N))
    print("BEFORE ok", flush=True)
    try:
        jax.block_until_ready(jax.jit(bad)(x))
        print("NO-ERROR", flush=True)
    except Exception as exc:
        text = " ".join(str(exc).split())
        print(f"SURFACED {type(exc).__module__}.{type(exc).__name__}: "
              f"{text[:600]}", flush=True)
    # What works afterwards (docs/reliability.md records it).
    checks = {
        "jnp": lambda: jnp.arange(8.0).sum(),
        "numbax-kernel": lambda: jax.jit(good)(x),
        "new-program": lambda: jax.jit(lambda v: v * 3 + 1)(x),
    }
    for name, check in checks.items():
        try:
            jax.block_until_ready(check())
            print(f"AFTER {name} ok", flush=True)
        except Exception as exc:
            text = " ".join(str(exc).split())
            print(f"AFTER {name} failed: {text[:200]}", flush=True)
""")


@pytest.mark.parametrize("mode", ["kernel", "callable"])
def test_device_fault_surfaces_as_jax_error(gpu_only, mode):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "JAX_PLATFORMS")}
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    proc = subprocess.run([sys.executable, "-c", DEVICE_FAULT, mode], env=env,
                          capture_output=True, text=True, timeout=300)
    report = (f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}"
              f"\n--- stderr\n{proc.stderr[-4000:]}")
    print(report)
    assert "BEFORE ok" in proc.stdout, report
    surfaced = [line for line in proc.stdout.splitlines()
                if line.startswith("SURFACED")]
    assert surfaced, report
    assert "jax.errors.JaxRuntimeError" in surfaced[0] or \
        "XlaRuntimeError" in surfaced[0], report
    assert any(s in surfaced[0].lower() for s in
               ("illegal address", "illegal memory access",
                "cuda_error_illegal")), report
