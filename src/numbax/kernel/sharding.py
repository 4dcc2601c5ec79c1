"""Which calls of a numba_cuda_kernel XLA may split across devices, and how.

An op with a rule (``batch_partitionable=True`` or ``sharding_rule=``) has
fixed outs and launch_dims (refused otherwise when created); `outs` below
is a call's unbatched output shapes (launch_config.Call.out_shapes).
Scalars are not buffers: rules, units and grid ties count the array inputs
and the outputs only. The rules themselves, and the lowering of a split
call, are trace/sharding_rules.py's.
"""

from __future__ import annotations

from ..trace import sharding_rules


def rule_with_shape_fns_error(op: str, batch_partitionable: bool):
    what = ("batch_partitionable=True" if batch_partitionable
            else "sharding_rule=")
    return ValueError(
        f"{op}: {what} cannot be combined with outs= or launch_dims= given "
        "as a function of the call's arguments: the rule ties the launch to "
        "fixed outputs and launch dimensions. Give outs and launch_dims as "
        "values (one op per shape), or use numba_cuda_callable, whose rules "
        "take shape functions (docs/errors.md)")


def unbatched_rule(op, in_shapes, outs):
    """The op's own rule for unbatched inputs of `in_shapes`, or None."""
    if op.batch_partitionable:
        return sharding_rules.leading_rule(in_shapes, outs)
    return op.sharding_rule


def check_rule(op, in_shapes, outs) -> None:
    """Refuses, naming the op, a rule that does not fit a call of
    `in_shapes` or a launch that could not follow the split."""
    rule = unbatched_rule(op, in_shapes, outs)
    if rule is None:
        return
    if op.batch_partitionable:
        extents = {int(s[0]) for s in list(in_shapes) + list(outs)}
        if len(extents) > 1:
            raise ValueError(
                f"{op.label}: batch_partitionable=True declares that "
                "axis 0 of every input and output is one independent "
                "batch axis, so their leading extents must be equal; got "
                f"inputs {[tuple(s) for s in in_shapes]}, outputs "
                f"{list(outs)}. Give a sharding_rule that says which "
                "arrays share the axis (e.g. 'i j, j -> i j'), or use "
                "jax.shard_map")
    split = sharding_rules.split(rule, in_shapes, outs, op.label,
                                 aliases=op.alias_pairs())
    if op.launch_dims is not None:
        sharding_rules.launch_ties(op.launch_dims, split, op.label)


def grid_from(op, avals, batch, outs) -> tuple:
    """Per grid axis, the axis of output 0 (as the call's buffers have it)
    whose local extent that axis covers, or -1: the op's rule ties the
    leading launch axes to the split factors."""
    if not op.has_rule() or op.launch_dims is None:
        return (-1, -1, -1)
    shapes = [tuple(s)[1:] if batch else tuple(s) for s, _ in avals]
    rule = unbatched_rule(op, shapes, outs)
    split = sharding_rules.split(rule, shapes, outs, op.label,
                                 aliases=op.alias_pairs())
    ties = sharding_rules.launch_ties(op.launch_dims, split, op.label)
    shift = 1 if batch else 0
    ties = tuple(t + shift if t >= 0 else -1 for t in ties)
    return ties + (-1,) * (3 - len(ties))


def split_of(op, ctx, avals, batch, broadcast, call):
    """The Split of a lowered call, or None where XLA gets no rule."""
    in_shapes = [tuple(s) for s, _ in avals]
    outs = call.out_shapes
    if batch:
        unbatched = [s[1:] for s in in_shapes]
        base = unbatched_rule(op, unbatched, outs)
        vmap_only = base is None
        if base is None:
            base = sharding_rules.unshared_rule(unbatched, outs)
        rule = sharding_rules.vmapped(base, [not b for b in broadcast])
    else:
        rule, vmap_only = unbatched_rule(op, in_shapes, outs), False
    return sharding_rules.split_for(ctx, rule, vmap_only, op.label,
                                    aliases=op.alias_pairs())
