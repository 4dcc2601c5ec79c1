"""What a compiled kernel may not do, found in its typed IR at trace time.

numba_kernel hands the kernel its inputs as read-only Numba arrays, so that
a kernel writing one fails to compile (op.py says so, naming the fix).
Numba 0.68 enforces that for indexing, slicing, views and in-place
operators, but lets some writes through; each would change XLA's buffer,
and the caller's JAX array, silently:

- ``x.flat[i] = v``: the ``.flat`` of a read-only array is typed writable;
- the 0-d views ``np.nditer`` yields are typed writable whatever the array
  (``for v in np.nditer(x): v[...] = w``);
- ``np.ascontiguousarray(x)`` and ``np.asfortranarray(x)`` return the same
  buffer typed writable; ``np.fill_diagonal(x, v)`` and
  ``np.random.shuffle(x)`` write a read-only array; ``out=`` may name one.

:func:`audit` finds them: it follows every value that may be a view of a
read-only input (an nditer's view, what those functions return) through
copies, containers, iterators, method and function results, and calls of
other ``@njit`` functions (whose parameters it then follows), and reports a
write to one: a setitem, an in-place operator, or an ``out`` argument. It
over-approximates: a value once bound to such a view counts as one on
every path, so a kernel that writes an output through a variable that
elsewhere held an input's view is refused too (write the output directly).

It also refuses a ``with numba.objmode():`` block, in the kernel or a
function it calls: that takes the GIL on every call, and an exception
raised there escapes Numba's own ``try``/``except``, so the wrapper could
not report it (the kernel would go on with the exception pending).

An overload Numba loaded from its cache (``cache=True``) keeps no typed
IR: the audit then compiles an uncached twin of the function for the same
types, unless this numbax has already passed that overload (a marker file
beside Numba's cache, keyed like numbax's cached wrappers), so a warm start
compiles nothing.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, NamedTuple

#: Functions that return their read-only argument typed writable (the
#: result is a view of it) and functions that write their argument i.
VIEW_OF = ("ascontiguousarray", "asfortranarray")
WRITES_ARG = {"fill_diagonal": 0, "shuffle": 0, "copyto": 0, "dot": 2}


class Finding(NamedTuple):
    """What the audit refuses: `kind` "write" (a write to a read-only
    input that Numba lets through), "typed write" (one Numba's typing
    refuses for read-only arrays, in a kernel whose explicit signatures
    took writable ones) or "objmode" (an object-mode block), and where
    (`text`)."""
    kind: str
    text: str


def audit(dispatcher: Any, argtypes: tuple, cres: Any) -> Finding | None:
    """What the overload `cres` of `dispatcher` for `argtypes` (and the
    ``@njit`` functions it calls) does that numba_kernel refuses, or None.

    On a refusal the Numba caches of every function audited are flushed:
    Numba compiled (and cached) the kernel before numbax refused it, and
    its cache notices edits to the kernel's own file only, so after a fix
    in a function it calls, a later process would load the refused code
    while auditing the fixed source."""
    run = _Audit()
    found = run.function(dispatcher, tuple(argtypes), cres, frozenset())
    if found is not None:
        for visited in run.dispatchers:
            cache = getattr(visited, "_cache", None)
            if cache is not None and type(cache).__name__ != "NullCache":
                try:
                    cache.flush()
                except OSError:
                    pass  # an unwritable cache holds no code of this run
    return found


def _where(what: str, stmt: Any, kind: str = "write") -> Finding:
    loc = getattr(stmt, "loc", None)
    if loc is not None and getattr(loc, "filename", None):
        what = f"{what} ({os.path.basename(loc.filename)}:{loc.line})"
    return Finding(kind, what)


_twins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _typed(dispatcher: Any, argtypes: tuple, cres: Any) -> Any:
    """The typed IR of the overload, from an uncached twin when Numba loaded
    it from its cache; None when there is none to be had."""
    annotation = getattr(cres, "type_annotation", None)
    if hasattr(annotation, "typemap"):
        return annotation
    py_func = getattr(dispatcher, "py_func", None)
    if py_func is None:
        return None
    twin = _twin(dispatcher)
    twin.compile(argtypes)
    annotation = getattr(twin.overloads.get(argtypes), "type_annotation",
                         None)
    return annotation if hasattr(annotation, "typemap") else None


def _twin(dispatcher: Any) -> Any:
    """An uncached dispatcher of the same function and options, without
    explicit signatures: it compiles for whatever types the audit asks
    (one per dispatcher, kept as long as it lives)."""
    import numba
    twin = _twins.get(dispatcher)
    if twin is None:
        options = dict(getattr(dispatcher, "targetoptions", {}))
        options.pop("cache", None)
        twin = numba.jit(**options)(dispatcher.py_func)
        _twins[dispatcher] = twin
    return twin


def _writable(argtypes: tuple) -> tuple:
    """`argtypes` with every read-only array typed writable."""
    from numba.core import types
    return tuple(t.copy(readonly=False) if isinstance(t, types.Array)
                 and not t.mutable else t for t in argtypes)


#: What Numba says when a function with explicit signatures is called with
#: types none of them takes (from Python, and from compiled code): a
#: read-only array passed where a signature says ``float32[:]`` fails so
#: whether or not anything is written.
FIXED_SIGNATURE_MISMATCH = ("No matching definition for argument type(s)",
                            "Known signatures:")


def fixed_signature_mismatch(error: BaseException) -> bool:
    """Whether `error` is a call of explicit signatures none of which takes
    the call's types."""
    text = str(error)
    return any(m in text for m in FIXED_SIGNATURE_MISMATCH)


