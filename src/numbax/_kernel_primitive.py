"""numbax_kernel_p: the JAX primitive every numba_cuda_kernel binds.

Its abstract eval (the op's declared outputs), its lowering to numbax's
kernel target (the CUDA platform) or to a simulator launch (the CPU), its
batching rule (one batch of every vmap level's slices, launched from one
handler call) and its refusals of differentiation, naming the user's op.
The op itself (kernel.py) is a static parameter: what the rules need of it
(keys, labels, aliases) they ask it for.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from . import (_batching, _checks, _compat, _nested_vmap, _partitioning,
               _profile, _registry, _targets)

numbax_kernel_p = _compat.eager_primitive("numbax_kernel")


@numbax_kernel_p.def_abstract_eval
def _abstract_eval(*args, op, out_shapes, batch, broadcast, call):
    return [_compat.shaped_array(s, d) for s, d in out_shapes]


def _lower(ctx, *args, op, out_shapes, batch, broadcast, call, platform):
    avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_in]
    # How XLA may split the call: the op's rule, and the vmapped axis of a
    # batched call (in a program of several devices); None: not at all.
    split = op._split(ctx, avals, batch, broadcast, call)
    if platform == "cuda":
        outs = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_out]
        key = op._gpu_key(avals, outs, batch, broadcast, call, split)
        target = _targets.KERNEL_TARGET
    else:
        key = op._simulator_key(avals, out_shapes, batch, broadcast, call,
                                split)
        target = _targets.CALLABLE_TARGET
    if (getattr(ctx.module_context.lowering_parameters, "for_export", False)
            and _registry.is_ambiguous(key)):
        raise _registry.ambiguous_export_error(op._label, key, op.name)
    aliases = op.input_output_aliases or {}
    if split is not None:
        return _partitioning.lower_split(
            ctx, args, target=_targets.BATCH_TARGETS[target], split=split,
            key=key, aliases=tuple(dict(aliases).items()),
            profile_name=op.profile_name)
    # The custom call is named after the op in HLO (_profile.py).
    with _profile.location(ctx, op.profile_name):
        return jax.ffi.ffi_lowering(
            target,
            operand_output_aliases=dict(aliases),
        )(ctx, *args, key=key)


mlir.register_lowering(numbax_kernel_p, partial(_lower, platform="cuda"),
                       platform="cuda")
mlir.register_lowering(numbax_kernel_p, partial(_lower, platform="cpu"),
                       platform="cpu")


def _batch_rule(args, dims, *, op, out_shapes, batch, broadcast, call):
    # `call` (the resolved outs, launch and scalars of one unbatched call)
    # is the same for every slice: scalars are never batched.
    if batch:  # a vmap around a vmap: one batch of every level's slices
        return _nested_vmap.flatten(
            numbax_kernel_p.bind, args, dims, op=op, out_shapes=out_shapes,
            batch=batch, broadcast=broadcast, call=call)
    size = _batching.batch_size(args, dims)
    if size == 0:  # no slice to launch: empty outputs
        outs = [jnp.zeros((0,) + tuple(s), d) for s, d in out_shapes]
        return outs, [0] * len(outs)
    # Every vmap_method batches the call; 'sequential' never folds (_fold),
    # so its slices are launched one after another from one handler call.
    aliased_inputs = set((op.input_output_aliases or {}).keys())
    new_args, flags = [], []
    for i, (a, d) in enumerate(zip(args, dims)):
        if d is None:
            a, reuse = a[None], True
        else:
            a = jnp.moveaxis(a, d, 0)
            reuse = a.shape[0] == 1 and size != 1
        if reuse and i in aliased_inputs:
            # Written in place: every slice needs its own copy, of the
            # input's own dtype (`+ 0` made a bool int32, which XLA's alias
            # then refused). The broadcast is a new value; XLA copies an
            # aliased operand that is still read elsewhere.
            a, reuse = jnp.broadcast_to(a, (size,) + a.shape[1:]), False
        new_args.append(a)
        flags.append(reuse)
    out_batched = tuple(((size,) + tuple(s), d) for s, d in out_shapes)
    outs = numbax_kernel_p.bind(*new_args, op=op, out_shapes=out_batched,
                                batch=size, broadcast=tuple(flags),
                                call=call)
    return outs, [0] * len(outs)


batching.primitive_batchers[numbax_kernel_p] = _batch_rule


def _jvp_rule(primals, tangents, *, op, **params):
    # Only called with a tangent that is not a symbolic zero: stop_gradient
    # around every input still lets the op run under jax.grad.
    del primals, tangents, params
    raise _checks.not_differentiable(op._label, "the kernel")


def _transpose_rule(cotangents, *args, op, **params):
    # jax.linear_transpose treats the op as linear in an input: it is not.
    del cotangents, args, params
    raise _checks.not_differentiable(op._label, "the kernel")


# Name the user's op (JAX's own refusals name numbax's shared primitive).
ad.primitive_jvps[numbax_kernel_p] = _jvp_rule
ad.primitive_transposes[numbax_kernel_p] = _transpose_rule
