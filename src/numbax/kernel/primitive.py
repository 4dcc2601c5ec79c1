"""numbax_kernel_p: the JAX primitive every numba_cuda_kernel binds.

Its abstract eval (the op's declared outputs), the lowering every platform
shares (:func:`lower`: the split XLA may make, the export check, the custom
call) and its refusals of differentiation, naming the user's op. Each
platform registers the lowering in its own module, with its target and its
key bound first: gpu.py for CUDA (numbax's kernel target), simulator.py for
the CPU (a simulator launch); the batching rule is in vmap.py. The op itself
(op.py) is a static parameter: what the rules need of it (keys, labels,
aliases) they ask it for.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from ..runtime import compat, keys, registry, targets
from ..trace import checks, profile_names, sharding_rules
from . import sharding

numbax_kernel_p = compat.eager_primitive("numbax_kernel")


@numbax_kernel_p.def_abstract_eval
def _abstract_eval(*args, op, out_shapes, batch, broadcast, call):
    # jax.export's symbolic extents reach here through jax.vmap's batch
    # axis too (a direct call is refused in checks.as_input_arrays).
    checks.check_concrete_avals(args, op.label)
    return [compat.shaped_array(s, d) for s, d in out_shapes]


def lower(target: str, key_of: Callable[..., str], ctx, *args, op,
          out_shapes, batch, broadcast, call):
    """The lowering every platform shares; each platform registers it with
    its own part (gpu.py for CUDA, simulator.py for the CPU) bound first.

    Args:
      target: the platform's FFI target (runtime/targets.py); a call XLA
        may split goes to its ``*_batch`` twin.
      key_of: ``key_of(ctx, op, avals, out_shapes, batch, broadcast, call,
        split)``, the call's key on the platform (its registry entry made
        now, so that compile errors surface at trace time).
      ctx, args, op, out_shapes, batch, broadcast, call: what JAX hands a
        lowering rule of numbax_kernel_p.
    """
    avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_in]
    # How XLA may split the call: the op's rule, and the vmapped axis of a
    # batched call (in a program of several devices); None: not at all.
    split = sharding.split_of(op, ctx, avals, batch, broadcast, call)
    key = key_of(ctx, op, avals, out_shapes, batch, broadcast, call, split)
    compat.keep_alive(ctx, op)
    if (getattr(ctx.module_context.lowering_parameters, "for_export", False)
            and keys.is_ambiguous(key)):
        raise registry.ambiguous_export_error(op.label, key, op.name)
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


# Name the user's op (JAX's own refusals name numbax's shared primitive).
checks.refuse_differentiation(numbax_kernel_p, "the kernel")
