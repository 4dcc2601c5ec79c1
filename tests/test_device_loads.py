"""A kernel used on several devices, and Numba's unloads at exit.

numba-cuda 0.30 loads a kernel as one context-independent library, keyed by
compute capability; its load on a second device wraps that same library in
a second module, and at exit both modules' unloads are flushed: a double
unload in the driver that aborted test processes on two H200s after every
test had passed. numbax (1) loads a kernel through Numba once per compute
capability and gets further devices' functions from the same handle, and
(2) stops Numba flushing its deallocation queues while the process exits.
Both are checked here with Numba's own queue class and stand-ins for the
driver; the GPU run checks the process exits cleanly.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest

from numbax import _core
from numbax.compilers import numba_cuda
from numbax.runtime import numba_bridge

function_on = numba_cuda.COMPILER.function_on


# The device whose context is current on this thread, as the fake
# call_on_device binds it (numbax's real one binds the primary context).
_bound = threading.local()


class _Library:
    """Numba's CUDACodeLibrary as far as numbax uses it: get_cufunc returns
    the function loaded in the current context, loading it there (a module)
    when that device has none yet; the gap between the check and the load is
    where concurrent callers race (`delay`)."""

    def __init__(self, setup=(), delay=0.0):
        self._setup_functions = list(setup)
        self._teardown_functions = []
        self._cufunc_cache = {}  # as numba-cuda's: device id -> function
        self.loads = 0
        self.loaded_on = []
        self.delay = delay

    def get_cufunc(self):
        device = getattr(_bound, "device", 0)
        if device in self._cufunc_cache:
            return self._cufunc_cache[device]
        if self.delay:
            time.sleep(self.delay)  # the driver call, GIL released
        self.loads += 1
        self.loaded_on.append(device)

        class Func:
            handle = 0xC0DE
        self._cufunc_cache[device] = Func()
        return self._cufunc_cache[device]


class _Compiled:
    def __init__(self, cooperative=False, setup=(), delay=0.0):
        self.cooperative = cooperative
        self._codelibrary = _Library(setup, delay)

    def max_cooperative_grid_blocks(self, block, shared_mem):
        # As Numba: from its function in the current context.
        self._codelibrary.get_cufunc()
        return 1 << 20


def _numba_loaded(compiled, device, handle=0xBEEF):
    """As if Numba had already loaded `compiled` on `device` (numba-cuda's
    per-device cache of the library), as function `handle`."""
    compiled._codelibrary._cufunc_cache = {
        device: types.SimpleNamespace(handle=handle)}


class _Gpu:
    def __init__(self, cc, sms=132):
        self.compute_capability = cc
        self.MULTIPROCESSOR_COUNT = sms


def _bind(ordinal, fn):
    previous = getattr(_bound, "device", 0)
    _bound.device = ordinal
    try:
        return fn()
    finally:
        _bound.device = previous


@pytest.fixture
def fake_devices(monkeypatch):
    """Devices of the given capabilities; records every function lookup."""
    from numba import cuda
    looked_up = []
    monkeypatch.setattr(_core, "call_on_device",
                        lambda ordinal, fn: ("bound", ordinal, _bind(ordinal, fn)))
    monkeypatch.setattr(
        _core, "kernel_function",
        lambda handle, ordinal, shared_mem=0:
        looked_up.append((handle, ordinal)) or ("function", ordinal))

    def make(*ccs, sms=None):
        sms = sms or [132] * len(ccs)
        monkeypatch.setattr(cuda, "gpus",
                            [_Gpu(cc, n) for cc, n in zip(ccs, sms)],
                            raising=False)
        return looked_up
    return make


def _loads_at_once(compiled, n, programs=4):
    """`programs` programs instantiated at once, each loading the kernel on
    devices 0..n-1."""
    threads = [threading.Thread(target=_functions, args=(compiled, n))
               for _ in range(programs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _functions(compiled, n):
    handles = {}  # no kernel or op needed
    return [function_on(compiled, o, grid=(1, 1, 1), block=(32, 1, 1),
                        shared_mem=0, label="numbax.numba_cuda_kernel(k)",
                        shared=handles)
            for o in range(n)]


def test_numba_loads_once_per_compute_capability(fake_devices):
    looked_up = fake_devices((9, 0), (9, 0), (9, 0))
    compiled = _Compiled()
    functions = _functions(compiled, 3)
    assert compiled._codelibrary.loads == 1
    # Every device still gets its own function, from the one handle.
    assert looked_up == [(0xC0DE, 0), (0xC0DE, 1), (0xC0DE, 2)]
    assert functions[0][:2] == ("bound", 0)
    assert functions[1:] == [("function", 1), ("function", 2)]


def test_other_capabilities_load_through_numba(fake_devices):
    fake_devices((9, 0), (8, 0), (9, 0))
    compiled = _Compiled()
    _functions(compiled, 3)
    assert compiled._codelibrary.loads == 2  # 9.0 once, 8.0 once


def test_a_load_made_by_the_trace_on_another_device_is_reused(fake_devices):
    """The trace compiles (and Numba loads) the kernel in whatever context
    is current on the tracing thread: on two H200s that was device 1's for
    every kernel after the first, and the instantiate's load on device 0 put
    each library in two contexts. The instantiate must reuse the trace's
    load."""
    looked_up = fake_devices((9, 0), (9, 0))
    compiled = _Compiled()
    _numba_loaded(compiled, 1)  # by the trace, on device 1
    _functions(compiled, 2)
    assert compiled._codelibrary.loads == 0
    assert looked_up == [(0xBEEF, 0), (0xBEEF, 1)]


def test_a_load_on_another_capability_is_not_reused(fake_devices):
    looked_up = fake_devices((9, 0), (8, 0))
    compiled = _Compiled()
    _numba_loaded(compiled, 1)
    _functions(compiled, 2)
    assert compiled._codelibrary.loads == 1  # device 0 (9.0) only
    assert looked_up == [(0xC0DE, 0), (0xBEEF, 1)]


def test_a_load_on_a_device_numba_no_longer_lists_is_ignored(fake_devices):
    fake_devices((9, 0))
    compiled = _Compiled()
    _numba_loaded(compiled, 5)
    _functions(compiled, 1)
    assert compiled._codelibrary.loads == 1


def test_cooperative_limit_is_asked_where_the_kernel_is_loaded(
        fake_devices, monkeypatch):
    """Numba computes the grid limit from its function in the current
    context; asking with device 0 current would load the kernel there."""
    fake_devices((9, 0), (9, 0))
    bound = []
    monkeypatch.setattr(_core, "call_on_device",
                        lambda ordinal, fn: bound.append(ordinal) or fn())

    class Coop(_Compiled):
        def max_cooperative_grid_blocks(self, block, shared_mem):
            bound.append("limit")
            return 1 << 20

    compiled = Coop(cooperative=True)
    _numba_loaded(compiled, 1)
    _functions(compiled, 2)
    assert compiled._codelibrary.loads == 0
    # Loaded for device 0: bound to 0, then the limit asked on device 1.
    assert bound[:3] == [0, 1, "limit"]


def test_setup_callbacks_do_not_stop_sharing(fake_devices):
    """float16 kernels carry module setup callbacks (numba-cuda's fp16 shim);
    Numba runs them in bind() at compile time, never per device."""
    fake_devices((9, 0), (9, 0))
    compiled = _Compiled(setup=[lambda module: None])
    _functions(compiled, 2)
    assert compiled._codelibrary.loads == 1


def test_cooperative_kernels_share_per_capability_and_sm_count(fake_devices):
    fake_devices((9, 0), (9, 0), (9, 0), sms=[132, 132, 114])
    compiled = _Compiled(cooperative=True)
    _functions(compiled, 3)
    # The third device has other SMs: its grid limit is computed (through
    # Numba) again.
    assert compiled._codelibrary.loads == 2


def test_concurrent_instantiations_with_mixed_sm_counts_load_each_device_once(
        fake_devices):
    """Devices of one capability with different SM counts (H100 SXM and
    PCIe): the limit for the odd one is computed through Numba, which loads
    the kernel there; programs instantiated at once must do that once."""
    fake_devices((9, 0), (9, 0), (9, 0), sms=[132, 132, 114])
    compiled = _Compiled(cooperative=True, delay=0.05)
    _loads_at_once(compiled, 3)
    assert sorted(compiled._codelibrary.loaded_on) == [0, 2]


def test_cooperative_grid_over_the_limit_is_refused_on_shared_devices(
        fake_devices):
    """A device that shares the handle still has its grid checked against
    the limit computed for its capability and SM count."""
    fake_devices((9, 0), (9, 0))

    class Small(_Compiled):
        def max_cooperative_grid_blocks(self, block, shared_mem):
            return 4

    label = "numbax.numba_cuda_kernel(coop)"  # no kernel behind it
    compiled, handles = Small(cooperative=True), {}
    function_on(compiled, 0, grid=(4, 1, 1), block=(32, 1, 1), shared_mem=0,
                label=label, shared=handles)
    with pytest.raises(ValueError, match="device 1 can run at most 4"):
        function_on(compiled, 1, grid=(8, 1, 1), block=(32, 1, 1),
                    shared_mem=0, label=label, shared=handles)
    assert compiled._codelibrary.loads == 1


def test_concurrent_instantiations_load_through_numba_once(fake_devices):
    """Numba's get_cufunc checks its per-device cache and then loads; two
    programs instantiated at once must not both load (two modules over one
    library in one context, unloaded twice later)."""
    fake_devices((9, 0))
    compiled = _Compiled(delay=0.05)
    _loads_at_once(compiled, 1)
    assert compiled._codelibrary.loads == 1


# The start of both child scripts: numba-cuda's real driver module, with
# a deallocation queue per fake context.
_FAKE_CONTEXTS = textwrap.dedent(r"""
    import logging
    import weakref
    from numba.cuda.cudadrv import driver as numba_driver
    from numbax.runtime import numba_bridge

    # Set when the driver initialises, which needs a GPU.
    numba_driver._logger = getattr(numba_driver, "_logger",
                                   logging.getLogger("numba.cuda"))

    class Context:
        def __init__(self):
            self.deallocations = numba_driver._PendingDeallocs()
""")

_HOLD_CHILD = _FAKE_CONTEXTS + textwrap.dedent(r"""
    flushed = []

    class Device:
        primary_context = Context()

    class Unused:
        primary_context = None

    numba_driver.driver.devices = {0: Device(), 1: Unused()}
    numba_bridge._hold_numba_deallocations()
    queue = Device.primary_context.deallocations
    for i in range(50):  # far past NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT
        queue.add_item(flushed.append, i)
    print("RESULT", queue.is_disabled, flushed)
""")


def _run_real_numba_driver(code):
    """Runs `code` with numba-cuda's real driver module (its deallocation
    queues), which imports without a GPU when the simulator is off."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_held_queues_do_not_flush():
    out = _run_real_numba_driver(_HOLD_CHILD)
    assert "RESULT True []" in out, out


