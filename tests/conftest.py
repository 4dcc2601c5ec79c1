"""Test modes.

CI has no GPU: it runs every test with NUMBA_ENABLE_CUDASIM=1, so numbax ops
run on JAX's CPU backend through Numba's CUDA simulator. On a GPU machine,
scripts/gpu_check.sh runs the tests marked `gpu` without the simulator, on
real CUDA. Tests that only make sense in one mode say so with the
`simulator_only` or `gpu_only` fixtures.

Tests marked `multigpu` need 2 or more local devices: GPUs of one host, or
(a dry run of the test code) fake CPU devices under the simulator:

    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu \
    XLA_FLAGS=--xla_force_host_platform_device_count=2 pytest -m multigpu -rs tests

Below that they are
skipped, before any of their fixtures run. They do not carry `gpu`, so the
single-GPU run (`pytest -m gpu`) leaves them out; scripts/gpu_check.sh runs
`pytest -m multigpu` on its own when the machine has 2 GPUs.

NUMBAX_TEST_STALL_S=N writes every thread's Python stack to the file
NUMBAX_TEST_STALL_FILE (default numbax-test-stalls.txt in the working
directory; a file, because pytest captures stderr per test) whenever one
test has run N seconds, and every N seconds after, so a run that stops
making progress shows where (scripts/sanitizer_check.sh sets both). The
stacks are written by a Python thread, with the GIL held: faulthandler's
own timer (dump_traceback_later) reads the other threads' frames while they
run, and under compute-sanitizer on the H200 that crashed a test process
mid-dump (2026-11-30). A thread stuck while holding the GIL therefore gets
no dump; the multigpu tests keep their own faulthandler watchdog (which
exits the process).
"""

import contextlib
import faulthandler
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

if not SIMULATOR:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # NVLink multicast (NVLS) stays off for the collectives of the
    # multi-GPU tests; children started by tests inherit it.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

_multigpu_skip: list[str | None] = []  # computed once: why multigpu tests skip


def multigpu_skip_reason():
    """None when this run has 2 or more local devices a multigpu test can use."""
    if not _multigpu_skip:
        import jax

        devices = jax.local_devices()
        if SIMULATOR:
            reason = None if len(devices) >= 2 else (
                f"needs 2 or more GPUs of one host; this simulator run has "
                f"{len(devices)} CPU device(s) (a dry run on 2 fake CPU devices: "
                f"XLA_FLAGS=--xla_force_host_platform_device_count=2 with "
                f"NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu)")
        else:
            gpus = [d for d in devices if d.platform in ("gpu", "cuda")]
            reason = None if len(gpus) >= 2 else (
                f"needs 2 or more GPUs of one host; found {len(gpus)}")
        _multigpu_skip.append(reason)
    return _multigpu_skip[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # A hook, not a fixture: it runs before the test's module-scoped fixtures,
    # which build meshes over every device and start processes.
    if item.get_closest_marker("multigpu") is not None:
        reason = multigpu_skip_reason()
        if reason:
            pytest.skip(reason)


_STALL_S = float(os.environ.get("NUMBAX_TEST_STALL_S", "0") or 0)


class _StallWatch:
    """One daemon thread that writes every thread's stack to the stall file
    once the current test has run _STALL_S seconds, and every _STALL_S
    seconds after, until the test ends."""

    def __init__(self, path):
        self.out = open(path, "a")  # kept open for the session
        self.lock = threading.Lock()
        self.test = None
        self.due = 0.0
        threading.Thread(target=self._loop, name="numbax-stall-watch",
                         daemon=True).start()

    def start(self, nodeid):
        with self.lock:
            self.out.write(f"== {nodeid}\n")
            self.out.flush()
            self.test, self.due = nodeid, time.monotonic() + _STALL_S

    def stop(self):
        with self.lock:
            self.test = None

    def _loop(self):
        while True:
            time.sleep(min(1.0, _STALL_S / 4))
            with self.lock:
                if self.test is None or time.monotonic() < self.due:
                    continue
                self.out.write(f"-- {self.test} has run over "
                               f"{_STALL_S:g} s; every thread's stack:\n")
                self.out.flush()
                faulthandler.dump_traceback(self.out, all_threads=True)
                self.out.flush()
                self.due = time.monotonic() + _STALL_S


_stall_watch: list = []  # made on first use


@pytest.fixture(autouse=True)
def stall_dump(request):
    if _STALL_S <= 0 or request.node.get_closest_marker("multigpu") is not None:
        yield
        return
    if not _stall_watch:
        _stall_watch.append(_StallWatch(os.environ.get(
            "NUMBAX_TEST_STALL_FILE", "numbax-test-stalls.txt")))
    watch = _stall_watch[0]
    watch.start(request.node.nodeid)
    try:
        yield
    finally:
        watch.stop()


@pytest.fixture
def simulator_only():
    if not SIMULATOR:
        pytest.skip("simulator mode only (NUMBA_ENABLE_CUDASIM=1)")


@pytest.fixture
def gpu_only():
    if SIMULATOR:
        pytest.skip("needs a real GPU")


@pytest.fixture
def rng(request):
    # Fresh data per test, reproducible from the test's name.
    seed = abs(hash(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)


def random_array(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -100), min(info.max, 100)
        return rng.integers(lo, hi, size=shape, dtype=dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@contextlib.contextmanager
def x64_enabled(on: bool):
    """jax_enable_x64 set to `on` for the block, restored after."""
    import jax

    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", on)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def run_child(code: str, timeout=300) -> subprocess.CompletedProcess:
    """Runs `code` (dedented) in a fresh interpreter in this test's mode."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
        text=True, timeout=timeout, env=dict(os.environ))


def f32_spec(n: int = 8):
    """A 1-D float32 jax.ShapeDtypeStruct of `n` elements."""
    import jax
    import jax.numpy as jnp
    return jax.ShapeDtypeStruct((n,), jnp.float32)
