"""Writes to a read-only input that Numba compiles anyway.

numba_kernel hands the kernel its inputs as read-only Numba arrays, so that
a kernel writing one fails to compile (op.py says so, naming the fix). Numba
0.68 enforces that for indexing, slicing, views and in-place operators, but
lets two writes through:

- ``x.flat[i] = v``: the ``.flat`` iterator of a read-only array is typed
  as writable;
- ``for v in np.nditer(x): v[...] = w``: the 0-d views ``np.nditer``
  yields are typed as writable whatever the array.

Either would change XLA's buffer, and the caller's JAX array, silently.
:func:`hidden_write` finds them in the kernel's typed IR after Numba
compiled it (at trace time, once per compiled overload): a setitem on the
``.flat`` of a read-only array (its type says so, wherever it was passed),
and a setitem or in-place operator on a view ``np.nditer`` yielded from a
read-only array (followed through copies, tuple unpacking and calls of
other ``@njit`` functions). A view passed on through anything else (a
method, a ufunc's ``out=``) is not followed; the docs name this limit.
"""

from __future__ import annotations

import os
from typing import Any


def hidden_write(cres: Any) -> str | None:
    """Where the compiled overload `cres` (and the ``@njit`` functions it
    calls) writes a read-only input in a way Numba let through, or None.
    None too when Numba kept no typed IR (an overload loaded from its
    cache keeps only a string)."""
    return _scan(cres, frozenset(), set())


def _where(what: str, stmt: Any) -> str:
    loc = getattr(stmt, "loc", None)
    if loc is None or not getattr(loc, "filename", None):
        return what
    return f"{what} ({os.path.basename(loc.filename)}:{loc.line})"


def _taints(annotation: Any, tainted_args: frozenset) -> dict:
    """Per variable: True (a view of a read-only input from np.nditer), a
    tuple of such flags (a tuple of views), or ("iter", flags) (an
    iternext pair over an nditer). Iterated to a fixed point: loops put a
    variable's copies before its definition."""
    from numba.core import ir, types

    typemap = annotation.typemap
    taint: dict = {}

    def of(var):
        return taint.get(var.name) if isinstance(var, ir.Var) else None

    changed = True
    while changed:
        changed = False
        for block in annotation.blocks.values():
            for stmt in block.body:
                if not isinstance(stmt, ir.Assign):
                    continue
                value = stmt.value
                got: Any = None
                if isinstance(value, ir.Arg):
                    got = True if value.index in tainted_args else None
                elif isinstance(value, ir.Var):
                    got = of(value)
                elif isinstance(value, ir.Expr):
                    if value.op == "iternext":
                        it = typemap.get(value.value.name)
                        if isinstance(it, types.NumpyNdIterType):
                            got = ("iter", tuple(
                                not getattr(a, "mutable", True)
                                for a in it.arrays))
                    elif value.op == "pair_first":
                        pair = of(value.value)
                        if isinstance(pair, tuple) and pair[:1] == ("iter",):
                            flags = pair[1]
                            first = typemap.get(stmt.target.name)
                            got = flags if isinstance(first, types.containers.BaseTuple) \
                                else any(flags)
                    elif value.op == "exhaust_iter":
                        got = of(value.value)
                    elif value.op == "static_getitem":
                        whole = of(value.value)
                        if (isinstance(whole, tuple) and whole[:1] != ("iter",)
                                and isinstance(value.index, int)
                                and 0 <= value.index < len(whole)):
                            got = whole[value.index]
                if got and taint.get(stmt.target.name) != got:
                    taint[stmt.target.name] = got
                    changed = True
    return taint


def _scan(cres: Any, tainted_args: frozenset, seen: set) -> str | None:
    from numba.core import ir, types

    key = (id(cres), tainted_args)
    annotation: Any = getattr(cres, "type_annotation", None)
    # An overload loaded from Numba's cache has a string here, or nothing.
    if key in seen or not hasattr(annotation, "typemap"):
        return None
    seen.add(key)
    typemap, calltypes = annotation.typemap, annotation.calltypes
    taint = _taints(annotation, tainted_args)
    for block in annotation.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
                target = typemap.get(stmt.target.name)
                if (isinstance(target, types.NumpyFlatType)
                        and not target.array_type.mutable):
                    return _where("a write through `.flat` of a read-only "
                                  "input", stmt)
                if taint.get(stmt.target.name) is True:
                    return _where("a write to a view np.nditer made of a "
                                  "read-only input", stmt)
            if not (isinstance(stmt, ir.Assign)
                    and isinstance(stmt.value, ir.Expr)):
                continue
            expr = stmt.value
            if expr.op == "inplace_binop" and taint.get(expr.lhs.name) is True:
                return _where("an in-place operator on a view np.nditer "
                              "made of a read-only input", stmt)
            if expr.op != "call":
                continue
            callee = typemap.get(expr.func.name)
            sig = calltypes.get(expr)
            if not isinstance(callee, types.Dispatcher) or sig is None:
                continue
            inner = callee.dispatcher.overloads.get(tuple(sig.args))
            passed = frozenset(i for i, a in enumerate(expr.args)
                               if taint.get(a.name) is True)
            found = _scan(inner, passed, seen) if inner is not None else None
            if found is not None:
                return found
    return None