def writes_when_read_only(dispatcher: Any, argtypes: tuple,
                          error: BaseException) -> bool:
    """Whether a kernel that failed to compile for `argtypes` (with
    `error`) compiles once their read-only arrays are writable: then the
    read-only inputs were what failed it, that is, it writes one (a
    setitem, or a function that writes its argument: ``x.fill``,
    ``np.copyto``, a ufunc's ``out=``). Not when the failure is a call of a
    function whose explicit signatures take writable arrays, which says
    nothing of writes. Any other failure is the kernel's own typing
    error."""
    if fixed_signature_mismatch(error):
        return False
    writable = _writable(argtypes)
    if writable == tuple(argtypes) or getattr(dispatcher, "py_func",
                                              None) is None:
        return False
    try:
        _twin(dispatcher).compile(writable)
    except Exception:  # noqa: BLE001 - the kernel's own typing error
        return False
    return True


def audit_fixed_signature(dispatcher: Any, argtypes: tuple
                          ) -> Finding | None:
    """The audit of a kernel with explicit signatures, whose overloads take
    writable arrays (``float32[:]``), so that Numba's typing refuses none of
    its writes: its function compiled anew for the read-only `argtypes`
    numba_kernel passes (a twin), refused where that fails only because the
    arrays are read-only, else audited as any kernel. A twin that fails for
    another reason (the function needs its signature's types) leaves the
    kernel unchecked, as before."""
    if getattr(dispatcher, "py_func", None) is None:
        return None
    twin = _twin(dispatcher)
    try:
        twin.compile(tuple(argtypes))
    except Exception as exc:  # noqa: BLE001 - Numba's typing errors
        if writes_when_read_only(dispatcher, argtypes, exc):
            said = str(exc).strip().splitlines()
            return Finding("typed write", "a write to an input that Numba "
                           "refuses for read-only arrays (compiled without "
                           "its explicit signatures, Numba said: "
                           f"{type(exc).__name__}: "
                           f"{said[0] if said else ''})")
        return None
    return audit(twin, tuple(argtypes), twin.overloads.get(tuple(argtypes)))


