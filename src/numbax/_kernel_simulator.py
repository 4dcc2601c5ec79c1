"""A numba_cuda_kernel's launch on JAX's CPU backend, through Numba's simulator.

The function the CPU handler calls for one call shape: the simulator's
version of the C++ launch (kernel_handler.cc), with the same slicing of a
vmapped batch and the same chunks when it folds. kernel.py keeps one per
call shape and batch size.
"""

from __future__ import annotations

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
            inputs = {a._ary.__array_interface__["data"][0]
                      for a in arrays[:n_in]}
            for o, out in enumerate(arrays[n_in:]):
                if (o not in aliased_outputs and
                        out._ary.__array_interface__["data"][0] not in inputs):
                    out._ary.fill(0)
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
