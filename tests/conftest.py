"""Test modes.

CI has no GPU: it runs every test with NUMBA_ENABLE_CUDASIM=1, so numbax ops
run on JAX's CPU backend through Numba's CUDA simulator. On a GPU machine,
scripts/gpu_check.sh runs the tests marked `gpu` without the simulator, on
real CUDA. Tests that only make sense in one mode say so with the
`simulator_only` or `gpu_only` fixtures. A test that could leave the CUDA
context corrupted if what it checks were broken runs in a pytest process of
its own (`in_own_process`). The helpers below the fixtures (poisoned
outputs, comparisons with numpy, expected errors) are every file's.

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
import functools
import os
import re
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


# -- shared helpers: poisoned outputs, comparisons with numpy, errors --------

# Every vmap_method a numba_cuda_kernel takes (a callable's also takes the
# others but None: it has no default way to batch).
KERNEL_VMAP_METHODS = (None, "expand_dims", "broadcast_all", "legacy_vectorized",
                       "sequential")


def grid_for(n, tpb=256):
    """The 1-D grid of `tpb`-thread blocks that covers n elements."""
    return (max(1, -(-n // tpb)),)


def poison(shape, dtype):
    """Fills a buffer of this size with a sentinel and frees it: XLA's
    allocator tends to hand that memory to the next output, so unwritten
    elements of an output show as the sentinel, not as plausible stale data."""
    import jax
    import jax.numpy as jnp

    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        fill = np.nan
    elif dtype.kind == "b":
        fill = True
    else:
        fill = 0x5A
    jax.block_until_ready(jnp.full(shape, fill, dtype))


def assert_close(got, want, what="", rtol=1e-6, atol=1e-6):
    """got equals want: exactly for bool and integer values, else within
    rtol/atol, NaN equal to NaN; the shapes must agree."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=what)


def outcome(fn, *args):
    """("ok", fn(*args)) or ("err", the name of the exception's type)."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001  (any exception is an outcome)
        return "err", type(exc).__name__


def kernel_op(kernel, shape, dtype, **kw):
    """numba_cuda_kernel(kernel) with one output of `shape` and `dtype`,
    launched over `shape` (over its length when 1-D) unless `launch_dims=`."""
    import jax

    import numbax

    kw.setdefault("launch_dims", shape if len(shape) > 1 else shape[0])
    return numbax.numba_cuda_kernel(kernel, jax.ShapeDtypeStruct(shape, dtype), **kw)


@pytest.fixture
def x64():
    """jax_enable_x64 on for the test (64-bit arrays stay 64-bit)."""
    with x64_enabled(True):
        yield


@pytest.fixture
def small_registry(monkeypatch):
    """lower(entries, launchers=None): numbax's registry keeps at most
    `entries` op keys, and a kernel op at most `launchers` launchers, for the
    test. Private names: numbax has no public setter for its bounds."""
    from numbax.kernel import simulator
    from numbax.runtime import registry

    def lower(entries, launchers=None):
        monkeypatch.setattr(registry, "MAX_ENTRIES", entries)
        if launchers is not None:
            monkeypatch.setattr(simulator, "MAX_LAUNCHERS", launchers)

    return lower


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_IN_OWN_PROCESS = "NUMBAX_TEST_IN_OWN_PROCESS"


def in_own_process(timeout=300):
    """Runs the decorated test in a pytest process of its own (the test
    itself, by its node id), for a test that could leave the CUDA context
    corrupted if what it checks were broken (a kernel launched on buffers of
    another type): the parent fails with the child's report, a crash, a
    sticky CUDA error or a hang (over `timeout` seconds) included, and the
    rest of the run goes on in a healthy process. Fixtures such as
    `gpu_only` run in the parent first."""
    def decorate(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            if os.environ.get(_IN_OWN_PROCESS):
                return test(*args, **kwargs)
            nodeid = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
            env = dict(os.environ, **{_IN_OWN_PROCESS: "1"})
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       nodeid]
            try:
                proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True,
                                      text=True, timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                proc, tail = None, exc.stdout or ""
            if proc is None:
                if isinstance(tail, bytes):
                    tail = tail.decode(errors="replace")
                pytest.fail(f"{nodeid} hung in its own process: over {timeout} s; "
                            f"its output ends:\n{tail[-4000:]}")
            text = proc.stdout + proc.stderr
            sticky = " (a CUDA error)" if "CUDA_ERROR" in text else ""
            assert proc.returncode == 0 and re.search(r"^1 passed", text, re.M), (
                f"{nodeid} in its own process: exit status {proc.returncode}{sticky}; "
                f"its output ends:\n{text[-4000:]}")
        return run
    return decorate


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