_EXIT_CHILD = _FAKE_CONTEXTS + textwrap.dedent(r"""
    class Device:
        def __init__(self):
            self.primary_context = Context()

    numba_driver.driver.devices = {0: Device(), 1: Device()}
    queues = [d.primary_context.deallocations
              for d in numba_driver.driver.devices.values()]

    class Module:
        pass

    modules = [Module() for _ in range(24)]
    for i, module in enumerate(modules):
        # As numba-cuda's module finalizers: at exit, queue an unload of the
        # one library on each device's queue.
        for queue in queues:
            weakref.finalize(module, queue.add_item,
                             lambda h: print("UNLOAD", h, flush=True), i)
    if HOLD:
        # As op creation does (numbax.numba_cuda_kernel / _callable).
        numba_bridge.require_cuda()
        assert numba_bridge._exit_hold_registered
    print("READY", flush=True)
""")


@pytest.mark.parametrize("hold", [False, True], ids=["numba_alone", "numbax"])
def test_exit_never_flushes_unloads_with_numbax_hold(hold):
    """At exit, weakref finalizers queue unloads; without the hold, Numba's
    queues flush them (twice for a library shared by two devices); with
    numbax's hook registered after numba.cuda, nothing is flushed."""
    out = _run_real_numba_driver(f"HOLD = {hold}\n" + _EXIT_CHILD)
    assert "READY" in out
    unloads = [ln for ln in out.splitlines() if ln.startswith("UNLOAD")]
    if hold:
        assert unloads == [], out
    else:
        # What the hold prevents: libraries unloaded by both devices'
        # queues, each twice.
        assert unloads and len(unloads) == 2 * len(set(unloads)), out


