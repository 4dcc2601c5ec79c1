"""numbax_kernel_p: the JAX primitive every numba_cuda_kernel binds.

Its abstract eval (the op's declared outputs), its lowering to numbax's
kernel target (the CUDA platform) or to a simulator launch (the CPU), and
its refusals of differentiation, naming the user's op; its batching rule is
in vmap.py. The op itself (op.py) is a static parameter: what the rules
need of it (keys, labels, aliases) they ask it for.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from jax.interpreters import ad, mlir

from ..runtime import compat, keys, registry, targets
from ..trace import checks, profile_names, sharding_rules

numbax_kernel_p = compat.eager_primitive("numbax_kernel")


@numbax_kernel_p.def_abstract_eval
def _abstract_eval(*args, op, out_shapes, batch, broadcast, call):
    # jax.export's symbolic extents reach here through jax.vmap's batch
    # axis too (a direct call is refused in checks.as_input_arrays).
    checks.check_concrete_avals(args, op._label)
    return [compat.shaped_array(s, d) for s, d in out_shapes]


def _lower(ctx, *args, op, out_shapes, batch, broadcast, call, platform):
    avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_in]
    # How XLA may split the call: the op's rule, and the vmapped axis of a
    # batched call (in a program of several devices); None: not at all.
    split = op._split(ctx, avals, batch, broadcast, call)
    if platform == "cuda":
        outs = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_out]
        key = op._gpu_key(avals, outs, batch, broadcast, call, split)
        target = targets.KERNEL_TARGET
    else:
        key = op._simulator_key(avals, out_shapes, batch, broadcast, call,
                                split)
        target = targets.CALLABLE_TARGET
    if (getattr(ctx.module_context.lowering_parameters, "for_export", False)
            and keys.is_ambiguous(key)):
        raise registry.ambiguous_export_error(op._label, key, op.name)
    aliases = op.input_output_aliases or {}
    name = (call.name if call is not None else None) or op.profile_name
    if split is not None:
        return sharding_rules.lower_split(
            ctx, args, target=targets.BATCH_TARGETS[target], split=split,
            key=key, aliases=tuple(dict(aliases).items()),
            profile_name=name)
    # The custom call is named after the op, or its use, in HLO
    # (profile_names.py).
    with profile_names.location(ctx, name):
        return jax.ffi.ffi_lowering(
            target,
            operand_output_aliases=dict(aliases),
        )(ctx, *args, key=key)


mlir.register_lowering(numbax_kernel_p, partial(_lower, platform="cuda"),
                       platform="cuda")
mlir.register_lowering(numbax_kernel_p, partial(_lower, platform="cpu"),
                       platform="cpu")


def _jvp_rule(primals, tangents, *, op, **params):
    # Only called with a tangent that is not a symbolic zero: stop_gradient
    # around every input still lets the op run under jax.grad.
    del primals, tangents, params
    raise checks.not_differentiable(op._label, "the kernel")


def _transpose_rule(cotangents, *args, op, **params):
    # jax.linear_transpose treats the op as linear in an input: it is not.
    del cotangents, args, params
    raise checks.not_differentiable(op._label, "the kernel")


# Name the user's op (JAX's own refusals name numbax's shared primitive).
ad.primitive_jvps[numbax_kernel_p] = _jvp_rule
ad.primitive_transposes[numbax_kernel_p] = _transpose_rule
