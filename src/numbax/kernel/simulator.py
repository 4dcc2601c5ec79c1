"""A numba_cuda_kernel's launch on JAX's CPU backend, through Numba's simulator.

On the CPU a kernel op lowers to numbax's callable target, whose func is a
*launcher*: the simulator's version of the C++ launch (kernel_handler.cc),
with the same slicing of a vmapped batch and the same chunks when it folds.
The op keeps one per call shape and batch size in its :class:`Launchers`
(at most MAX_LAUNCHERS), which only this module reads; the registry refers
to each weakly (:class:`LauncherRef`). The CPU platform's lowering of the
kernel primitive is registered here: the shared body (primitive.lower)
with the callable target and :func:`key`.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from functools import partial

import numpy as np
from jax.interpreters import mlir

from ..runtime import registry, targets
from . import calls, primitive, sharding, vmap
from .launch_config import Call

# Simulator launchers kept per op (one per unbatched/batched call shape).
MAX_LAUNCHERS = 256


class Launchers:
    """One op's simulator launchers, kept by the op (``op.launchers``) and
    read and written only here.

    They are kept alive here (the registry refers to them weakly), most
    recently used last, at most MAX_LAUNCHERS: one per batch size would
    grow without bound. An evicted one is made again when a program needs
    it; instantiated call sites hold their own.
    """

    __slots__ = ("_made",)

    def __init__(self):
        # Launch signature (launcher()) -> launcher, least recently used first.
        self._made: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._made)

    def get(self, signature):
        return self._made.get(signature)

    def keep(self, signature, made):
        """`made`, or the launcher another thread kept for `signature`
        first, now the most recently used; the least recently used ones
        beyond MAX_LAUNCHERS are dropped."""
        made = self._made.setdefault(signature, made)
        try:
            self._made.move_to_end(signature)
            while len(self._made) > max(1, MAX_LAUNCHERS):
                self._made.popitem(last=False)
        except KeyError:  # another thread evicted it meanwhile
            pass
        return made

    def clear(self) -> None:
        """numbax.clear_caches(): drop them all (LauncherRef makes one
        again from the op when C++ asks for it)."""
        self._made.clear()


class LauncherRef:
    """The registry's reference to one of an op's simulator launchers.

    Weak, as the registry's references are (neither the launcher nor the op
    is kept alive by it); the op keeps its launchers, at most MAX_LAUNCHERS,
    and numbax.clear_caches() drops them all, at any time, also between a
    trace and XLA's instantiate stage in another thread. Called, it returns
    the launcher (a strong reference), made again from the op (as for a
    deserialised program) when it was dropped; None only once the op is
    gone.
    """

    __slots__ = ("_op", "_spec", "_launcher")

    def __init__(self, op, spec, made=None):
        self._op = weakref.ref(op)
        # (avals, out_shapes, batch, broadcast, aliases, Call, grid_from)
        self._spec = spec
        self._launcher = (weakref.ref(made) if made is not None
                          else lambda: None)

    def alive(self) -> bool:
        """Whether a call would return a launcher (without making one)."""
        return self._launcher() is not None or self._op() is not None

    def __call__(self):
        made = self._launcher()
        if made is None:
            op = self._op()
            if op is None:
                return None
            made = launcher(op, *self._spec)
            self._launcher = weakref.ref(made)
        return made


def launcher(op, avals, out_shapes, batch, broadcast, aliases=(),
             call: Call | None = None, grid_from=(-1, -1, -1)):
    """The function the CPU handler calls: the launch(es) in the
    simulator, made once per call shape and kept on the op."""
    op.compiler.check_simulated(op.label)
    call = call if call is not None else op.fixed_call()
    grid, block, empty = call.grid, call.block, call.empty
    n_in = len(avals)
    all_avals = list(avals) + [(tuple(s), np.dtype(d)) for s, d in out_shapes]
    scalars, traced = call.scalars, call.traced
    argtypes = op.kernel_argtypes(all_avals, batch, scalars, traced)
    decision, batched = vmap.folded(op, argtypes, grid, batch, broadcast,
                                    scalars=scalars, traced=traced)
    fold_axis = -1 if batched is None else vmap.axis_index(decision)
    max_slices = vmap.MAX_SLICES_PER_LAUNCH if batched is not None \
        else None
    # (A signature without traced scalars is the one it always was.)
    signature = (n_in, batch, tuple(broadcast), fold_axis, max_slices,
                 aliases, grid, block, scalars, tuple(grid_from)) + (
                     (traced,) if traced else ())
    made = op.launchers.get(signature)
    if made is None:
        formals = op.scalar_formals(argtypes, scalars, n_in + len(scalars))
        values = op.scalar_values(scalars, formals)
        # With traced scalars, each launch (or slice) runs the generated
        # kernel that reads them on the device and calls the body.
        kernel = op.kernel if not traced or batched is not None else \
            vmap.traced_kernel(op, argtypes, scalars, traced)
        made = make_launcher(
            kernel, op.shared_mem, op.py_func, n_in, grid, block,
            empty, batch, broadcast, batched, fold_axis, max_slices,
            {o for _, o in aliases},
            [(s.position, v) for s, v in zip(scalars, values)],
            tuple(grid_from))
    # Kept alive by the op: the registry refers to it weakly.
    return op.launchers.keep(signature, made)


def key(op, avals, out_shapes, batch, broadcast, call: Call | None = None,
        split=None) -> str:
    """The key of a call lowered for the CPU; its launcher made now, so
    that its errors surface at trace time."""
    call = call if call is not None else op.fixed_call()
    n_in = len(avals)
    aliases = op.alias_pairs()
    ties = sharding.grid_from(op, avals, batch, call.out_shapes)
    units = (split.buffer_units() if split is not None
             else ((), ()))
    made = launcher(op, avals, out_shapes, batch, broadcast, aliases, call,
                    ties)

    def make_entry(key):
        return registry.CallableEntry(
            key, LauncherRef(op, (avals, out_shapes, batch, broadcast,
                                  aliases, call, ties), made),
            n_in, call.num_outputs, 0, aliases=aliases,
            name=call.name or op.profile_name, units=units)
    return calls.program_key(op, avals, batch, broadcast, call, split,
                            make_entry)


def _lowered_key(ctx, op, avals, out_shapes, batch, broadcast, call,
                 split) -> str:
    del ctx
    return key(op, avals, out_shapes, batch, broadcast, call, split)


mlir.register_lowering(
    primitive.numbax_kernel_p,
    partial(primitive.lower, targets.CALLABLE_TARGET, _lowered_key),
    platform="cpu")


def entry(op, key, avals, batch, broadcast, aliases, call: Call, units):
    """The CPU entry of a key this process did not trace; its launcher is
    made when C++ asks for it."""
    return registry.CallableEntry(
        key, LauncherRef(op, (
            avals, call.out_avals(batch), batch, broadcast, aliases, call,
            sharding.grid_from(op, avals, batch, call.out_shapes))),
        len(avals), call.num_outputs, 0, aliases=aliases,
        name=call.name or op.profile_name,
        units=units if any(units) else ())


def make_launcher(kernel, shared_mem, py_func, n_in, grid, block, empty, batch,
                  broadcast, batched, fold_axis, max_slices,
                  aliased_outputs=frozenset(), scalars=(),
                  grid_from=(-1, -1, -1)):
    """The simulator's version of the C++ launch (same slicing, same
    chunks of at most MAX_SLICES_PER_LAUNCH slices when folded).
    `aliased_outputs`: the indices of outputs aliased to an input, which
    the CPU handler has already given the input's values. `scalars`:
    (position, value) of each scalar parameter, sorted by position, passed
    by value to every launch (as the C++ launch packs them). As in C++, a
    call XLA split gets each device's shards: the batch is output 0's
    leading extent, and each grid axis `grid_from` ties to an axis of
    output 0 covers that axis as received."""
    tied = any(a >= 0 for a in grid_from)

    def params(buffers):
        if not scalars:
            return buffers
        out = list(buffers)
        for position, value in scalars:
            out.insert(position, value)
        return out

    def launcher(*args):
        *arrays, stream = args
        local_batch, local_grid = batch, list(grid)
        if batch or tied:
            shape = arrays[n_in].shape
            if batch:
                local_batch = int(shape[0])
            for a, axis in enumerate(grid_from):
                if axis >= 0:
                    local_grid[a] = -(-int(shape[axis]) // max(1, block[a]))
        if empty or 0 in local_grid or (batch and not local_batch):
            # As the GPU handler: outputs are zero-filled, except one
            # aliased to an input, which keeps the input's values.
            # (A simulator array hands NumPy's attributes on to the host
            # array it wraps: XLA's buffer.)
            inputs = {a.ctypes.data for a in arrays[:n_in]}
            for o, out in enumerate(arrays[n_in:]):
                if (o not in aliased_outputs and
                        out.ctypes.data not in inputs):
                    out.fill(0)
            return None
        if batched is not None:
            for start in range(0, local_batch, max_slices):
                count = min(max_slices, local_batch - start)
                chunk = [a[0:1] if (i < n_in and broadcast[i])
                         else a[start:start + count]
                         for i, a in enumerate(arrays)]
                chunk_grid = list(local_grid)
                chunk_grid[fold_axis] = count
                batched[tuple(chunk_grid), block, stream, shared_mem](
                    *params(chunk))
            return None
        slices = range(local_batch) if batch else [None]
        for s in slices:
            if s is None:
                view = arrays
            else:
                view = [a[0] if (i < n_in and broadcast[i]) else a[s]
                        for i, a in enumerate(arrays)]
            kernel[tuple(local_grid[:3]), block[:3], stream,
                   shared_mem](*params(view))
        return None
    launcher.__module__ = getattr(
        py_func, "__module__", None)  # type: ignore[assignment]
    launcher.__qualname__ = (
        getattr(py_func, "__qualname__", "kernel") + ".simulator")
    return launcher
