"""The callable primitive, and the lowering of every call XLA may split.

``numba_cuda_callable`` binds ``numbax_callable_batch_p`` for its traced
calls (eager calls of ops without a rule keep ``jax.ffi.ffi_call``). A call
with a sharding rule (``_sharding_rule.py``: the op's ``sharding_rule=``,
``batch_partitionable=True``, or the vmapped axis that ``jax.vmap`` adds)
is lowered by :func:`lower_split` to numbax's ``*_batch`` targets, which XLA
knows as batch-partitionable, with the annotations its partitioners read:
the frontend attribute ``num_batch_dims`` (GSPMD) and the Shardy rule
``sdy.sharding_rule``. Under ``jax.jit`` with inputs sharded along the
split factors, each device then runs the op on its own shards instead of
XLA gathering the whole arrays around the call. The op must read its sizes
from the arrays it is given. numba_cuda_kernel's primitive lowers its split
calls through :func:`lower_split` as well.

The same primitive, without a rule, carries every other call of a
callable to the plain targets, lowered to the custom call
``jax.ffi.ffi_call`` gives them, named after the op (``profile_name``,
_profile.py). Its batching rule gives ``vmap_method`` ffi_call's meaning,
except that it broadcasts an unbatched aliased operand, and refuses
``jax.vmap`` of callables made without ``vmap_method`` naming the op
(``op_label``) and ``vmap_method=`` (ffi_call's refusal names neither; a
``custom_vmap`` around each call did the same at a cost in trace and
lowering time).

The mechanism is XLA's (``jax.ffi.register_ffi_target_as_batch_partitionable``,
as ``jax.lax.linalg`` uses it), so it works in jax 0.8 to 0.12 under both
Shardy and GSPMD, and survives ``jax.export``: the annotations are part of
the serialised module.
"""

from __future__ import annotations

import contextlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching, mlir

from . import (_batching, _checks, _compat, _profile, _registry,
               _sharding_rule, _targets)

numbax_callable_batch_p = _compat.eager_primitive("numbax_callable_batch")


def check_leading_axis(inputs, out_specs, op: str) -> None:
    """Every input, output and scratch buffer needs the same axis-0 extent."""
    extents = [(f"input {i}", int(x.shape[0])) for i, x in enumerate(inputs)]
    extents += [(f"output/scratch {i}", int(s.shape[0]))
                for i, s in enumerate(out_specs)]
    if len({n for _, n in extents}) > 1:
        listed = ", ".join(f"{what}: {n}" for what, n in extents)
        raise ValueError(
            f"{op}: batch_partitionable=True declares that axis 0 of every "
            "input, output and scratch buffer is one independent batch axis, "
            f"so their leading extents must be equal; got {listed}. Pass the "
            "other arrays without a batch axis through jax.shard_map, or "
            "give a sharding_rule that says which arrays share the axis "
            "(e.g. 'i j, j -> i j'), or leave batch_partitionable=False")


def bind(target: str, inputs, result_specs, *, key: str, aliases,
         vmap_method, rule=None, vmap_only: bool = False, n_scratch: int = 0,
         has_side_effect: bool = False, label: str | None = None,
         profile_name: str | None = None):
    """Binds the call. `rule` (a _sharding_rule.Rule, or None) says how XLA
    may split it; `vmap_only` marks a rule that only jax.vmap gave (split
    only in programs of several devices). Without a rule the call only
    borrows this primitive's batching rule (which broadcasts unbatched
    aliased operands, and refuses vmap_method=None naming the op, `label`).
    `profile_name` names the custom call in HLO (_profile.py)."""
    out_shapes = tuple((tuple(int(d) for d in s.shape), np.dtype(s.dtype))
                       for s in result_specs)
    # The primitive's parameter is op_key, not key: jax 0.8-0.9 cache
    # abstract evaluation in a function whose own argument is named key.
    return numbax_callable_batch_p.bind(
        *inputs, target=target, op_key=key, out_shapes=out_shapes,
        aliases=tuple(sorted((aliases or {}).items())),
        vmap_method=vmap_method, rule=rule, vmap_only=bool(vmap_only),
        n_scratch=int(n_scratch), has_side_effect=bool(has_side_effect),
        op_label=label, profile_name=profile_name)


@numbax_callable_batch_p.def_effectful_abstract_eval
def _abstract_eval(*avals, target, op_key, out_shapes, aliases, vmap_method,
                   rule, vmap_only, n_scratch, has_side_effect=False,
                   op_label=None, profile_name=None):
    # The same effect ffi_call gives has_side_effect=True: XLA then neither
    # merges two identical calls nor drops one whose result is unused.
    effect = _compat.ffi_effect() if has_side_effect else None
    return ([_compat.shaped_array(s, d) for s, d in out_shapes],
            {effect} if effect is not None else set())


def _sharding_rule_attr(op, split):
    """The Shardy rule attribute of the custom call `op`."""
    str_to_sdy_sharding_rule, sdy_sharding_rule_to_mlir = \
        _compat.sdy_sharding_rule_api()
    operand_types = [v.type for v in op.operands]
    result_types = [v.type for v in op.results]
    try:
        rule = str_to_sdy_sharding_rule(
            split.sdy_rule, need_replication_factors=split.replicated)
    except TypeError as exc:  # pragma: no cover - an older Shardy rule API
        raise NotImplementedError(
            "numbax's partitioned calls need a jax whose Shardy sharding "
            "rules support need_replication_factors; set "
            "jax_use_shardy_partitioner=False, or drop the sharding rule "
            "(batch_partitionable, sharding_rule)") from exc
    return sdy_sharding_rule_to_mlir(rule, operand_types, result_types)