def _array_like(t: Any) -> bool:
    """Whether a value of type `t` may hold an array (or a view of one)."""
    from numba.core import types as numba_types
    types: Any = numba_types  # re-exported names mypy cannot see
    if isinstance(t, (types.Array, types.NumpyFlatType)):
        return True
    if isinstance(t, types.containers.BaseTuple):
        return any(_array_like(e) for e in t)
    if isinstance(t, (types.List, types.ListType, types.Set)):
        return _array_like(t.dtype)
    if isinstance(t, (types.IteratorType, types.SimpleIterableType,
                      types.Generator)):
        return True
    if isinstance(t, types.Pair):
        return _array_like(t.first_type)
    return False


def _read_only(t: Any) -> bool:
    from numba.core import types
    return isinstance(t, types.Array) and not t.mutable


def _function_name(t: Any) -> str | None:
    """The name of the numpy function a `types.Function` stands for."""
    key = getattr(t, "typing_key", None)
    return getattr(key, "__name__", None) if callable(key) else None


class _Audit:
    def __init__(self) -> None:
        self.seen: set = set()
        self.dispatchers: list = []

    def function(self, dispatcher, argtypes, cres,
                 tainted_args) -> Finding | None:
        from numba.core import types
        from numba.core.dispatcher import ObjModeLiftedWith

        key = (id(dispatcher), argtypes, tainted_args)
        if key in self.seen:
            return None
        self.seen.add(key)
        if not any(d is dispatcher for d in self.dispatchers):
            self.dispatchers.append(dispatcher)
        if any(isinstance(f, ObjModeLiftedWith)
               for f in getattr(cres, "lifted", ()) or ()):
            return Finding("objmode", "a `with numba.objmode():` block")
        annotation = _typed(dispatcher, argtypes, cres)
        if annotation is None:
            return None
        typemap, calltypes = annotation.typemap, annotation.calltypes
        taint = self._taints(annotation, tainted_args)

        def hot(var) -> bool:
            got = taint.get(var.name)
            return got is True or _read_only(typemap.get(var.name))

        for stmt in self._statements(annotation):
            found = self._statement(stmt, typemap, calltypes, taint, hot,
                                    types)
            if found is not None:
                return found
        return None

    @staticmethod
    def _statements(annotation):
        for block in annotation.blocks.values():
            yield from block.body

    def _statement(self, stmt, typemap, calltypes, taint, hot, types):
        from numba.core import ir

        if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)):
            target = typemap.get(stmt.target.name)
            if (isinstance(target, types.NumpyFlatType)
                    and not target.array_type.mutable):
                return _where("a write through `.flat` of a read-only input",
                              stmt)
            if taint.get(stmt.target.name) is True:
                return _where("a write to a view of a read-only input",
                              stmt)
            return None
        if not (isinstance(stmt, ir.Assign)
                and isinstance(stmt.value, ir.Expr)):
            return None
        expr = stmt.value
        if expr.op == "inplace_binop" and taint.get(expr.lhs.name) is True:
            return _where("an in-place operator on a view of a read-only "
                          "input", stmt)
        if expr.op != "call":
            return None
        callee = typemap.get(expr.func.name)
        kws = dict(expr.kws or ())
        if "out" in kws and hot(kws["out"]):
            return _where("`out=` naming a read-only input or a view of one",
                          stmt)
        name = _function_name(callee)
        if name in WRITES_ARG:
            i = WRITES_ARG[name]
            if i < len(expr.args) and hot(expr.args[i]):
                return _where(f"np.{name} writing a read-only input", stmt)
        ufunc = getattr(callee, "typing_key", None)
        nin = getattr(ufunc, "nin", None)
        if isinstance(nin, int) and any(hot(a) for a in expr.args[nin:]):
            return _where("a ufunc's output naming a read-only input or a "
                          "view of one", stmt)
        if isinstance(callee, types.ObjModeDispatcher):
            return _where("a `with numba.objmode():` block", stmt, "objmode")
        if not isinstance(callee, types.Dispatcher):
            return None
        sig = calltypes.get(expr)
        if sig is None:
            return None
        args = tuple(sig.args)
        inner = callee.dispatcher.overloads.get(args)
        if inner is None:
            return None
        if _passes_taint(expr, taint):
            # By keyword or through *args the position is not plain: every
            # parameter may then hold the view.
            if expr.kws or expr.vararg is not None:
                flagged = frozenset(range(len(args)))
            else:
                flagged = frozenset(i for i, v in enumerate(expr.args)
                                    if _carries(taint.get(v.name)))
        else:
            flagged = frozenset()
        return self.function(callee.dispatcher, args, inner, flagged)

    @staticmethod
    def _taints(annotation, tainted_args) -> dict:
        """The variables that may hold a view of a read-only input (not the
        read-only arrays themselves, which their type says): True; a tuple
        of such taints, one per element (so that the views np.nditer makes
        of outputs stay writable); or Yields(item) for an iterator and what
        iterates (zip, enumerate). Iterated to a fixed point: loops put a
        variable's copies before its definition."""
        from numba.core import ir

        typemap = annotation.typemap
        taint: dict = {}
        aliases = _copy_classes(annotation)
        receivers = _receivers(annotation)
        for _ in range(64):  # a bound: each pass only adds or refines
            changed = False
            for block in annotation.blocks.values():
                for stmt in block.body:
                    if not isinstance(stmt, ir.Assign):
                        continue
                    target, value = stmt.target.name, stmt.value
                    if isinstance(value, ir.Expr) and value.op == "call" \
                            and _passes_taint(value, taint):
                        # list.append(view): the list, under every name it
                        # has (copies of one variable), whatever the call
                        # returns.
                        owner = receivers.get(value.func.name)
                        for name in aliases(owner) if owner else ():
                            if taint.get(name) is not True and \
                                    _array_like(typemap.get(name)):
                                taint[name] = True
                                changed = True
                    if taint.get(target) is True or not _array_like(
                            typemap.get(target)):
                        continue
                    got = None
                    if isinstance(value, ir.Arg):
                        got = True if value.index in tainted_args else None
                    elif isinstance(value, ir.Var):
                        got = taint.get(value.name)
                    elif isinstance(value, ir.Expr):
                        got = _expr_taint(value, typemap, taint)
                        owner = receivers.get(value.func.name) \
                            if value.op == "call" else None
                        if got is None and owner is not None and \
                                _carries(taint.get(owner)):
                            got = True  # a view's method: a view
                    got = got if _carries(got) else None
                    if got is not None and taint.get(target) != got:
                        taint[target] = got
                        changed = True
            if not changed:
                break
        return taint