_MANY_KERNELS_CHILD = textwrap.dedent(r"""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from numba import cuda
    import numbax

    def make(k):
        # A distinct kernel (and compiled library) per k.
        @cuda.jit
        def add_k(x, out):
            i = cuda.grid(1)
            if i < x.size:
                out[i] = x[i] + k
        add_k.__qualname__ = f"add_{k}"
        return add_k

    n = 1024
    x = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    for k in range(KERNELS):
        kernel = make(k)
        if MODE == "kernel":
            op = numbax.numba_cuda_kernel(kernel, spec, launch_dims=n,
                                          name=f"exit_check_add_{k}")
        else:  # func's own launch: Numba loads it on each device itself
            op = numbax.numba_cuda_callable(
                lambda x, out, stream, kernel=kernel:
                kernel[(n + 255) // 256, 256, stream](x, out),
                spec, name=f"exit_check_launch_{k}")
        for device in jax.devices():  # every device runs its own function
            got = np.asarray(jax.jit(op)(jax.device_put(x, device)))
            np.testing.assert_allclose(got, x + np.float32(k), rtol=0, atol=0)
    # No library may be wrapped by modules of two contexts: each would
    # unload it.
    from numba.cuda.cudadrv import driver as numba_driver
    owners = {}
    for device in numba_driver.driver.devices.values():
        context = device.primary_context
        for key in (context.modules if context is not None else ()):
            owners.setdefault(key, []).append(device.id)
    shared = sum(len(ids) > 1 for ids in owners.values())
    print("DONE", len(jax.devices()), "shared libraries", shared, flush=True)
""")


