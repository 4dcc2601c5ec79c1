"""Nested jax.vmap of a numba_cuda_kernel: every level flattened into one batch.

The first (innermost) vmap turns an unbatched call into a batched one:
``batch`` slices along axis 0 of every input and output, an input marked
``broadcast`` holding one slice that every slice reads (_kernel_primitive.py,
``_batch_rule``). A further vmap around it batches that call again. Its
slices are independent calls of the same batched call, and the batched call
is itself independent calls of the unbatched kernel, so the whole thing is
``outer * batch`` independent calls of the unbatched kernel: one batched
call over the product, with slice ``o * batch + i`` being slice ``i`` of
outer slice ``o``. That is row-major order, so the outputs of the flat call
reshape to ``(outer, batch, ...)`` without a copy, and depth 3 and beyond
follow by applying the same step again.

Whether the flat batch runs in one launch is decided exactly as for one
level (``_fold.decide``): the rule looks at the unbatched kernel only, and
the flat batch holds nothing but unbatched calls. Batches above 65535
slices are split into several launches as for one level.

Inputs each level leaves unbatched (``in_axes=None``) stay one shared slice
where every level shares them; an input one level batches and another
shares is repeated to the flat batch (a copy), since slice ``o * batch + i``
must find its own data at that position.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from . import _batching


def flatten(bind: Callable, args, dims, *, op, out_shapes, batch: int,
            broadcast, call) -> tuple[list, list]:
    """Batching rule for a call that is already batched (``batch`` > 0).

    Args:
      bind: binds the kernel primitive (keywords op, out_shapes, batch,
        broadcast).
      args, dims: the batched call's inputs and the axis the new (outer)
        vmap maps over in each, or None.
      op, out_shapes, batch, broadcast, call: the batched call's
        parameters; ``out_shapes`` include the leading ``batch`` axis,
        ``call`` (the unbatched call's outs, launch and scalars) is passed
        on unchanged.

    Returns:
      (outputs, out_dims) as JAX batching rules do: every output with the
      outer axis first, then the inner batch axis.
    """
    outer = _batching.batch_size(args, dims)
    if outer == 0:  # no slice at this level: nothing is launched
        outs = [jnp.zeros((0,) + tuple(s), d) for s, d in out_shapes]
        return outs, [0] * len(outs)
    total = outer * batch
    new_args, flags = [], []
    for a, d, shared in zip(args, dims, broadcast):
        if d is None and shared:
            # Shared by every slice of every level: stays one slice.
            new_args.append(a)
            flags.append(True)
            continue
        if d is None:
            # Batched inside, shared outside: every outer slice reads the
            # same `batch` slices.
            a = jnp.broadcast_to(a[None], (outer,) + a.shape)
        else:
            a = jnp.moveaxis(a, d, 0)
            if shared:
                # Batched outside, shared inside: each outer slice's one
                # slice serves all of its inner slices.
                a = jnp.broadcast_to(a, (outer, batch) + a.shape[2:])
        new_args.append(a.reshape((total,) + a.shape[2:]))
        flags.append(False)
    flat_shapes = tuple(((total,) + tuple(s)[1:], d) for s, d in out_shapes)
    outs = bind(*new_args, op=op, out_shapes=flat_shapes, batch=total,
                broadcast=tuple(flags), call=call)
    outs = [o.reshape((outer, batch) + tuple(s)[1:])
            for o, (s, _) in zip(outs, out_shapes)]
    return outs, [0] * len(outs)
