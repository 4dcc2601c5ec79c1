"""jax.vmap of a numba_cuda_callable: what ``vmap_method`` means.

The batching rule of the callable's primitive (primitive.py) gives
``vmap_method`` the meaning ``jax.ffi.ffi_call`` gives it, except that it
broadcasts an unbatched aliased operand (ffi_call's 'expand_dims' gave it a
size-1 axis, which XLA's verifier refused against the batched output), and
refuses ``jax.vmap`` of callables made without ``vmap_method`` naming the
op and ``vmap_method=`` (ffi_call's refusal names neither; a
``custom_vmap`` around each call did the same at a cost in trace and
lowering time). 'sequential_unrolled' loops over the slices in XLA. Every
other method makes one batched call, which XLA may split along the
vmapped axis (trace/sharding_rules.py): 'sequential' one whose C++ handler
calls func once per slice, in order (its key names the sliced buffers:
CallSite::Invoke), so that each device runs its own shard's slices where
an XLA loop made XLA gather the whole batch onto every device; the others
one that hands func the whole batch.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching

from ..runtime import registry
from ..trace import checks, sharding_rules
from ..trace.vmap import batch_size, loop_over_batch
from .primitive import callable_call_p


def batch_rule(args, dims, *, target, op_key, out_shapes, aliases, vmap_method,
                rule, vmap_only, n_scratch, has_side_effect=False,
                op_label=None, profile_name=None, slices=None):
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
    if vmap_method == "sequential":
        seq = dict(params, out_shapes=out_shapes, rule=rule,
                   vmap_only=vmap_only)
        if slices is not None:  # a vmap of a sequential vmap
            return _sequential_again(args, dims, slices=slices, **seq)
        return _sequential(args, dims, **seq)
    if vmap_method == "sequential_unrolled":
        outs = loop_over_batch(
            partial(callable_call_p.bind, out_shapes=out_shapes,
                    rule=rule, vmap_only=vmap_only, **params),
            args, dims, unroll=True)
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
        outs = callable_call_p.bind(
            *new_args, out_shapes=new_shapes,
            rule=sharding_rules.vmapped(base, batched),
            vmap_only=vmap_only or rule is None, **params)
        return list(outs), [0] * len(outs)
    raise NotImplementedError(
        f"vmap of a numba_cuda_callable needs vmap_method 'sequential', "
        f"'sequential_unrolled', 'expand_dims', 'broadcast_all' or "
        f"'legacy_vectorized'; got {vmap_method!r}")


def _empty(out_shapes, flags):
    """A batch of no slice: empty results, func never called."""
    outs = [jnp.zeros(tuple(s), d) for s, d in out_shapes]
    return outs, [0 if f else None for f in flags]


def _sequential(args, dims, *, op_key, out_shapes, aliases, rule, vmap_only,
                n_scratch, **params):
    """'sequential': one call holding the whole batch, whose handler calls
    func once per slice, in slice order, on XLA's stream. Batched inputs
    and the outputs are sliced along axis 0 (an unbatched aliased input is
    broadcast first: each slice writes its own); unbatched inputs and the
    scratch buffers are handed whole to every slice (scratch is reused,
    slice after slice, as the loop reused it). The vmapped axis leads every
    sliced array's rule: the batch partitioner splits it, and each device
    calls func on its own shard's slices."""
    size = batch_size(args, dims)
    n_out = len(out_shapes) - n_scratch
    result_flags = [True] * n_out + [False] * n_scratch
    if size == 0:
        return _empty([((0,) + tuple(s), d) if f else (s, d)
                       for (s, d), f in zip(out_shapes, result_flags)],
                      result_flags)
    aliased = {i for i, _ in aliases}
    new_args, flags = [], []
    for i, (a, d) in enumerate(zip(args, dims)):
        if d is not None:
            a, f = jnp.moveaxis(a, d, 0), True
        elif i in aliased:  # written in place: a slice of its own each
            a, f = jnp.broadcast_to(a[None], (size,) + a.shape), True
        else:
            f = False
        new_args.append(a)
        flags.append(f)
    new_shapes = tuple(((size,) + tuple(s), d) if f else (tuple(s), d)
                       for (s, d), f in zip(out_shapes, result_flags))
    base = rule if rule is not None else sharding_rules.unshared_rule(
        [tuple(np.shape(a))[1:] if f else tuple(np.shape(a))
         for a, f in zip(new_args, flags)],
        [s for s, _ in out_shapes])
    sliced = tuple(flags) + tuple(result_flags)
    outs = callable_call_p.bind(
        *new_args, op_key=registry.with_slices(op_key, sliced),
        out_shapes=new_shapes, aliases=aliases, n_scratch=n_scratch,
        rule=sharding_rules.vmapped(base, [True if f else None for f in flags],
                                    result_flags),
        vmap_only=vmap_only or rule is None, slices=sliced, **params)
    return list(outs), [0 if f else None for f in result_flags]


def _sequential_again(args, dims, *, op_key, out_shapes, aliases, rule,
                      vmap_only, n_scratch, slices, **params):
    """A vmap around a sequential vmap's call: one batch of every level's
    slices, outer-major (the order nested loops ran them in), as the
    kernel's nested vmaps flatten (kernel/vmap.py). An input the inner
    level handed whole but the outer one batches is repeated for each inner
    slice; one batched inside only is shared by the outer slices."""
    outer = batch_size(args, dims)
    n_in = len(args)
    result_flags = list(slices[n_in:])
    inner = int(out_shapes[0][0][0])  # outputs are always sliced
    total = outer * inner
    new_shapes = tuple(((total,) + tuple(s)[1:], d) if f else (tuple(s), d)
                       for (s, d), f in zip(out_shapes, result_flags))
    if outer == 0:
        outs, out_dims = _empty(new_shapes, result_flags)
        return ([o.reshape((0, inner) + o.shape[1:]) if f else o
                 for o, f in zip(outs, result_flags)], out_dims)
    v = rule.results[0][0]  # the inner vmap's factor leads every output
    operands = list(rule.operands)
    new_args, flags = [], []
    for i, (a, d, f) in enumerate(zip(args, dims, slices[:n_in])):
        if d is None and not f:
            new_args.append(a)
            flags.append(False)
            continue
        if d is None:
            a = jnp.broadcast_to(a[None], (outer,) + a.shape)
        else:
            a = jnp.moveaxis(a, d, 0)
            if not f:
                a = jnp.broadcast_to(a[:, None], (outer, inner) + a.shape[1:])
                operands[i] = (v,) + tuple(operands[i])
        new_args.append(a.reshape((total,) + a.shape[2:]))
        flags.append(True)
    sliced = tuple(flags) + tuple(result_flags)
    outs = callable_call_p.bind(
        *new_args, op_key=registry.with_slices(op_key, sliced),
        out_shapes=new_shapes, aliases=aliases, n_scratch=n_scratch,
        rule=sharding_rules.Rule(tuple(operands), rule.results),
        vmap_only=vmap_only, slices=sliced, **params)
    outs = [o.reshape((outer, inner) + o.shape[1:]) if f else o
            for o, f in zip(outs, result_flags)]
    return outs, [0 if f else None for f in result_flags]


batching.primitive_batchers[callable_call_p] = batch_rule
