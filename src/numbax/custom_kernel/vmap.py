"""What an XLACustomKernel does under ``jax.vmap``.

In order: the user's batching rule (``def_batching_rule``), its result
checked against the call's ``outs`` and the batch; where there is none (or
it returns NotImplemented) and the op's kernel is a ``numba_cuda_kernel``,
that kernel vmapped, which runs the batch in one launch where that is
provably the same as one launch per slice; otherwise a loop over the batch,
one call per slice, which is always correct. The op holds its batching
rule in one :class:`BatchingRule` (``op.batching``).
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching

from ..runtime import ops
from ..trace import checks
from ..trace.vmap import batch_size, loop_over_batch
from .differentiation import check_rule_call
from .kernels import NUMBA_CUDA, KernelTable
from .outs import (check_outputs, flatten_like, outs_struct,
                   refuse_flat_for_dict, value_str)
from .primitive import kernel_for
from .sharding import ShardingRule

# jax.default_backend() -> the platform users name in def_kernel.
_PLATFORMS = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu"}


class BatchingRule:
    """One XLACustomKernel's batching rule (def_batching_rule), or None.
    `label` names the op in messages (its repr)."""

    def __init__(self, label: str):
        self._label = label
        self.rule: Callable | None = None

    def define(self, fn: Callable) -> None:
        if not callable(fn):
            raise TypeError(
                f"{self._label}: the batching rule must be callable")
        self.rule = fn


class Batched(Protocol):
    """What this module needs of an XLACustomKernel."""
    name: str
    primitive: Any
    kernels: KernelTable
    sharding: ShardingRule
    batching: BatchingRule


def register(op: Batched) -> None:
    """Gives `op`'s primitive its batching rule (:func:`batch`)."""
    batching.primitive_batchers[op.primitive] = partial(batch, op)


def batch(op: Batched, args, axes, *, outs, out_tree, backends,
          static):
    """The primitive's batching rule: the user's, the kernel's, or a loop."""
    # A symbolic batch size (jax.export) is refused naming this op, not the
    # kernel its generator made.
    checks.check_concrete_avals(args, repr(op))
    params = dict(outs=outs, out_tree=out_tree, backends=backends,
                  static=static)
    rule = op.batching.rule
    if rule is not None:
        check_rule_call(
            op, rule, "the batching rule",
            (list(args), list(axes)),
            dict(outs=outs_struct(outs, out_tree), **dict(static)))
        with op.kernels.inheriting(backends):
            result = rule(
                list(args), list(axes), outs=outs_struct(outs, out_tree),
                **dict(static))
        if result is not NotImplemented:
            return _check_batched(op, result, out_tree, outs,
                                  batch_size(args, axes))
    folded = _kernel_batch(op, args, axes, outs, out_tree, backends, static)
    if folded is not None:
        return folded
    return _loop_batch(op, args, axes, params)


def _kernel_batch(op: Batched, args, axes, outs, out_tree, backends,
                  static):
    """The default rule when the backend is a numbax kernel: vmap it.

    ``numba_cuda_kernel``'s own batching then runs the batch in one
    launch where that is the same as one per slice (docs/quickstart.md,
    "vmap of a kernel"). Only where the result needs no rule of this op: under
    ``jit`` or eagerly, or inside further ``vmap``s when the op has no
    batching rule of its own (nested levels flatten into one batch); not
    inside ``jvp``/``grad`` or a ``vmap`` the op's own rule must see, whose
    tracers need this op's JVP, transpose or batching rules (the loop keeps
    them). A ``vmap_method='sequential'`` kernel launches its slices one at
    a time. None where it does not apply.
    """
    # Tracers of an outer vmap are fine where this op has no rule of its
    # own to run at that level: the kernel's batching then flattens every
    # level into one batch (kernel/vmap.py), as the op's default would.
    outer_vmap_ok = op.batching.rule is None
    if not all(_plain_value(a, outer_vmap_ok) for a in args):
        return None
    # A 0-d slice: the loop's lowering refuses it, naming this op (a
    # kernel vmapped here would name only itself).
    if any(np.ndim(a) - (ax is not None) == 0 for a, ax in zip(args, axes)):
        return None
    # Not where JAX's platform has no kernel (a numba_cuda-only op on the
    # CPU without the simulator): vmapping the GPU's kernel there failed
    # inside Numba (CudaSupportError); the loop's lowering raises what the
    # unbatched call raises, naming the platforms that have a kernel.
    here = _PLATFORMS.get(jax.default_backend())
    if here is None or dict(backends).get(here) is None:
        return None
    fns = set()
    for platform, backend in backends:
        if backend is None:
            continue
        try:
            fns.add(kernel_for(op, platform, backend, outs, out_tree,
                               static))
        except Exception:  # lowering reports it, with its context
            return None
    if len(fns) != 1:
        return None
    fn = fns.pop()
    if not (isinstance(fn, ops.Op) and fn.vmap_launches_batch):
        return None
    with ops.named_use(fn, op.name) if fn.name is None else \
            contextlib.nullcontext():
        result = jax.vmap(fn, in_axes=tuple(axes))(*args)
    leaves = check_outputs(
        op, result, tuple(((batch_size(args, axes),) + tuple(s), d)
                          for s, d in outs), out_tree,
        f"the batched '{NUMBA_CUDA}' kernel")
    return leaves, [0] * len(leaves)


