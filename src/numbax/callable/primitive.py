"""callable_call_p: the JAX primitive every numba_cuda_callable call binds.

``numba_cuda_callable`` binds it for every call, eager or traced, with a
rule or without (none goes through ``jax.ffi.ffi_call``). Without a rule it
lowers to the custom call ``jax.ffi.ffi_call`` would give the plain targets,
named after the op (``profile_name``, profile_names.py). A call with a sharding rule
(the op's ``sharding_rule=``, ``batch_partitionable=True``, or the vmapped
axis that ``jax.vmap`` adds: trace/sharding_rules.py) is lowered by
``sharding_rules.lower_split`` to numbax's ``*_batch`` targets: under
``jax.jit`` with inputs sharded along the split factors, each device then
runs the op on its own shards instead of XLA gathering the whole arrays
around the call. The op must read its sizes from the arrays it is given.
Its batching rule is in vmap.py.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.interpreters import mlir

from ..runtime import compat, registry, targets
from ..trace import checks, profile_names, sharding_rules

# Named "numbax_callable_batch" in jaxprs and HLO metadata since it first
# carried only the batched calls; the name stays, as programs show it.
callable_call_p = compat.eager_primitive("numbax_callable_batch")


class OpLabel(str):
    """An op's label (its messages name it so), carrying the op itself.

    The primitive's parameters name the call by key, not by op, and the
    registry refers to ops weakly: an op created while tracing (inside a
    jitted function, or inside the function an XLACustomKernel's generator
    returned) is gone before its call is lowered unless a parameter holds
    it. The label does, and the lowering hands the op to the compiled
    program to keep (compat.keep_alive). Compared and hashed as its text:
    calls of one key are one call to JAX's caches, whichever op made them
    (one key means one function and configuration)."""

    op: Any = None

    @classmethod
    def of(cls, text: str, op: Any) -> "OpLabel":
        label = cls(text)
        label.op = op
        return label


def bind(target: str, inputs, result_specs, *, key: str, aliases,
         vmap_method, rule=None, vmap_only: bool = False, n_scratch: int = 0,
         has_side_effect: bool = False, label: str | None = None,
         profile_name: str | None = None):
    """Binds the call. `rule` (a sharding_rules.Rule, or None) says how XLA
    may split it; `vmap_only` marks a rule that only jax.vmap gave (split
    only in programs of several devices). Without a rule the call only
    borrows this primitive's batching rule (which broadcasts unbatched
    aliased operands, and refuses vmap_method=None naming the op, `label`).
    `profile_name` names the custom call in HLO (profile_names.py)."""
    out_shapes = tuple((tuple(int(d) for d in s.shape), np.dtype(s.dtype))
                       for s in result_specs)
    # The primitive's parameter is op_key, not key: jax 0.8-0.9 cache
    # abstract evaluation in a function whose own argument is named key.
    return callable_call_p.bind(
        *inputs, target=target, op_key=key, out_shapes=out_shapes,
        aliases=tuple(sorted((aliases or {}).items())),
        vmap_method=vmap_method, rule=rule, vmap_only=bool(vmap_only),
        n_scratch=int(n_scratch), has_side_effect=bool(has_side_effect),
        op_label=label, profile_name=profile_name)


@callable_call_p.def_effectful_abstract_eval
def _abstract_eval(*avals, target, op_key, out_shapes, aliases, vmap_method,
                   rule, vmap_only, n_scratch, has_side_effect=False,
                   op_label=None, profile_name=None, slices=None):
    # The same effect ffi_call gives has_side_effect=True: XLA then neither
    # merges two identical calls nor drops one whose result is unused.
    effect = compat.ffi_effect() if has_side_effect else None
    # jax.export's symbolic extents reach here through jax.vmap's batch
    # axis too (a direct call is refused in checks.as_input_arrays).
    checks.check_concrete_avals(avals, op_label or f"numbax op '{op_key}'")
    return ([compat.shaped_array(s, d) for s, d in out_shapes],
            {effect} if effect is not None else set())


def _lower(ctx, *args, target, op_key, out_shapes, aliases, vmap_method,
           rule, vmap_only, n_scratch, has_side_effect=False, op_label=None,
           profile_name=None, slices=None):
    # `slices`: a sequential vmap's call (vmap.py), whose key names them.
    compat.keep_alive(ctx, getattr(op_label, "op", None))
    split = sharding_rules.split_for(
        ctx, rule, vmap_only, op_label or f"numbax op '{op_key}'",
        n_free_results=n_scratch, aliases=aliases)
    if split is None:
        lowering = jax.ffi.ffi_lowering(
            target, operand_output_aliases=dict(aliases),
            has_side_effect=has_side_effect)
        with profile_names.named(ctx, profile_name):
            return lowering(ctx, *args, key=op_key)
    key = registry.with_lead(op_key, split.lead_spec())
    return sharding_rules.lower_split(
        ctx, args, target=targets.BATCH_TARGETS[target], split=split,
        key=key, aliases=aliases, has_side_effect=has_side_effect,
        profile_name=profile_name)


mlir.register_lowering(callable_call_p, _lower)