@pytest.mark.multigpu
@pytest.mark.parametrize("mode", ["kernel", "callable"])
def test_process_with_many_kernels_on_several_gpus_exits_cleanly(mode):
    """The process that aborted on two H200s: more kernels than Numba's
    pending-deallocation limit, run on every device. It must finish its
    results and exit with status 0. Kernel ops never put a library in two
    Numba contexts; a callable's own launches do (Numba loads per device),
    and numbax's exit hold keeps Numba from unloading those twice."""
    from conftest import SIMULATOR
    if SIMULATOR:
        pytest.skip("the double unload is a CUDA driver fault: GPU only")
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run(
        [sys.executable, "-c",
         f"KERNELS = 24\nMODE = {mode!r}\n" + _MANY_KERNELS_CHILD],
        capture_output=True, text=True, timeout=300, env=env)
    assert "DONE" in proc.stdout, proc.stderr[-4000:]
    if mode == "kernel":
        assert "shared libraries 0" in proc.stdout, proc.stdout
    assert proc.returncode == 0, (
        f"exit status {proc.returncode} after the results were complete\n"
        + proc.stderr[-4000:])
    # A driver that refuses the second unload does not abort: Numba's
    # finalizer raises, and Python only reports it.
    for sign in ("Exception ignored", "CudaAPIError", "cuLibraryUnload"):
        assert sign not in proc.stderr, proc.stderr[-4000:]
