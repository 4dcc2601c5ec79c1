"""The outputs an XLACustomKernel call declares, and checks against them.

A call's ``outs`` is a pytree of ``jax.ShapeDtypeStruct``; the primitive
carries it flat, as ``((shape, dtype), ...)`` plus the tree. What a kernel,
a JVP, transpose or batching rule returns is flattened like it and checked
leaf by leaf, so that a wrong result is an error naming the op and the rule
instead of a shape error deep inside JAX. The op (``op``) is named in
messages by its repr.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def check_outputs(op: object, result, outs, out_tree,
                  what: str) -> list:
    """`result`'s leaves, TypeError naming `what` unless they match outs."""
    leaves = flatten_like(result, out_tree, len(outs), op=op, what=what)
    if leaves is None:
        raise TypeError(
            f"{op!r}: {what} returned {value_str(result)}, but outs "
            f"declares {len(outs)} output(s): {outs_str(outs)}")
    checked = []
    for i, (leaf, (shape, dtype)) in enumerate(zip(leaves, outs)):
        if isinstance(leaf, (tuple, list, dict)):
            # Where outs is one array, flattening keeps a container whole.
            raise TypeError(
                f"{op!r}: output {i} of {what} is {value_str(leaf)}, not an "
                f"array: outs declares {len(outs)} output(s): {outs_str(outs)}")
        got = (tuple(np.shape(leaf)), np.dtype(jnp.result_type(leaf)))
        if got != (shape, dtype):
            raise TypeError(
                f"{op!r}: output {i} of {what} is "
                f"{got[1].name}{list(got[0])}, but outs declares "
                f"{dtype.name}{list(shape)}")
        checked.append(leaf)
    return checked


def outs_struct(outs, out_tree):
    """The call's outs as the user gave them: ShapeDtypeStructs in a tree."""
    return jax.tree_util.tree_unflatten(
        out_tree, [jax.ShapeDtypeStruct(s, d) for s, d in outs])


def _dicts(node) -> list[dict]:
    """The dicts with two or more keys in `node`, a tree of placeholders."""
    found: list[dict] = []
    if isinstance(node, dict):
        if len(node) > 1:
            found.append(node)
        children = list(node.values())
    elif isinstance(node, (tuple, list)):
        children = list(node)
    else:
        return found
    for child in children:
        found.extend(_dicts(child))
    return found


def refuse_flat_for_dict(value, out_tree, n: int, op: object,
                         described: str) -> None:
    """TypeError if outs (`out_tree`, `n` leaves) has a dict of two or more
    keys, for which the flat tuple/list `value` (`described`) would be
    matched to the keys by position: in sorted key order, which is neither
    necessarily the order the dict was written in nor safe to assume."""
    tree = jax.tree_util.tree_unflatten(out_tree, [0] * n)
    dicts = _dicts(tree)
    if not dicts:
        return
    where = "is" if dicts[0] is tree else "holds"
    keys = ", ".join(repr(k) for k in dicts[0])
    example = ", ".join(f"{k!r}: ..." for k in dicts[0])
    raise TypeError(
        f"{op!r}: {described}, but outs {where} a dict (keys {keys}): a "
        f"flat {type(value).__name__} cannot say which value is which key "
        f"(JAX orders a dict's keys sorted, not as written), so numbax does "
        f"not match it by position; return a dict with the same keys, "
        f"{{{example}}}, in the structure of outs")


def flatten_like(value, out_tree, n: int, *, op: object,
                 what: str) -> list | None:
    """`value`'s leaves in the order of `out_tree`, or None if it doesn't fit.

    Accepts the structure of ``outs`` itself, or a flat tuple/list of the
    outputs in order (what a multi-output numbax op built from a flat list
    of specs returns) where outs has no dict of two or more keys. A dict's
    leaves are in sorted key order (JAX's), not the order the dict was
    written in, and a rule sees outs in sorted order: a flat tuple for dict
    outs could match either way, so it is refused (TypeError naming `op`,
    `what` and the keys) instead of being matched by position.
    """
    if n == 1 and out_tree.num_nodes == 1:
        if isinstance(value, (tuple, list)) and len(value) == 1:
            return [value[0]]
        return [value]
    try:
        leaves = out_tree.flatten_up_to(value)
    except (TypeError, ValueError):
        if not isinstance(value, (tuple, list)):
            return None
        refuse_flat_for_dict(value, out_tree, n, op,
                             f"{what} returned {value_str(value)}")
        leaves = list(value)
    if leaves is None or len(leaves) != n:
        return None
    return list(leaves)


def outs_str(outs) -> str:
    return ", ".join(f"{np.dtype(d).name}{list(s)}" for s, d in outs)


def value_str(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"an array {np.dtype(value.dtype).name}{list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return (f"a {type(value).__name__} of {len(value)}: ["
                + ", ".join(value_str(v) for v in value) + "]")
    return f"{type(value).__name__}"
