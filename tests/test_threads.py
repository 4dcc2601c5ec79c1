"""numbax ops called from several Python threads at once (CPU simulator).

Each thread uses fresh data and checks every result against numpy. A
deadlock fails the test instead of hanging CI: the threads are joined with
a timeout, and faulthandler kills the process (printing every thread's
stack) if even that cannot return. The several-device case runs this file
as a script in a process with 4 fake CPU devices.

On the simulator numbax runs one func at a time (Numba's simulator cannot
launch kernels concurrently); on a GPU nothing is serialised, which
tests/test_multigpu.py checks on 2 GPUs.
"""

import faulthandler
import json
import os
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from shared_kernels import affine as affine_kernel

F32 = jnp.float32
N = 256
THREADS = 6
ITERATIONS = 8
JOIN_TIMEOUT = 90


@cuda.jit
def square_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * x[i]


def affine(x, out, stream):
    affine_kernel[(x.shape[0] + 63) // 64, 64, stream](x, out)


def make_ops(n=N):
    spec = jax.ShapeDtypeStruct((n,), F32)
    plain = numbax.numba_cuda_callable(affine, spec)
    captured = numbax.numba_cuda_callable(affine, spec, capture=True)
    kernel = numbax.numba_cuda_kernel(square_kernel, spec, launch_dims=n)
    program = jax.jit(lambda x: (plain(x), kernel(captured(x))))
    return plain, kernel, program


def hammer(ops, thread_index, device=None, iterations=ITERATIONS):
    """One thread's work: fresh data per call, every result checked."""
    plain, kernel, program = ops
    rng = np.random.default_rng([thread_index + 1, os.getpid(), time.time_ns()])
    done = 0
    for _ in range(iterations):
        x = rng.standard_normal(N).astype(np.float32)
        xd = jax.device_put(x, device) if device is not None else x
        a, b = program(xd)
        np.testing.assert_allclose(np.asarray(a), 2 * x + 1, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(b), (2 * x + 1) ** 2, rtol=1e-5)
        if device is not None:
            assert a.devices() == {device} and b.devices() == {device}
        # Eager calls too: each op compiled alone.
        np.testing.assert_allclose(np.asarray(kernel(xd)), x * x, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(plain(xd)), 2 * x + 1, rtol=1e-6)
        done += 1
    return done


def run_threads(target, count, timeout=JOIN_TIMEOUT):
    """Runs target(i) on `count` threads at once; returns (done, errors)."""
    results, errors = {}, []
    barrier = threading.Barrier(count)

    def body(i):
        try:
            barrier.wait(timeout)
            results[i] = target(i)
        except BaseException as exc:  # reported below, with the thread
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")
    threads = [threading.Thread(target=body, args=(i,), daemon=True)
               for i in range(count)]
    # The last resort: a C-level watchdog that needs no GIL.
    faulthandler.dump_traceback_later(timeout + 30, exit=True)
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert not hung, f"deadlock: threads {hung} still running after {timeout}s"
    return results, errors


@pytest.fixture(autouse=True)
def _simulator(simulator_only):
    pass


def test_threads_one_device_callable_kernel_capture():
    ops = make_ops()
    # Compile once first, then all threads race on the same executables,
    # call sites and array caches.
    hammer(ops, -1, iterations=1)
    results, errors = run_threads(lambda i: hammer(ops, i), THREADS)
    assert not errors, "\n".join(errors)
    assert results == {i: ITERATIONS for i in range(THREADS)}


def test_threads_first_calls_race_on_compile_and_resolve():
    # No warm-up: the threads trace, compile and resolve keys concurrently.
    ops = make_ops(N)
    results, errors = run_threads(lambda i: hammer(ops, i, iterations=2),
                                  THREADS)
    assert not errors, "\n".join(errors)
    assert len(results) == THREADS


def test_threads_each_with_its_own_ops():
    results, errors = run_threads(
        lambda i: hammer(make_ops(), i, iterations=3), 4)
    assert not errors, "\n".join(errors)
    assert len(results) == 4


def test_a_blocked_func_does_not_block_other_threads_jax_work():
    started, release = threading.Event(), threading.Event()

    def blocking(x, out, stream):
        started.set()
        released = release.wait(30)
        affine(x, out, stream)
        if not released:
            raise RuntimeError("never released")
    op = jax.jit(numbax.numba_cuda_callable(
        blocking, jax.ShapeDtypeStruct((N,), F32)))
    x = np.arange(N, dtype=np.float32)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "y", np.asarray(op(x))), daemon=True)
    t.start()
    try:
        assert started.wait(30), "func never started"
        # While func waits inside XLA's execution, this thread still runs
        # Python and JAX programs on the same device: numbax holds neither
        # the GIL nor a device lock across the call.
        t0 = time.monotonic()
        y = jax.jit(lambda v: v * 3 + 1)(x).block_until_ready()
        elapsed = time.monotonic() - t0
        np.testing.assert_allclose(y, 3 * x + 1)
        assert t.is_alive(), "the blocked call finished early"
    finally:
        release.set()
    t.join(JOIN_TIMEOUT)
    assert not t.is_alive()
    np.testing.assert_allclose(out["y"], 2 * x + 1)
    assert elapsed < 20


def test_threads_on_several_devices():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)],
                          capture_output=True, text=True, env=env,
                          timeout=JOIN_TIMEOUT + 60)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["errors"] == [], result
    assert result["devices"] == 4
    assert result["done"] == {str(i): ITERATIONS for i in range(8)}, result


def several_devices_main():
    """8 threads, two per device, each calling ops committed to its device."""
    devices = jax.devices()
    assert len(devices) == 4, devices
    ops = make_ops()
    for d in devices:  # compile for each device first
        hammer(ops, -1, device=d, iterations=1)
    results, errors = run_threads(
        lambda i: hammer(ops, i, device=devices[i % len(devices)]), 8)
    print("RESULT " + json.dumps(dict(devices=len(devices), errors=errors,
                                      done=results)), flush=True)


if __name__ == "__main__":
    several_devices_main()
