"""The loaded kernel a numba_cuda_kernel's C++ call site launches from.

Built when XLA instantiates a program (gpu.py compiles the kernel, at
trace time or from the key): the compiled kernel's CUfunction in every
visible device's primary context, which the kernel's compiler gives
(Compiler.function_on), with the launch's grid, block, fold and the
compiler's argument ABI (csrc/loaded_kernel.h).
"""

from __future__ import annotations

from typing import Any, Callable

from .. import _core


def builder(op_ref, compiled, grid, block, empty, batch, broadcast, n_in,
            fold_axis, max_slices, aliases=(), units=((), ()),
            grid_from=(-1, -1, -1), *, num_outputs: int,
            scalars=(), name: str | None = None) -> Callable[[], Any]:
    """`load()`: the LoadedKernel of one call of the op `op_ref` refers to,
    built when XLA instantiates a program (registry._resolve_kernel), with
    `compiled`'s function in every visible device's primary context.
    `scalars`: (position, NumPy kind, bytes) per scalar parameter
    (scalar_args.parameter), packed by C++ once, here. `name`: the call's
    name in profiles where not the op's (launch_config.Call.name)."""

    def load():
        from numba import cuda
        op = op_ref()
        if op is None:
            raise LookupError("the numba_cuda_kernel op was collected")
        compiler = op.compiler
        # What the compiler keeps across the devices of one loaded kernel.
        shared: dict = {}
        functions = [
            compiler.function_on(compiled, ordinal, grid=grid, block=block,
                                 shared_mem=op.shared_mem, label=op.label,
                                 shared=shared)
            for ordinal in range(len(cuda.gpus))]
        # By keyword: a field that C++ (csrc/loaded_kernel.h) and this
        # call do not agree on fails here, at construction.
        return _core.LoadedKernel(
            owner=op, functions=functions, num_inputs=n_in,
            num_outputs=num_outputs, grid=grid, block=block,
            shared_mem=op.shared_mem,
            cooperative=bool(compiled.cooperative),
            empty_launch=bool(empty or batch < 0), batch=int(batch),
            broadcast=[bool(b) for b in broadcast], fold_axis=fold_axis,
            max_slices=max_slices, abi=compiler.abi,
            aliases=list(aliases), scalars=list(scalars),
            lead_units=list(units[0]), trail_units=list(units[1]),
            grid_from=list(grid_from), name=name or op.profile_name)

    return load
