"""The folded launch of a vmapped kernel: the generated batched kernel.

Where vmap of a ``numba_cuda_kernel`` runs in one launch (kernel/vmap.py
decides), a generated kernel takes the batched arrays, picks slice
``blockIdx.<axis>`` of each (slice 0 of a broadcast input) and calls the
user's kernel body, compiled as a device function, on those slices. Each
compiler makes it with its own ``cuda.jit`` (Compiler.batched_kernel).
The same generator makes the kernel a call with traced scalars launches
(unbatched: no slice, it only reads each traced scalar's value from its
1-element buffer and passes it to the body; batched, it does both).

The body must compute what the unbatched kernel computes, so it must read
the values Numba froze into the unbatched kernel's code: those are noted
here just before a compiler compiles it (note_compile).
"""

from __future__ import annotations

import dis
import types
import weakref
from typing import Any

import numpy as np

from .grid_reads import AXIS_NAMES, SAFE_MODULES, closure_values, plain_value

# -- the values the body was compiled with -----------------------------------
#
# Numba freezes the module globals a kernel reads (numbers, arrays, tuples of
# them) into its code when it compiles it. The batched kernel compiles the
# body again, later: from the module as it is then, it would see a global
# changed since (a single call giving the old value, the folded vmap the new
# one). So numbax notes the values right before it has Numba compile (or
# load) the unbatched kernel for a signature, and compiles the batched body
# against those. Where Numba compiled the kernel for that signature without
# numbax (a launch through Numba, an explicit signature compiled when it was
# decorated), the values it froze are unknown: a body that reads such
# globals then does not fold.

