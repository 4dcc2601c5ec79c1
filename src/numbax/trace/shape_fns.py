"""Shapes from the inputs: ``outs=``, ``launch_dims=`` and ``scratch=`` as functions.

An op may take what it would fix at creation (its outputs, a kernel's
launch extents, a callable's scratch buffers) as a function of the call's
arguments instead: arrays are given as ``jax.ShapeDtypeStruct``, scalars
passed by value (scalar_args.py) as their values, and it returns what the
fixed form takes. It is evaluated when a call is traced, once per
signature (the inputs' shapes and dtypes and the scalars), so one op object
serves every shape, under ``jit``, ``vmap``, export and capture. The op's
key then says ``fn`` in its configuration part, and the resolved shapes
(and launch) in its call part: a process that rebuilds the call from a key
alone (a deserialised program) needs nothing but the op.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import jax
import numpy as np

from . import checks, scalar_args

#: Resolved calls each op remembers (most recently used last).
MAX_SIGNATURES = 256


def is_function(value: Any) -> bool:
    """True for a shape function (callable, and not itself a shape spec)."""
    return callable(value) and not checks.is_shape_dtype(value)


def signature(inputs, scalars) -> tuple:
    """What a shape function's result may depend on: the arrays' shapes and
    dtypes, and the scalars (with their types)."""
    return (tuple((tuple(int(d) for d in x.shape), np.dtype(x.dtype))
                  for x in inputs), tuple(scalars))


def arguments(inputs, scalars) -> list:
    """The call's arguments as a shape function sees them."""
    structs = [jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype))
               for x in inputs]
    return scalar_args.merge(structs, scalars)


def _describe(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, jax.ShapeDtypeStruct):
            parts.append(f"{np.dtype(a.dtype).name}{list(a.shape)}")
        else:
            parts.append(repr(a))
    return "(" + ", ".join(parts) + ")"


def evaluate(fn: Callable, what: str, args, op: str):
    """fn(*args), its exceptions re-raised naming the op, the parameter
    (`what`: 'outs', 'launch_dims', 'scratch') and the arguments."""
    try:
        return fn(*args)
    except Exception as exc:
        message = (f"{op}: the {what} function raised {type(exc).__name__}: "
                   f"{exc} (called with {_describe(args)})")
        renamed = checks.renamed(exc, message)
        if renamed is None:
            raise
        raise renamed from exc


def where(what: str, args) -> str:
    """How errors name the result of a shape function for `args`."""
    return f"{what} (returned by the {what} function for {_describe(args)})"


def specs_from(fn, what: str, args, op: str):
    """(specs, tree) of what `fn(*args)` returns, checked as the fixed form
    of `what` ('outs', 'scratch') is, its errors naming the op."""
    result = evaluate(fn, what, args, op)
    return checks.normalize_outs(result, where(what, args), op=op)


def outs_for(fn, specs, tree, args, op: str):
    """(specs, tree) of a call's outputs: what the outs function `fn`
    returns for `args`, or the fixed `specs` and `tree` where `fn` is
    None."""
    if fn is None:
        return specs, tree
    return specs_from(fn, "outs", args, op)


class Memo:
    """A bounded map of signature -> resolved call (least recently used
    dropped first; a dropped one is resolved again when needed)."""

    def __init__(self, limit: int = MAX_SIGNATURES):
        self._limit = limit
        self._items: OrderedDict = OrderedDict()

    def get(self, key):
        value = self._items.get(key)
        if value is not None:
            try:
                self._items.move_to_end(key)
            except KeyError:  # another thread dropped it meanwhile
                pass
        return value

    def put(self, key, value):
        self._items[key] = value
        while len(self._items) > max(1, self._limit):
            try:
                self._items.popitem(last=False)
            except KeyError:
                break
        return value

    def resolved(self, inputs, scalars, resolve: Callable[[list], Any]):
        """What a call with `inputs` and `scalars` resolves to:
        `resolve(its arguments)`, once per signature."""
        sig = signature(inputs, scalars)
        known = self.get(sig)
        if known is not None:
            return known
        return self.put(sig, resolve(arguments(inputs, scalars)))

    def __len__(self):
        return len(self._items)