class Yields:
    """The taint of an iterator, or of what iterates to it: its items'."""

    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Yields) and other.item == self.item

    def __hash__(self) -> int:
        return hash(("Yields", self.item))


def _carries(t: Any) -> bool:
    """Whether a taint holds a view of a read-only input anywhere."""
    if t is True:
        return True
    if isinstance(t, tuple):
        return any(_carries(e) for e in t)
    if isinstance(t, Yields):
        return _carries(t.item)
    return False


def _passed(expr) -> list:
    """Every variable a call passes: positional, keyword and *args."""
    passed = list(expr.args) + [v for _, v in (expr.kws or ())]
    if expr.vararg is not None:
        passed.append(expr.vararg)
    return passed


def _passes_taint(expr, taint: dict) -> bool:
    return any(_carries(taint.get(v.name)) for v in _passed(expr))


def _items(var, typemap, taint) -> Any:
    """The taint of what iterating `var` gives."""
    from numba.core import types

    t = typemap.get(var.name)
    if isinstance(t, types.NumpyNdIterType):
        flags = tuple(not getattr(a, "mutable", True) for a in t.arrays)
        if isinstance(t.yield_type, types.containers.BaseTuple):
            return flags
        return any(flags)
    got = taint.get(var.name)
    if isinstance(got, Yields):
        return got.item
    return True if _carries(got) else None