def _named(ctx, profile_name):
    """The custom call lowered under it named `profile_name` in HLO
    (_profile.py); nothing when the call has no profile name."""
    if not profile_name:
        return contextlib.nullcontext()
    return _profile.location(ctx, profile_name)


def split_for(ctx, rule, vmap_only: bool, op: str, *, n_free_results=0,
              aliases=()):
    """The Split of a lowered call, or None when it is not split (no rule,
    or only vmap's in a program of one device)."""
    if rule is None:
        return None
    if vmap_only and _compat.lowering_device_count(ctx) <= 1:
        return None
    in_shapes = [tuple(a.shape) for a in ctx.avals_in]
    out_shapes = [tuple(a.shape) for a in ctx.avals_out]
    return _sharding_rule.split(rule, in_shapes, out_shapes, op,
                                n_free_results=n_free_results,
                                aliases=aliases, internal=vmap_only)


def lower_split(ctx, args, *, target: str, split, key: str, aliases,
                has_side_effect: bool = False,
                profile_name: str | None = None):
    """The custom call of a split call: split arrays get the unit axes of
    `split` (bitcasts; C++ drops them again), and the call the annotations
    of XLA's batch partitioner. `profile_name` names it in HLO."""
    def grown(aval, lead, trail):
        if not lead and not trail:
            return aval
        return aval.update(shape=(1,) * lead + tuple(aval.shape) +
                           (1,) * trail)
    n_in = len(ctx.avals_in)
    units = list(zip(split.lead, split.trail))
    avals_in = [grown(a, *u) for a, u in zip(ctx.avals_in, units[:n_in])]
    avals_out = [grown(a, *u) for a, u in zip(ctx.avals_out, units[n_in:])]
    args = [_compat.reshape_value(ctx, x, a) if any(u) else x
            for x, a, u in zip(args, avals_in, units[:n_in])]
    inner = ctx.replace(avals_in=avals_in, avals_out=avals_out)
    lowering = jax.ffi.ffi_lowering(
        target, operand_output_aliases=dict(aliases),
        has_side_effect=has_side_effect)
    with _named(ctx, profile_name):
        results = lowering(inner, *args, key=key)
    call = results[0].owner
    call = getattr(call, "operation", call)
    call.attributes["mhlo.frontend_attributes"] = mlir.ir.DictAttr.get(
        {"num_batch_dims": mlir.ir.StringAttr.get(str(split.num_batch_dims))})
    if _compat.shardy_on():
        call.attributes["sdy.sharding_rule"] = _sharding_rule_attr(call, split)
    return [_compat.reshape_value(ctx, r, a) if any(u) else r
            for r, a, u in zip(results, ctx.avals_out, units[n_in:])]


def _lower(ctx, *args, target, op_key, out_shapes, aliases, vmap_method,
           rule, vmap_only, n_scratch, has_side_effect=False, op_label=None,
           profile_name=None):
    split = split_for(ctx, rule, vmap_only, op_label or f"numbax op '{op_key}'",
                      n_free_results=n_scratch, aliases=aliases)
    if split is None:
        lowering = jax.ffi.ffi_lowering(
            target, operand_output_aliases=dict(aliases),
            has_side_effect=has_side_effect)
        with _named(ctx, profile_name):
            return lowering(ctx, *args, key=op_key)
    key = _registry.with_lead(op_key, split.lead_spec())
    return lower_split(ctx, args, target=_targets.BATCH_TARGETS[target],
                       split=split, key=key, aliases=aliases,
                       has_side_effect=has_side_effect,
                       profile_name=profile_name)


mlir.register_lowering(numbax_callable_batch_p, _lower)


def _batch_rule(args, dims, *, target, op_key, out_shapes, aliases, vmap_method,
                rule, vmap_only, n_scratch, has_side_effect=False,
                op_label=None, profile_name=None):
    """jax.vmap, with the meaning ffi_call gives ``vmap_method``."""
    if vmap_method is None:
        raise _checks.not_batchable(op_label or f"numbax op '{op_key}'")
    size = _batching.batch_size(args, dims)
    moved = [a if d is None else jnp.moveaxis(a, d, 0)
             for a, d in zip(args, dims)]
    params = dict(target=target, op_key=op_key, aliases=aliases,
                  vmap_method=vmap_method, n_scratch=n_scratch,
                  has_side_effect=has_side_effect, op_label=op_label,
                  profile_name=profile_name)
    if vmap_method in ("sequential", "sequential_unrolled"):
        outs = _batching.loop_over_batch(
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
        base = rule if rule is not None else _sharding_rule.unshared_rule(
            [tuple(np.shape(a))[1:] if f is not None else tuple(np.shape(a))
             for a, f in zip(new_args, batched)],
            [s for s, _ in out_shapes])
        outs = numbax_callable_batch_p.bind(
            *new_args, out_shapes=new_shapes,
            rule=_sharding_rule.vmapped(base, batched),
            vmap_only=vmap_only or rule is None, **params)
        return list(outs), [0] * len(outs)
    raise NotImplementedError(
        f"vmap of a numba_cuda_callable needs vmap_method 'sequential', "
        f"'sequential_unrolled', 'expand_dims', 'broadcast_all' or "
        f"'legacy_vectorized'; got {vmap_method!r}")


batching.primitive_batchers[numbax_callable_batch_p] = _batch_rule
