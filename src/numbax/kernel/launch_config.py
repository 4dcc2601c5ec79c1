"""A numba_cuda_kernel's launch configuration: checked against CUDA's limits,
the grid and block that ``launch_dims`` gives, and what one call launches.

Pure: needs neither the kernel nor Numba, so a bad configuration is refused
before either is looked at.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..trace import checks

# Per rank: 1-D launches use threads_per_block instead.
_DEFAULT_BLOCKS: dict[int, tuple[int, ...]] = {2: (16, 16), 3: (8, 8, 4)}

# CUDA's launch limits, the same on every device Numba CUDA supports.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_SHARED_MEM = 2**31 - 1


def as_dims(value, what: str) -> tuple[int, ...]:
    """1 to 3 extents from an int or a sequence; ValueError naming `what`."""
    if isinstance(value, (int, np.integer)):
        dims = (value,)
    else:
        try:
            dims = tuple(value)
        except TypeError:
            raise ValueError(
                f"{what} must be an int or a sequence of 1 to 3 ints, got "
                f"{type(value).__name__}: {value!r}") from None
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must have 1 to 3 axes, got {len(dims)}: "
                         f"{value!r}")
    out = []
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise ValueError(f"{what} must hold ints, got {value!r}")
        if d < 0:
            raise ValueError(f"{what} has a negative extent: {value!r}")
        out.append(int(d))
    return tuple(out)


def pad3(dims):
    """`dims` with unit extents appended up to 3 axes."""
    return tuple(dims) + (1,) * (3 - len(dims))


def check_launch_limits(grid, block, origin: str) -> None:
    """ValueError, naming the fix, for a launch CUDA would refuse."""
    grid, block = pad3(grid), pad3(block)
    if 0 in grid or 0 in block:
        return  # nothing is launched
    for axis, (n, limit) in enumerate(zip(block, MAX_BLOCK)):
        if n > limit:
            raise ValueError(
                f"{origin}: block {block} has {n} threads on axis {axis}; CUDA "
                f"allows at most {limit} there: use smaller blocks and a "
                "larger grid")
    if math.prod(block) > MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"{origin}: block {block} has {math.prod(block)} threads; CUDA "
            f"allows at most {MAX_THREADS_PER_BLOCK} per block: use smaller "
            "blocks and a larger grid")
    for axis, (n, limit) in enumerate(zip(grid, MAX_GRID)):
        if n > limit:
            raise ValueError(
                f"{origin}: grid {grid} has {n} blocks on axis {axis}; CUDA "
                f"allows at most {limit} there: use larger blocks, or loop "
                "inside the kernel (a grid-stride loop)")


def launch_config(launch_dims, threads_per_block):
    """(grid, block) for `launch_dims` extents, as numbax documents it."""
    if len(launch_dims) == 1:
        n = launch_dims[0]
        block = (max(1, min(threads_per_block, n)),)
    else:
        block = tuple(max(1, min(b, n)) for b, n in
                      zip(_DEFAULT_BLOCKS[len(launch_dims)], launch_dims))
    grid = tuple(-(-n // b) for n, b in zip(launch_dims, block))
    return pad3(grid), pad3(block)


def _int_in(value, low: int, high: int) -> bool:
    """An int (not a bool) from `low` to `high`."""
    return (not isinstance(value, bool)
            and isinstance(value, (int, np.integer))
            and low <= int(value) <= high)


def check_launch_configuration(*, grid, block, launch_dims, threads_per_block,
                               shared_mem, vmap_method):
    """(grid, block, launch_dims) checked; ValueError for a bad configuration.

    Pure: needs neither the kernel nor Numba.
    """
    checks.check_vmap_method(vmap_method, "numba_cuda_kernel", kernel=True)
    if not _int_in(threads_per_block, 1, MAX_THREADS_PER_BLOCK):
        raise ValueError(
            f"threads_per_block must be an int from 1 to "
            f"{MAX_THREADS_PER_BLOCK} (CUDA's limit), got {threads_per_block!r}")
    if not _int_in(shared_mem, 0, MAX_SHARED_MEM):
        raise ValueError(
            f"shared_mem must be an int >= 0 bytes (below 2**31), got "
            f"{shared_mem!r}")
    explicit = grid is not None or block is not None
    if explicit and launch_dims is not None:
        raise ValueError(
            "give either grid and block, or launch_dims, not both")
    if explicit and (grid is None or block is None):
        raise ValueError(
            "grid and block go together: give both (or use launch_dims)")
    if not explicit and launch_dims is None:
        raise ValueError(
            "numba_cuda_kernel needs a launch configuration: grid=..., "
            "block=... or launch_dims=...")
    if explicit:
        if vmap_method is not None:
            raise ValueError(
                "an explicit grid cannot be combined with vmap_method: use "
                "launch_dims, or leave vmap_method=None")
        grid, block = as_dims(grid, "grid"), as_dims(block, "block")
        check_launch_limits(grid, block, "numba_cuda_kernel")
    elif not callable(launch_dims):
        # A function of the call's arguments is checked per call, on what
        # it returns (op.py, NumbaCudaKernel._resolve).
        launch_dims = as_dims(launch_dims, "launch_dims")
        dims_grid, dims_block = launch_config(launch_dims, threads_per_block)
        check_launch_limits(dims_grid, dims_block,
                            f"numba_cuda_kernel(launch_dims={launch_dims})")
    return grid, block, launch_dims


@dataclasses.dataclass(frozen=True)
class Call:
    """What one call of an op launches, resolved when it is traced: its
    outputs (unbatched), grid and block, the scalars passed by value and the
    traced scalars' positions.
    A parameter of numbax_kernel_p (hashable, compared by value), and what
    the call part of the op's key spells where it is not fixed."""
    outs: tuple  # ((shape, np.dtype), ...)
    grid: tuple  # 3 ints
    block: tuple  # 3 ints
    scalars: tuple = ()  # scalar_args.Scalar, by position
    # The call's name in profiles where it is not the op's own (an
    # XLACustomKernel's, ops.Op.use_name): a parameter, so that JAX's
    # lowering cache never gives one use's custom call the other's name.
    name: str | None = None
    # Positions (among the inputs, as scalars') of the traced scalars: 0-d
    # inputs passed as 1-element buffers, read on the device by a generated
    # kernel around the user's (scalar_args.is_traced).
    traced: tuple = ()

    @property
    def empty(self) -> bool:
        return 0 in self.grid or 0 in self.block

    @property
    def num_outputs(self) -> int:
        return len(self.outs)

    @property
    def out_shapes(self) -> list:
        """The unbatched output shapes."""
        return [tuple(s) for s, _ in self.outs]

    def out_avals(self, batch: int) -> list:
        lead = (batch,) if batch else ()
        return [(lead + tuple(s), np.dtype(d)) for s, d in self.outs]
