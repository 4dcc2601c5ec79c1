"""The launch plan a numba_cuda_kernel's C++ call site launches from.

Built when XLA instantiates a program (kernel.py compiles the kernel, at
trace time or from the key): the compiled kernel's CUfunction in every
visible device's primary context (numba-cuda-mlir's through _mlir.py), with
the launch's grid, block, fold and argument ABI (csrc/launch_plan.h).
numba-cuda kernels load through Numba once per compute capability, shared
by every device of that capability, under one lock; a cooperative kernel's
grid is checked against each device's limit.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

from . import _core, _kernel_cache, _mlir, _numba

# Serialises Numba's kernel loads at plan time (_load).
_NUMBA_LOAD_LOCK = threading.Lock()


def builder(op_ref, compiled, grid, block, empty, batch, broadcast, n_in,
            fold_axis, max_slices, aliases=(), units=((), ()),
            grid_from=(-1, -1, -1), *, num_outputs: int,
            scalars=()) -> Callable[[], Any]:
    """`plan()`: the LaunchPlan of one call of the op `op_ref` refers to,
    built when XLA instantiates a program (_registry._resolve_kernel), with
    `compiled`'s function in every visible device's primary context.
    `scalars`: (position, NumPy kind, bytes) per scalar parameter
    (_scalars.parameter), packed by C++ once, here."""

    def plan():
        from numba import cuda
        op = op_ref()
        if op is None:
            raise LookupError("the numba_cuda_kernel op was collected")
        functions: list[Any] = []
        # compute capability -> Numba's kernel handle, and for
        # cooperative kernels (capability, SMs) -> the grid limit.
        handles: dict = {}
        for ordinal in range(len(cuda.gpus)):
            functions.append(
                _mlir.function_on(compiled, ordinal, op.shared_mem,
                                  op._label) if op._mlir else
                function_on(compiled, grid, block, ordinal, handles,
                            op.shared_mem, op._label))
        # By keyword: a field that C++ (csrc/launch_plan.h) and this
        # call do not agree on fails here, at construction.
        return _core.LaunchPlan(
            owner=op, functions=functions, num_inputs=n_in,
            num_outputs=num_outputs, grid=grid, block=block,
            shared_mem=op.shared_mem,
            cooperative=bool(compiled.cooperative),
            empty_launch=bool(empty or batch < 0), batch=int(batch),
            broadcast=[bool(b) for b in broadcast], fold_axis=fold_axis,
            max_slices=max_slices, abi=_mlir.MEMREF_ABI if op._mlir else 0,
            aliases=list(aliases), scalars=list(scalars),
            lead_units=list(units[0]), trail_units=list(units[1]),
            grid_from=list(grid_from), name=op.profile_name)

    return plan


def function_on(compiled, grid, block, ordinal, handles, shared_mem: int,
                label: str):
    """The CUfunction of `compiled` in device `ordinal`'s primary context.

    `handles` is shared by the devices of one plan: compute capability ->
    Numba's kernel handle, (capability, SMs) -> a cooperative grid limit.
    `label` names the op in errors.

    Numba keys compiled code by compute capability and loads it as a
    context-independent library, so every device of one capability gets
    the same kernel handle; but Numba's load on a second device wraps
    that library in a second module, and both modules unload it when
    Numba flushes its pending deallocations (at exit, or cuda.close()):
    a double unload inside the driver, which aborted processes on two
    H200s. So Numba loads each kernel once per compute capability, and
    further devices get their function from the same handle (module
    setup callbacks run only in Numba's bind(), at compile time, never
    per device). A cooperative kernel's grid limit depends on the
    device's capability and multiprocessor count: it is computed once
    per pair, through Numba, and a device that brings a new pair loads
    through Numba (_numba.hold_deallocations_at_exit covers that)."""
    from numba import cuda
    device = cuda.gpus[ordinal]
    capability = tuple(device.compute_capability)
    if isinstance(compiled, _kernel_cache.CachedKernel):
        # From numbax's entry in Numba's cache: its cubin, loaded through
        # the driver; a device of another capability compiles through Numba.
        if capability == compiled.capability:
            return _core.kernel_function(compiled.kernel_handle(), ordinal,
                                         shared_mem)
        # Compiled by Numba with this device's context current, as a trace
        # on XLA's thread would be (kernel.py, _entry_for_call).
        compiled = _core.call_on_device(ordinal, compiled.numba_kernel)
    handle = handles.get(capability)
    if compiled.cooperative:
        limit = handles.get(
            (capability, int(device.MULTIPROCESSOR_COUNT)))
        if limit is None:
            handle = None
        else:
            _check_cooperative_grid(grid, limit, ordinal, label)
    if handle is not None:
        return _core.kernel_function(handle, ordinal, shared_mem)
    return _core.call_on_device(
        ordinal, lambda: _load(compiled, grid, block, ordinal, handles,
                               capability, shared_mem, label))


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
                  _numba.loaded_kernel_handles(compiled).items()
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
