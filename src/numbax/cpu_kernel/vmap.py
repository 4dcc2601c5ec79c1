"""jax.vmap of a numba_kernel: the whole batch in one handler call.

``vmap_method`` None or ``'sequential'``: the kernel sees one slice at a
time, as under ffi_call's 'sequential', but every slice runs from one call
of the handler: the generated wrapper loops over the slices (or, with
``parallel='xla'``, the handler spreads them over XLA's intra-op pool).
Nested vmaps add leading batch axes to the same call: every output carries
all of them, which the wrapper flattens into one batch; an input batched at
some levels only keeps just those axes, and the wrapper finds its slice from
the call's (an aliased one, written slice by slice, is broadcast to all).

``'expand_dims'``, ``'broadcast_all'`` and ``'legacy_vectorized'`` keep
ffi_call's meaning: the kernel gets the batch as a leading axis of its
arrays, in one call, and must handle it.

Either way the vmapped axis is a factor XLA may split on several devices
(trace/sharding_rules.py): each device runs its own slices.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching

from ..trace import sharding_rules
from ..trace.vmap import batch_size
from .primitive import numbax_cpu_kernel_p

PER_SLICE = (None, "sequential")


def batch_rule(args, dims, *, op, out_shapes, scalars, aliases, batched,
               batch_ndim, rule, vmap_only):
    size = batch_size(args, dims)
    aliased = {i for i, _ in aliases}
    new_args: list = []
    # Per input, the batch levels it carries (outermost first).
    new_batched: list[tuple] = []
    # Per input: True (batched along this level's axis), None (no axis).
    flags: list[bool | None] = []
    # An input broadcast to the inner batch axes no longer fits the inner
    # levels' rule: only this level's axis is then split.
    keep_rule = True
    if op.vmap_method in PER_SLICE:
        inner = tuple(out_shapes[0][0][:batch_ndim]) if out_shapes else ()
        for i, (a, d, was) in enumerate(zip(args, dims, batched)):
            was = tuple(was)
            if i in aliased and not (d is not None and all(was)):
                # Written in place, slice by slice: every level of its own.
                a = jnp.moveaxis(a, d, 0) if d is not None else a[None]
                rest = tuple(a.shape[1 + sum(was):])
                at_levels, j = [a.shape[0]], 1
                for on in was:
                    at_levels.append(a.shape[j] if on else 1)
                    j += on
                a = jnp.broadcast_to(a.reshape(tuple(at_levels) + rest),
                                     (size,) + inner + rest)
                keep_rule = keep_rule and all(was)
                new_args.append(a)
                new_batched.append((True,) * (batch_ndim + 1))
                flags.append(True)
                continue
            if d is None:
                # Not batched at this level: it keeps the levels it has
                # (the wrapper finds its slice), never copied per slice.
                new_args.append(a)
                new_batched.append((False,) + was)
                flags.append(None)
                continue
            new_args.append(jnp.moveaxis(a, d, 0))
            new_batched.append((True,) + was)
            flags.append(True)
        new_ndim = batch_ndim + 1
    else:
        for i, (a, d) in enumerate(zip(args, dims)):
            flag: bool | None = True
            if d is not None:
                a = jnp.moveaxis(a, d, 0)
            elif i in aliased:
                a = jnp.broadcast_to(a[None], (size,) + tuple(a.shape))
            elif op.vmap_method == "legacy_vectorized":
                flag = None
            else:
                n = size if op.vmap_method == "broadcast_all" else 1
                a = jnp.broadcast_to(a[None], (n,) + tuple(a.shape))
                flag = n == size
            new_args.append(a)
            new_batched.append(())
            flags.append(flag)
        new_ndim = 0
    new_shapes = tuple(((size,) + tuple(s), d) for s, d in out_shapes)
    base = rule if rule is not None and keep_rule else \
        sharding_rules.unshared_rule(
        [tuple(np.shape(a))[1:] if f is not None else tuple(np.shape(a))
         for a, f in zip(new_args, flags)], [s for s, _ in out_shapes])
    outs = numbax_cpu_kernel_p.bind(
        *new_args, op=op, out_shapes=new_shapes, scalars=scalars,
        aliases=aliases, batched=tuple(new_batched), batch_ndim=new_ndim,
        rule=sharding_rules.vmapped(base, flags),
        vmap_only=vmap_only or rule is None)
    return list(outs), [0] * len(outs)


batching.primitive_batchers[numbax_cpu_kernel_p] = batch_rule