def _check_batched(op: Batched, result, out_tree, outs, size):
    """The user rule's (outputs, out_axes), checked against outs and the
    batch size; TypeError naming the rule and the output otherwise."""
    n_outs = len(outs)
    try:
        outputs, out_axes = result
    except (TypeError, ValueError):
        raise TypeError(
            f"{op!r}: the batching rule must return (outputs, out_axes) "
            f"or NotImplemented; got {value_str(result)}") from None
    leaves = flatten_like(outputs, out_tree, n_outs, op=op,
                          what="the batching rule")
    if leaves is None:
        raise TypeError(
            f"{op!r}: the batching rule returned outputs "
            f"{value_str(outputs)}, which do not match outs")
    if out_axes is None or _is_int(out_axes):
        axes = [out_axes] * n_outs
    else:
        flat: list | None
        try:
            flat = out_tree.flatten_up_to(out_axes)
        except (TypeError, ValueError):
            flat = None
            if isinstance(out_axes, (tuple, list)):
                refuse_flat_for_dict(
                    out_axes, out_tree, n_outs, op,
                    f"the batching rule's out_axes {out_axes!r} are a flat "
                    f"{type(out_axes).__name__}")
                flat = list(out_axes)
        if flat is None or len(flat) != n_outs:
            raise TypeError(
                f"{op!r}: the batching rule's out_axes {out_axes!r} "
                "must be an int, None, or have the structure of outs")
        axes = flat
    # Each output must be one unbatched output with the batch axis (of
    # the vmapped size) at its out_axis, as JVP and transpose results
    # are checked against outs. JAX takes only None or a non-negative
    # Python int: -1 (the last axis, as in jax.vmap) and numpy integers are
    # handed on normalised.
    for j, (leaf, ax, (shape, dtype)) in enumerate(
            zip(leaves, axes, outs)):
        got = tuple(np.shape(leaf))
        if ax is None:
            want = tuple(shape)
        else:
            rank = len(shape) + 1  # the batched output's axes
            if not _is_int(ax):
                raise TypeError(
                    f"{op!r}: the batching rule gave output {j} out_axis "
                    f"{ax!r} ({type(ax).__name__}); each out_axis must be "
                    f"an int from {-rank} to {rank - 1} (the batched "
                    "output's axis that holds the batch) or None")
            ax = int(ax)
            if not -rank <= ax < rank:
                raise TypeError(
                    f"{op!r}: the batching rule gave output {j} "
                    f"out_axis {ax}, outside the output's {rank} axes: "
                    f"return an out_axis from {-rank} to {rank - 1} (-1 is "
                    "the last axis)")
            ax = ax % rank
            axes[j] = ax
            want = tuple(shape[:ax]) + (int(size),) + tuple(shape[ax:])
        if got != want:
            raise TypeError(
                f"{op!r}: the batching rule returned output {j} of "
                f"shape {got}, but outs declares {list(shape)} and the "
                f"batch of {size} at axis {ax} makes that {want}")
        got_dtype = np.dtype(jnp.result_type(leaf))
        if got_dtype != np.dtype(dtype):
            raise TypeError(
                f"{op!r}: the batching rule returned output {j} of "
                f"dtype {got_dtype.name}, but outs declares "
                f"{np.dtype(dtype).name}")
    return list(leaves), list(axes)


def _is_int(x) -> bool:
    """An int or numpy integer, not a bool (True is no axis)."""
    return isinstance(x, (int, np.integer)) and not isinstance(
        x, (bool, np.bool_))


def _loop_batch(op: Batched, args, axes, params):
    """The default batching rule: one call per element of the batch.

    Correct for any kernel; unbatched inputs are passed to every call
    unchanged (no copy), batched ones sliced along their axis.
    """
    results = loop_over_batch(
        partial(op.primitive.bind, **params), args, axes)
    return results, [0] * len(results)


def _plain_value(x, outer_vmap_ok: bool = False) -> bool:
    """An array, or a tracer of jit: nothing that needs this op's rules.

    With `outer_vmap_ok`, also a tracer of an enclosing vmap whose value is
    plain in turn (vmaps all the way down to jit or arrays, no jvp).
    """
    if not isinstance(x, jax.core.Tracer):
        return True
    # BatchTracer is not public API: known by name, as jit's tracer below.
    if outer_vmap_ok and type(x).__name__ == "BatchTracer" and \
            hasattr(x, "val"):
        return _plain_value(x.val, outer_vmap_ok)
    return type(x).__name__ == "DynamicJaxprTracer"


