"""What every op kind's vmap shares: the batch size, and the loop.

A callable's vmap (callable/vmap.py, 'sequential') and XLACustomKernel's
default rule (custom_kernel/vmap.py) run an op once per slice of the batch
in an XLA loop when they cannot batch it otherwise (numba_cuda_kernel
launches its slices from C++ instead: kernel/vmap.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp


def batch_size(args: Sequence, dims: Sequence) -> int:
    """The size of the vmapped axis (`dims`: each arg's axis, or None)."""
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def loop_over_batch(bind_one: Callable, args: Sequence, dims: Sequence,
                    unroll: bool = False) -> list:
    """bind_one(*args) for each slice, in an XLA loop (unrolled if asked):
    batched args are sliced along their axis, unbatched ones passed whole
    (no copy). Returns the results stacked along axis 0."""
    moved = [a if d is None else jnp.moveaxis(a, d, 0)
             for a, d in zip(args, dims)]
    mapped = [d is not None for d in dims]

    def one(carry, sliced):
        it = iter(sliced)
        full = [next(it) if m else a for a, m in zip(moved, mapped)]
        return carry, bind_one(*full)
    _, outs = jax.lax.scan(one, (), [a for a, m in zip(moved, mapped) if m],
                           unroll=unroll)
    return list(outs)