_UNKNOWN = object()
# Key tags of globals_read for what is not a module global.
_CELL = "<closure>"
_ATTR = "<attribute>"
# dispatcher -> {unbatched argtypes: {name: value} or _UNKNOWN}; per kernel,
# not per op: ops re-created around one kernel share its compiled code.
_frozen: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _global_names(code, out: set) -> set:
    for op in dis.get_instructions(code):
        if op.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(
                op.argval, str):
            out.add(op.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _global_names(const, out)
    return out


def _attribute_chains(code, out: set) -> set:
    """(name, attr, ...) of each `name.attr...` the code reads, name a
    global or a closure variable."""
    ins = list(dis.get_instructions(code))
    for i, op in enumerate(ins):
        if op.opname not in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") or \
                not isinstance(op.argval, str):
            continue
        chain = [op.argval]
        for nxt in ins[i + 1:]:
            if nxt.opname not in ("LOAD_ATTR", "LOAD_METHOD") or \
                    not isinstance(nxt.argval, str):
                break
            chain.append(nxt.argval)
        if len(chain) > 1:
            out.add(tuple(chain))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _attribute_chains(const, out)
    return out


def _frozen_value(value):
    """The value as Numba would freeze it, or _UNKNOWN where it is not one
    (functions, modules, kernels: code, looked up again at compile)."""
    if isinstance(value, np.ndarray):
        return value.copy()  # Numba copies a global array into the code
    if isinstance(value, tuple):
        items = [_frozen_value(v) for v in value]
        return _UNKNOWN if any(v is _UNKNOWN for v in items) else tuple(items)
    if isinstance(value, (str, bytes)) or not plain_value(value):
        return _UNKNOWN
    return value


def _user_module_attribute(root, chain):
    """`root.a.b` for chain (a, b) where root is a module of the user's
    (not one of SAFE_MODULES, whose values do not change), or _UNKNOWN."""
    if not isinstance(root, types.ModuleType) or \
            root.__name__.split(".")[0] in SAFE_MODULES:
        return _UNKNOWN
    value = root
    for attr in chain:
        if not isinstance(value, types.ModuleType):
            return _UNKNOWN
        try:
            value = getattr(value, attr)
        except AttributeError:
            return _UNKNOWN
    return value


def _same(a, b) -> bool:
    """Whether two frozen values are the same value (arrays bit for bit)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple)
                and len(a) == len(b) and all(map(_same, a, b)))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b) or (a != a and b != b)  # NaN is NaN
    except Exception:  # pragma: no cover - not a plain value
        return a is b


def globals_read(py_func) -> dict:
    """What `py_func`'s code reads that Numba freezes into compiled code,
    as it is now: {name: value} of module globals, {(_CELL, name): value}
    of closure variables and {(_ATTR, name, attr, ...): value} of
    attributes of the user's modules (cfg.SCALE)."""
    code = getattr(py_func, "__code__", None)
    scope = getattr(py_func, "__globals__", None)
    if code is None or scope is None:
        return {}
    values = {}
    for name in sorted(_global_names(code, set())):
        if name in scope:
            value = _frozen_value(scope[name])
            if value is not _UNKNOWN:
                values[name] = value
    cells = closure_values(py_func)
    for name, value in sorted(cells.items()):
        value = _frozen_value(value)
        if value is not _UNKNOWN:
            values[(_CELL, name)] = value
    for chain in sorted(_attribute_chains(code, set())):
        name = chain[0]
        root = cells[name] if name in cells else scope.get(name)
        value = _user_module_attribute(root, chain[1:])
        if value is not _UNKNOWN:
            value = _frozen_value(value)
        if value is not _UNKNOWN:
            values[(_ATTR,) + chain] = value
    return values


def _spell(key) -> str:
    """A globals_read key as the kernel's source spells it."""
    if isinstance(key, str):
        return key
    if key[0] == _CELL:
        return key[1]
    return ".".join(key[1:])


def note_compile(kernel, argtypes) -> None:
    """Numbax is about to have Numba compile (or load) `kernel` for
    `argtypes`: the globals it reads are frozen now."""
    per = _frozen.setdefault(kernel, {})
    if argtypes not in per:
        per[argtypes] = globals_read(getattr(kernel, "py_func", kernel))


def note_compiled_elsewhere(kernel, argtypes) -> None:
    """Numba had compiled `kernel` for `argtypes` before numbax asked."""
    _frozen.setdefault(kernel, {}).setdefault(argtypes, _UNKNOWN)


def frozen_globals(kernel, argtypes):
    """The values the compiled unbatched kernel holds, or None when unknown."""
    values = _frozen.get(kernel, {}).get(argtypes, _UNKNOWN)
    return None if values is _UNKNOWN else values


def unknown_globals_reason(kernel, argtypes) -> str | None:
    """Why a folded launch could read other values than the unbatched
    kernel's, or None."""
    if frozen_globals(kernel, argtypes) is not None:
        return None
    read = globals_read(getattr(kernel, "py_func", kernel))
    if not read:
        return None
    names = ", ".join(sorted(_spell(k) for k in read))
    what = ("module globals" if all(isinstance(k, str) for k in read)
            else "module globals or closure values")
    return (f"the kernel reads {what} ({names}) "
            "and Numba compiled it for these types before numbax did (a "
            "launch through Numba, or an explicit signature), so numbax "
            "cannot know the values frozen into it, and a batched kernel "
            "compiled now could read others. Create the op before the "
            "kernel's first launch to let it fold")


def with_globals(py_func, values: dict):
    """`py_func` reading `values` (globals_read's) for the globals and
    closure variables they name (a copy of the function over a copy of its
    module's namespace and new cells); `py_func` itself when none.

    A module attribute Numba froze cannot be given back to the body: where
    it changed since, ValueError (the kernel then does not fold)."""
    if not values:
        return py_func
    scope = dict(py_func.__globals__)
    cells = closure_values(py_func)
    frozen_cells = {}
    for key, value in values.items():
        if isinstance(key, str):
            scope[key] = value
        elif key[0] == _CELL:
            frozen_cells[key[1]] = value
        else:
            name = key[1]
            root = cells[name] if name in cells else scope.get(name)
            now = _user_module_attribute(root, key[2:])
            if now is _UNKNOWN or not _same(_frozen_value(now), value):
                raise ValueError(
                    f"{_spell(key)} changed since Numba compiled the kernel "
                    "(which froze its value then), and numbax cannot give a "
                    "batched kernel compiled now the old value")
    closure = py_func.__closure__
    if frozen_cells:
        closure = tuple(
            types.CellType(frozen_cells[name]) if name in frozen_cells
            else cell for name, cell in zip(py_func.__code__.co_freevars,
                                            closure))
    clone = types.FunctionType(py_func.__code__, scope, py_func.__name__,
                               py_func.__defaults__, closure)
    clone.__kwdefaults__ = py_func.__kwdefaults__
    clone.__qualname__ = py_func.__qualname__
    clone.__module__ = py_func.__module__
    clone.__doc__ = py_func.__doc__
    return clone


# -- the batched kernel ------------------------------------------------------

def batched_source(num_args: int, broadcast: tuple, axis: int | None,
                   scalars: tuple = (), traced: tuple = ()) -> str:
    """Source of the generated kernel: slice `blockIdx.<axis>` of each array.

    Broadcast inputs (a leading axis of 1 shared by every slice) give slice 0;
    scalar parameters (their positions in `scalars`) are passed as they are;
    a traced scalar (positions in `traced`: a 1-element buffer per slice)
    gives the body its element. With `axis` None the kernel is unbatched:
    it only reads the traced scalars (the kernel a call with traced scalars
    launches, per slice where a vmap does not fold).
    """
    params = [f"a{i}" for i in range(num_args)]

    def pick(i):
        if i in scalars:
            return f"a{i}"
        if axis is None:
            sliced = f"a{i}"
        elif i < len(broadcast) and broadcast[i]:
            sliced = f"a{i}[0]"
        else:
            sliced = f"a{i}[s]"
        return f"{sliced}[0]" if i in traced else sliced
    picks = [pick(i) for i in range(num_args)]
    name = "with_traced_scalars" if axis is None else "batched"
    lines = [f"def {name}({', '.join(params)}):\n"]
    if axis is not None:
        lines.append(f"    s = cuda.blockIdx.{AXIS_NAMES[axis]}\n")
    lines.append(f"    body({', '.join(picks)})\n")
    return "".join(lines)


def batched_kernel(cuda: Any, py_func, options: dict, num_args: int,
                   broadcast: tuple, axis: int | None, scalars: tuple = (),
                   traced: tuple = ()):
    """The generated batched kernel (batched_source) around `py_func` as a
    device function, both made by `cuda`'s jit (numba-cuda's, or
    numba-cuda-mlir's: each compiler's Compiler.batched_kernel) with
    `options`."""
    body = cuda.jit(device=True, **options)(py_func)
    scope = {"cuda": cuda, "body": body}
    source = batched_source(num_args, broadcast, axis, scalars, traced)
    exec(compile(source,
                 f"<numbax batched {getattr(py_func, '__qualname__', '')}>",
                 "exec"), scope)
    name = source[4:source.index("(")]
    batched = scope[name]
    batched.__qualname__ = (
        getattr(py_func, "__qualname__", "kernel") + "." + name)
    return cuda.jit(**options)(batched)
