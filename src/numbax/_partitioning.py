"""Callables declared independent along their leading axis.

``numba_cuda_callable(..., batch_partitionable=True)`` promises that every
index of axis 0 of every input, output and scratch buffer is handled on its
own, as under ``jax.vmap``. Such a call is lowered to numbax's
``*_batch`` targets, which XLA knows as batch-partitionable, with the two
annotations its partitioners read: the frontend attribute
``num_batch_dims = "1"`` (GSPMD) and a Shardy sharding rule that shares one
factor along axis 0 of every operand and result and needs every other axis
replicated. Under ``jax.jit`` with inputs sharded along axis 0, each device
then runs ``func`` on its own rows instead of XLA gathering the whole array
around the call. ``func`` must read its sizes from the arrays it is given.

The same primitive, with ``partitionable=False``, carries every other call
of a callable to the plain targets, lowered to the custom call
``jax.ffi.ffi_call`` gives them, named after the op (``profile_name``,
_profile.py). Its batching rule gives ``vmap_method`` ffi_call's meaning,
except that it broadcasts an unbatched aliased operand, and refuses
``jax.vmap`` of callables made without ``vmap_method`` naming the op
(``op_label``) and ``vmap_method=`` (ffi_call's refusal names neither; a
``custom_vmap`` around each call did the same at a cost in trace and
lowering time).

The mechanism is XLA's (``jax.ffi.register_ffi_target_as_batch_partitionable``,
as ``jax.lax.linalg`` uses it), so it works in jax 0.10 and 0.11 under both
Shardy and GSPMD, and survives ``jax.export``: the annotations are part of
the serialised module.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching, mlir

from . import _batching, _checks, _compat, _profile, _targets

BATCH_FACTOR = "batch"

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
            "leave batch_partitionable=False")


def bind(target: str, inputs, result_specs, *, key: str, aliases,
         vmap_method, partitionable: bool = True,
         has_side_effect: bool = False, label: str | None = None,
         profile_name: str | None = None):
    """Binds the call; partitionable=False only borrows this primitive's
    batching rule (which broadcasts unbatched aliased operands, and refuses
    vmap_method=None naming the op, `label`). `profile_name` names the
    custom call in HLO (_profile.py)."""
    out_shapes = tuple((tuple(int(d) for d in s.shape), np.dtype(s.dtype))
                       for s in result_specs)
    # The primitive's parameter is op_key, not key: jax 0.8-0.9 cache
    # abstract evaluation in a function whose own argument is named key.
    return numbax_callable_batch_p.bind(
        *inputs, target=target, op_key=key, out_shapes=out_shapes,
        aliases=tuple(sorted((aliases or {}).items())),
        vmap_method=vmap_method, partitionable=partitionable,
        has_side_effect=bool(has_side_effect), op_label=label,
        profile_name=profile_name)


@numbax_callable_batch_p.def_effectful_abstract_eval
def _abstract_eval(*avals, target, op_key, out_shapes, aliases, vmap_method,
                   partitionable, has_side_effect=False, op_label=None,
                   profile_name=None):
    # The same effect ffi_call gives has_side_effect=True: XLA then neither
    # merges two identical calls nor drops one whose result is unused.
    effect = _compat.ffi_effect() if has_side_effect else None
    return ([_compat.shaped_array(s, d) for s, d in out_shapes],
            {effect} if effect is not None else set())


def _sharding_rule_attr(op):
    """The Shardy rule: axis 0 shared by all, every other axis replicated."""
    str_to_sdy_sharding_rule, sdy_sharding_rule_to_mlir = \
        _compat.sdy_sharding_rule_api()
    operand_types = [v.type for v in op.operands]
    result_types = [v.type for v in op.results]
    others = []

    def mapping(prefix, i, t):
        rank = mlir.ir.RankedTensorType(t).rank
        names = [f"{prefix}{i}_{d}" for d in range(1, rank)]
        others.extend(names)
        return " ".join([BATCH_FACTOR] + names)

    lhs = ", ".join(mapping("in", i, t) for i, t in enumerate(operand_types))
    rhs = ", ".join(mapping("out", i, t) for i, t in enumerate(result_types))
    try:
        rule = str_to_sdy_sharding_rule(f"{lhs} -> {rhs}",
                                        need_replication_factors=tuple(others))
    except TypeError as exc:  # pragma: no cover - an older Shardy rule API
        raise NotImplementedError(
            "batch_partitionable=True needs a jax whose Shardy sharding rules "
            "support need_replication_factors; set "
            "jax_use_shardy_partitioner=False, or leave batch_partitionable "
            "False") from exc
    return sdy_sharding_rule_to_mlir(rule, operand_types, result_types)


def _lower(ctx, *args, target, op_key, out_shapes, aliases, vmap_method,
           partitionable, has_side_effect=False, op_label=None,
           profile_name=None):
    name = _targets.BATCH_TARGETS[target] if partitionable else target
    lowering = jax.ffi.ffi_lowering(
        name, operand_output_aliases=dict(aliases),
        has_side_effect=has_side_effect)
    if profile_name:
        with _profile.location(ctx, profile_name):
            results = lowering(ctx, *args, key=op_key)
    else:
        results = lowering(ctx, *args, key=op_key)
    if partitionable:
        op = results[0].owner
        op = getattr(op, "operation", op)
        op.attributes["mhlo.frontend_attributes"] = mlir.ir.DictAttr.get(
            {"num_batch_dims": mlir.ir.StringAttr.get("1")})
        if _compat.shardy_on():
            op.attributes["sdy.sharding_rule"] = _sharding_rule_attr(op)
    return results


mlir.register_lowering(numbax_callable_batch_p, _lower)


def _batch_rule(args, dims, *, target, op_key, out_shapes, aliases, vmap_method,
                partitionable, has_side_effect=False, op_label=None,
                profile_name=None):
    """jax.vmap, with the meaning ffi_call gives ``vmap_method``."""
    if vmap_method is None:
        raise _checks.not_batchable(op_label or f"numbax op '{op_key}'")
    size = _batching.batch_size(args, dims)
    moved = [a if d is None else jnp.moveaxis(a, d, 0)
             for a, d in zip(args, dims)]
    params = dict(target=target, op_key=op_key, aliases=aliases,
                  vmap_method=vmap_method, has_side_effect=has_side_effect,
                  op_label=op_label, profile_name=profile_name)
    if vmap_method in ("sequential", "sequential_unrolled"):
        outs = _batching.loop_over_batch(
            partial(numbax_callable_batch_p.bind, out_shapes=out_shapes,
                    partitionable=partitionable, **params),
            args, dims, unroll=vmap_method == "sequential_unrolled")
        return outs, [0] * len(outs)
    if vmap_method in ("expand_dims", "broadcast_all", "legacy_vectorized"):
        aliased = {i for i, _ in aliases}
        new_args = []
        for i, (a, d) in enumerate(zip(moved, dims)):
            if d is None and i in aliased:
                # Written in place: a whole batch of its own.
                a = jnp.broadcast_to(a[None], (size,) + a.shape)
            elif d is None and vmap_method != "legacy_vectorized":
                # 'legacy_vectorized' (as ffi_call) leaves it unbatched.
                n = size if vmap_method == "broadcast_all" else 1
                a = jnp.broadcast_to(a[None], (n,) + a.shape)
            new_args.append(a)
        batched = tuple(((size,) + tuple(s), d) for s, d in out_shapes)
        # The vmapped axis is now axis 0, independent by vmap's own meaning;
        # partition along it only where every buffer carries all of it.
        whole = all(a.shape[0] == size for a in new_args)
        outs = numbax_callable_batch_p.bind(
            *new_args, out_shapes=batched,
            partitionable=partitionable and whole, **params)
        return list(outs), [0] * len(outs)
    raise NotImplementedError(
        f"vmap of a numba_cuda_callable needs vmap_method 'sequential', "
        f"'sequential_unrolled', 'expand_dims', 'broadcast_all' or "
        f"'legacy_vectorized'; got {vmap_method!r}")


batching.primitive_batchers[numbax_callable_batch_p] = _batch_rule
