"""The outputs an XLACustomKernel call declares, and checks against them.

A call's ``outs`` is a pytree of ``jax.ShapeDtypeStruct``; the primitive
carries it flat, as ``((shape, dtype), ...)`` plus the tree. What a kernel,
a JVP, transpose or batching rule returns is flattened like it and checked
leaf by leaf, so that a wrong result is an error naming the op and the rule
instead of a shape error deep inside JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from .custom_kernel import XLACustomKernel


def check_outputs(op: XLACustomKernel, result, outs, out_tree,
                  what: str) -> list:
    """`result`'s leaves, TypeError naming `what` unless they match outs."""
    leaves = flatten_like(result, out_tree, len(outs))
    if leaves is None:
        raise TypeError(
            f"{op!r}: {what} returned {value_str(result)}, but outs "
            f"declares {len(outs)} output(s): {outs_str(outs)}")
    checked = []
    for i, (leaf, (shape, dtype)) in enumerate(zip(leaves, outs)):
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


def flatten_like(value, out_tree, n: int) -> list | None:
    """`value`'s leaves in the order of `out_tree`, or None if it doesn't fit.

    Accepts the structure of ``outs`` itself, or a flat tuple/list of the
    outputs in order (what a multi-output numbax op built from a flat list
    of specs returns).
    """
    if n == 1 and out_tree.num_nodes == 1:
        if isinstance(value, (tuple, list)) and len(value) == 1:
            return [value[0]]
        return [value]
    try:
        leaves = out_tree.flatten_up_to(value)
    except (TypeError, ValueError):
        leaves = list(value) if isinstance(value, (tuple, list)) else None
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