def _expr_taint(value, typemap, taint) -> Any:
    """The taint of `target = value` (an ir.Expr), or None."""
    op = value.op
    if op == "getiter":
        return Yields(_items(value.value, typemap, taint))
    if op == "iternext":
        return taint.get(value.value.name)
    if op == "pair_first":
        got = taint.get(value.value.name)
        return got.item if isinstance(got, Yields) else None
    if op == "exhaust_iter":
        return taint.get(value.value.name)
    if op == "static_getitem":
        got = taint.get(value.value.name)
        if isinstance(got, tuple) and isinstance(value.index, int):
            return got[value.index] if 0 <= value.index < len(got) else None
        return True if _carries(got) else None
    if op in ("getitem", "typed_getitem", "getattr"):
        return True if _carries(taint.get(value.value.name)) else None
    if op == "build_tuple":
        return tuple(taint.get(v.name) for v in value.items)
    if op in ("build_list", "build_set"):
        return True if any(_carries(taint.get(v.name))
                           for v in value.items) else None
    if op != "call":
        return None
    callee = typemap.get(value.func.name)
    key = getattr(callee, "typing_key", None)
    args = list(value.args)
    if key is zip:
        return Yields(tuple(_items(a, typemap, taint) for a in args))
    if key is enumerate and args:
        return Yields((None, _items(args[0], typemap, taint)))
    if key is iter and args:
        return Yields(_items(args[0], typemap, taint))
    if key is next and args:
        return _items(args[0], typemap, taint)
    if _passes_taint(value, taint):
        return True
    if _function_name(callee) in VIEW_OF and any(
            _read_only(typemap.get(v.name)) for v in args):
        return True
    return None


def _copy_classes(annotation):
    """name -> the names joined to it by plain copies (`a = b`), either
    way: one container under all its names (a list built in a loop reaches
    its append through phi copies)."""
    from numba.core import ir

    parent: dict = {}

    def find(n):
        while parent.get(n, n) != n:
            parent[n] = parent.get(parent[n], parent[n])
            n = parent[n]
        return n
    for block in annotation.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Var):
                a, b = find(stmt.target.name), find(stmt.value.name)
                if a != b:
                    parent[a] = b
    groups: dict = {}
    for n in list(parent):
        groups.setdefault(find(n), set()).add(n)
    for root, members in groups.items():
        members.add(root)

    def of(name):
        return groups.get(find(name), {name})
    return of


def _receivers(annotation) -> dict:
    """Per variable holding a bound method, the variable it was taken from
    (`obj` of `m = obj.meth`), read once per function."""
    from numba.core import ir
    found: dict[str, str] = {}
    for block in annotation.blocks.values():
        for stmt in block.body:
            if (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Expr)
                    and stmt.value.op == "getattr"):
                found.setdefault(stmt.target.name, stmt.value.value.name)
    return found


def _cache_marker(kernel: Any, argtypes: tuple) -> str | None:
    """Where numbax marks that it passed `kernel`'s overload for
    `argtypes` (beside Numba's cache of the kernel), or None for a kernel
    Numba does not cache."""
    from . import wrapper
    slot = wrapper.cache_slot(kernel, "audit-1",
                              tuple(str(t) for t in argtypes), closures=True)
    if slot is None:
        return None
    directory, digest = slot
    return os.path.join(directory, f"numbax_audited_{digest[:24]}")


def audit_cached(kernel: Any, argtypes: tuple,
                 cres: Any) -> Finding | None:
    """:func:`audit`, skipped for an overload Numba loaded from its cache
    that a numbax run already passed; marks a passed cached kernel."""
    annotation = getattr(cres, "type_annotation", None)
    marker = _cache_marker(kernel, tuple(argtypes))
    if marker is not None and not hasattr(annotation, "typemap") \
            and os.path.exists(marker):
        return None
    found = audit(kernel, argtypes, cres)
    if found is None and marker is not None:
        try:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w") as f:
                f.write("passed\n")
        except OSError:
            pass  # an unwritable cache: audited again next time
    return found
