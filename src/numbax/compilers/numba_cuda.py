"""numba-cuda: the compiler of ``numba.cuda.jit`` kernels (and its simulator).

Its kernels compile through Numba for the current device (or come from
numbax's warm-start entry in the kernel's Numba cache: kernel_cache.py),
pass arrays as numba-cuda's array struct, take scalars by value, and on the
CPU run in Numba's CUDA simulator. Each device gets its function from
Numba's load, once per compute capability (:meth:`NumbaCuda.function_on`).
Launches from a numba_cuda_callable's func take numbax's C++ launch path
(numba_cuda_launch.py).
"""

from __future__ import annotations

import hashlib
import math
import threading

from .. import _core
from ..runtime import numba_bridge
from ..trace import checks, scalar_args
from . import fold, grid_reads, kernel_cache, numba_cuda_launch, signatures
from .base import NUMBA_ARRAY_ABI, Compiler

# Serialises Numba's kernel loads at instantiate (kernel/loaded.py, _load).
_NUMBA_LOAD_LOCK = threading.Lock()


class NumbaCuda(Compiler):
    name = "numba-cuda"
    cuda_module = "numba.cuda"
    abi = NUMBA_ARRAY_ABI
    takes_scalars = True

    def owns(self, kernel) -> bool:
        try:
            from numba.cuda.dispatcher import CUDADispatcher
            if isinstance(kernel, CUDADispatcher):
                return True
        except ImportError:
            pass
        try:
            from numba.cuda.simulator.kernel import FakeCUDAKernel
            return isinstance(kernel, FakeCUDAKernel)
        except ImportError:
            return False

    def argtypes(self, avals, batch, scalars, label):
        from numba import types
        tys = []
        for shape, dtype in avals:
            ndim = len(shape) - (1 if batch else 0)
            # A float8 buffer is a uint8 array (its bits) to the kernel.
            tys.append(types.Array(numba_bridge.numba_type_for(dtype), ndim,
                                   "C"))
        return tuple(scalar_args.merge(
            tys, scalars, [scalar_args.numba_type(s, label) for s in scalars]))

    def parameter_types(self, kernel, argtypes, label, n_in):
        if numba_bridge.simulator_enabled():
            return argtypes  # the simulator keeps no signatures
        return super().parameter_types(kernel, argtypes, label, n_in)

    def compile(self, kernel, argtypes, label, n_in=None):
        argtypes = tuple(argtypes)
        # A kernel compiled for explicit signatures: the version Numba's own
        # launch would pick, or a TypeError (never another type's code).
        compiled = signatures.select(kernel, argtypes, label, n_in)
        if compiled is not None:
            fold.note_compiled_elsewhere(kernel, argtypes)
            return _refuse_debug(compiled, label)
        # Compiled (or loaded) by Numba in this process already: that one,
        # rather than a second copy of its code from numbax's entry.
        compiled = (getattr(kernel, "overloads", None) or {}).get(argtypes)
        if compiled is not None:
            fold.note_compiled_elsewhere(kernel, argtypes)
            return _refuse_debug(compiled, label)
        # The module globals the body reads are frozen into the code now.
        fold.note_compile(kernel, argtypes)
        # A warm start: numbax's entry beside the kernel's Numba cache, if
        # any, spares this process Numba's compile or load (kernel_cache).
        cached = kernel_cache.load(kernel, (), argtypes)
        if cached is not None:
            return cached
        compiled = checks.compiled_naming_op(
            lambda: kernel.compile(argtypes),
            f"{label}: Numba could not compile the kernel for argument "
            f"types {argtypes}")
        _refuse_debug(compiled, label)
        kernel_cache.save(kernel, (), argtypes, compiled,
                          lambda: grid_reads.axes_read_by_library(compiled))
        return compiled

    def grid_reads(self, kernel, compile):
        if numba_bridge.simulator_enabled():
            # Python, not compiled code: read its bytecode.
            return (False,
                    *grid_reads.axes_read_by_python(kernel.py_func))
        compiled = compile()
        if isinstance(compiled, kernel_cache.CachedKernel):
            return False, compiled.axes_read, compiled.why
        return (bool(compiled.cooperative),
                *grid_reads.axes_read_by_library(compiled))

    def batched_kernel(self, kernel, num_args, broadcast, axis, frozen,
                       scalars, traced=()):
        from numba import cuda
        py_func = fold.with_globals(getattr(kernel, "py_func", kernel),
                                    frozen or {})
        options = dict(getattr(kernel, "targetoptions", None) or {})
        options.pop("device", None)
        options.pop("link", None)  # never folded: the fold reader refuses links
        if getattr(kernel, "_fastmath", False):  # the simulator's kernels
            options["fastmath"] = True
        batched = fold.batched_kernel(cuda, py_func, options, num_args,
                                      broadcast, axis, scalars, traced)
        # What generated it, as numbax's entry in the kernel's Numba cache
        # names it (kernel_cache).
        source = fold.batched_source(num_args, broadcast, axis, scalars,
                                     traced)
        batched._numbax_kind = (
            "batched", num_args, tuple(broadcast), axis,
            hashlib.sha256(source.encode()).hexdigest()[:16])
        return batched

    def compile_batched(self, kernel, batched, argtypes, label):
        # From numbax's entry in the user kernel's Numba cache if there is one.
        kind = batched._numbax_kind
        cached = kernel_cache.load(kernel, kind, argtypes, target=batched)
        if cached is not None:
            return cached
        compiled = batched.compile(argtypes)
        kernel_cache.save(kernel, kind, argtypes, compiled)
        return compiled

    def function_on(self, compiled, ordinal, *, grid, block, shared_mem,
                    label, shared):
        """`shared`: compute capability -> Numba's kernel handle, and
        (capability, SMs) -> a cooperative grid limit.

        Numba keys compiled code by compute capability and loads it as a
        context-independent library, so every device of one capability gets
        the same kernel handle; but Numba's load on a second device wraps
        that library in a second module, and both modules unload it when
        Numba flushes its pending deallocations (at exit, or cuda.close()):
        a double unload inside the driver, which aborts the process. So
        Numba loads each kernel once per compute capability, and further
        devices get their function from the same handle (module setup
        callbacks run only in Numba's bind(), at compile time, never per
        device). A cooperative kernel's grid limit depends on the device's
        capability and multiprocessor count: it is computed once per pair,
        through Numba, and a device that brings a new pair loads through
        Numba (numba_bridge.hold_deallocations_at_exit covers that)."""
        from numba import cuda
        device = cuda.gpus[ordinal]
        capability = tuple(device.compute_capability)
        if isinstance(compiled, kernel_cache.CachedKernel):
            # From numbax's entry in Numba's cache: its cubin, loaded through
            # the driver; a device of another capability compiles through
            # Numba.
            if capability == compiled.capability:
                return compiled.function_on(ordinal, shared_mem)
            # Compiled by Numba with this device's context current, as a
            # trace on XLA's thread would be (kernel/gpu.py's entry).
            compiled = _core.call_on_device(ordinal, compiled.numba_kernel)
        handle = shared.get(capability)
        if compiled.cooperative:
            limit = shared.get(
                (capability, int(device.MULTIPROCESSOR_COUNT)))
            if limit is None:
                handle = None
            else:
                _check_cooperative_grid(grid, limit, ordinal, label)
        if handle is not None:
            return _core.kernel_function(handle, ordinal, shared_mem)
        return _core.call_on_device(
            ordinal, lambda: _load(compiled, grid, block, ordinal, shared,
                                   capability, shared_mem, label))

    def install_launch_hook(self):
        # In the simulator: counts its launches (fallback_simulator).
        numba_cuda_launch.install()


