"""jax.vmap of a numba_cuda_callable: what ``vmap_method`` means.

The batching rule of the callable's primitive (primitive.py) gives
``vmap_method`` the meaning ``jax.ffi.ffi_call`` gives it, except that it
broadcasts an unbatched aliased operand (ffi_call's 'expand_dims' gave it a
size-1 axis, which XLA's verifier refused against the batched output), and
refuses ``jax.vmap`` of callables made without ``vmap_method`` naming the
op and ``vmap_method=`` (ffi_call's refusal names neither; a
``custom_vmap`` around each call did the same at a cost in trace and
lowering time). 'sequential' and 'sequential_unrolled' loop over the slices
in XLA; the others make one batched call, which XLA may split along the
vmapped axis (trace/sharding_rules.py).
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching

from ..trace import checks, sharding_rules
from ..trace.vmap import batch_size, loop_over_batch
from .primitive import numbax_callable_batch_p


def batch_rule(args, dims, *, target, op_key, out_shapes, aliases, vmap_method,
                rule, vmap_only, n_scratch, has_side_effect=False,
                op_label=None, profile_name=None):
    """jax.vmap, with the meaning ffi_call gives ``vmap_method``."""
    if vmap_method is None:
        raise checks.not_batchable(op_label or f"numbax op '{op_key}'")
    size = batch_size(args, dims)
    moved = [a if d is None else jnp.moveaxis(a, d, 0)
             for a, d in zip(args, dims)]
    params = dict(target=target, op_key=op_key, aliases=aliases,
                  vmap_method=vmap_method, n_scratch=n_scratch,
                  has_side_effect=has_side_effect, op_label=op_label,
                  profile_name=profile_name)
    if vmap_method in ("sequential", "sequential_unrolled"):
        outs = loop_over_batch(
            partial(numbax_callable_batch_p.bind, out_shapes=out_shapes,
                    rule=rule, vmap_only=vmap_only, **params),
            args, dims, unroll=vmap_method == "sequential_unrolled")
        return outs, [0] * len(outs)
    if vmap_method in ("expand_dims", "broadcast_all", "legacy_vectorized"):
        aliased = {i for i, _ in aliases}
        new_args, batched = [], []
        for i, (a, d) in enumerate(zip(moved, dims)):
            flag: bool | None = True
            if d is None and i in aliased:
                # Written in place: a whole batch of its own.
                a = jnp.broadcast_to(a[None], (size,) + a.shape)
            elif d is None and vmap_method != "legacy_vectorized":
                # 'legacy_vectorized' (as ffi_call) leaves it unbatched.
                n = size if vmap_method == "broadcast_all" else 1
                a = jnp.broadcast_to(a[None], (n,) + a.shape)
                flag = n == size
            elif d is None:
                flag = None
            new_args.append(a)
            batched.append(flag)
        new_shapes = tuple(((size,) + tuple(s), d) for s, d in out_shapes)
        # The vmapped axis is now axis 0 of every result and of every
        # batched input, independent by vmap's own meaning: a factor XLA
        # may split, in front of the op's own rule (or of one that shares
        # nothing).
        base = rule if rule is not None else sharding_rules.unshared_rule(
            [tuple(np.shape(a))[1:] if f is not None else tuple(np.shape(a))
             for a, f in zip(new_args, batched)],
            [s for s, _ in out_shapes])
        outs = numbax_callable_batch_p.bind(
            *new_args, out_shapes=new_shapes,
            rule=sharding_rules.vmapped(base, batched),
            vmap_only=vmap_only or rule is None, **params)
        return list(outs), [0] * len(outs)
    raise NotImplementedError(
        f"vmap of a numba_cuda_callable needs vmap_method 'sequential', "
        f"'sequential_unrolled', 'expand_dims', 'broadcast_all' or "
        f"'legacy_vectorized'; got {vmap_method!r}")


batching.primitive_batchers[numbax_callable_batch_p] = batch_rule