COMPILER = NumbaCuda()


def _refuse_debug(compiled, label: str):
    if getattr(compiled, "debug", False):
        raise ValueError(
            f"{label}: kernels compiled with debug=True report errors "
            "through Numba's own launcher; launch them from a "
            "numba_cuda_callable instead, or compile without debug")
    return compiled


def _load(compiled, grid, block, ordinal, handles, capability, shared_mem,
          label):
    from numba import cuda

    def capability_of(device_id):
        try:
            return tuple(cuda.gpus[device_id].compute_capability)
        except Exception:  # noqa: BLE001 - a device id Numba no longer lists
            return None

    def sm_count_of(device_id):
        return int(cuda.gpus[device_id].MULTIPROCESSOR_COUNT)

    # XLA may instantiate programs on several threads at once, and
    # Numba's get_cufunc checks its per-device cache, then loads: two
    # threads could both load, two modules over one library in one
    # context, unloaded twice later. Every step that may load (the
    # cooperative limit too) runs under the lock.
    with _NUMBA_LOAD_LOCK:
        # The trace compiled (and so loaded) the kernel in whatever
        # context was current then, maybe another device's: reuse that
        # load for every device of its capability.
        loaded = {d: h for d, h in
                  numba_bridge.loaded_kernel_handles(compiled).items()
                  if capability_of(d) == capability}
        if loaded:
            handle = next(iter(loaded.values()))
        else:
            handle = int(compiled._codelibrary.get_cufunc().handle)
            loaded = {ordinal: handle}
        limit = None
        if compiled.cooperative:
            sm_count = sm_count_of(ordinal)
            # Numba computes the limit from its function in the current
            # context: ask on a device where it is loaded that has this
            # SM count (so the same limit). Only a device with an SM
            # count no loaded device has makes Numba load it here, a
            # second module (numbax holds Numba's unloads at exit).
            where = next(
                (d for d in loaded if sm_count_of(d) == sm_count), None)
            if where is None or where == ordinal:
                limit = compiled.max_cooperative_grid_blocks(
                    block, shared_mem)
            else:
                limit = _core.call_on_device(
                    where, lambda: compiled.max_cooperative_grid_blocks(
                        block, shared_mem))
    handles.setdefault(capability, handle)
    if limit is not None:
        handles[(capability, sm_count)] = limit
        _check_cooperative_grid(grid, limit, ordinal, label)
    return _core.kernel_function(handles[capability], ordinal, shared_mem)


def _check_cooperative_grid(grid, limit, ordinal, label):
    if math.prod(grid) > limit:
        raise ValueError(
            f"{label}: the kernel synchronises its grid, so it is "
            f"launched cooperatively, but grid {grid} has "
            f"{math.prod(grid)} blocks and device {ordinal} can run "
            f"at most {limit} at once; shrink the grid (or launch_dims)")
