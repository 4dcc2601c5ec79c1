"""vmap of a numba_cuda_kernel in one launch: the rule, and the batched kernel.

Under ``jax.vmap`` numbax can launch the unbatched kernel once per slice
(always correct), or once for the whole batch: a generated kernel takes the
batched arrays, picks slice ``blockIdx.<axis>`` of each (slice 0 of a
broadcast input) and calls the user's kernel body, compiled as a device
function, on those slices. The two are the same computation exactly when
nothing in the body can tell the slices' blocks apart from one launch's:

* the unbatched launch leaves a grid axis at extent 1 (``z``, else ``y``)
  for the batch to use;
* the body never reads that axis (``blockIdx``/``gridDim`` of it, through
  ``cuda.grid``/``cuda.gridsize`` or directly), so every slice sees the
  block indices of its own launch;
* the kernel does not synchronise its grid (a cooperative launch would then
  wait on every slice's blocks, and is limited to what fits at once);
* the op was not made with ``vmap_method='sequential'``, which asks for
  one slice at a time (its slices are launched one after another from one
  handler call, as every batch that does not fold is).

Nested vmaps flatten into one batch of every level's slices
(``_nested_vmap``), which holds nothing but unbatched calls, so the same
decision holds at any depth.

:func:`decide` applies that rule and returns a :class:`FoldDecision` with
the reason. On a GPU it reads the kernel's compiled PTX (which includes every
device function it calls); in Numba's simulator, where kernels are Python,
it reads their bytecode, and counts anything it cannot follow as a read of
every axis (no fold). Slices run in one launch share nothing but the
read-only inputs: outputs and aliased buffers are per slice.
"""

from __future__ import annotations

import dis
import re
import types
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

# Grid axes the batch may take, in order of preference; CUDA allows 65535
# blocks on each, so larger batches are split into several launches.
FOLD_AXES = (2, 1)
AXIS_NAMES = "xyz"
MAX_SLICES_PER_LAUNCH = 65535


@dataclass(frozen=True)
class FoldDecision:
    """How ``jax.vmap`` launches a kernel for one signature.

    The same decision holds for nested vmaps, whose levels flatten into
    one batch: :meth:`launches` and :meth:`explain` say what it means for
    given level sizes.

    Attributes:
      folds: True when the whole batch runs in one launch (or one per
        65535 slices); False when each slice is a launch of its own.
      axis: the grid axis (``'y'`` or ``'z'``) that indexes the slice when
        ``folds``, else None.
      reason: why, in words.
    """
    folds: bool
    axis: str | None
    reason: str

    def __str__(self):
        if self.folds:
            return f"one launch per batch (slice = blockIdx.{self.axis})"
        return f"one launch per slice: {self.reason}"

    def launches(self, *batch_shape: int) -> int:
        """Launches one call makes for nested vmaps of these sizes.

        ``batch_shape`` holds each vmap level's size, outermost first
        (``launches(16, 16)`` for ``vmap(vmap(op))`` over 16 x 16). Every
        level flattens into one batch of their product, decided as for one
        level (the decision depends on the unbatched kernel only): a
        folded batch takes one launch per 65535 slices, any other one
        launch per slice, all from one handler call.
        """
        total = 1
        for size in batch_shape:
            total *= int(size)
        if total <= 0:
            return 0
        if self.folds:
            return -(-total // MAX_SLICES_PER_LAUNCH)
        return total

    def explain(self, *batch_shape: int) -> str:
        """This decision in words for nested vmaps of these sizes."""
        total = 1
        for size in batch_shape:
            total *= int(size)
        shape = " x ".join(str(int(s)) for s in batch_shape) or "1"
        levels = len(batch_shape)
        how = (f"{levels} nested vmap levels flatten into" if levels > 1
               else "one vmap level gives")
        n = self.launches(*batch_shape)
        word = "launch" if n == 1 else "launches"
        if self.folds:
            return (f"{how} one batch of {shape} = {total} slices: {n} "
                    f"{word} (slice = blockIdx.{self.axis}), since "
                    f"{self.reason}")
        return (f"{how} one batch of {shape} = {total} slices: {n} {word}, "
                f"one per slice in order from one call, since {self.reason}")


def fallback(reason: str) -> FoldDecision:
    return FoldDecision(False, None, reason)


def decide(*, vmap_method, grid, cooperative: bool,
           axes_read: frozenset | None, unreadable: str | None = None
           ) -> FoldDecision:
    """Fold or fall back, and why: the whole rule, in order.

    Args:
      vmap_method: the op's ``vmap_method``.
      grid: the unbatched launch's grid, 3 ints.
      cooperative: the kernel synchronises its grid.
      axes_read: grid axes (0-2) whose ``blockIdx``/``gridDim`` the compiled
        code reads; None when they could not be determined.
      unreadable: why the code could not be read (with ``axes_read=None``).
    """
    if vmap_method == "sequential":
        return fallback("vmap_method='sequential' asks for one slice at a "
                        "time")
    if cooperative:
        return fallback("the kernel synchronises its grid (cooperative "
                        "launch): the batch's blocks would wait on each other")
    free = [a for a in FOLD_AXES if grid[a] == 1]
    if not free:
        return fallback(f"the launch uses all three grid axes {tuple(grid)}")
    if axes_read is None:
        return fallback(f"numbax cannot read the compiled code ({unreadable})")
    for axis in free:
        if axis not in axes_read:
            return FoldDecision(True, AXIS_NAMES[axis],
                                f"grid axis {AXIS_NAMES[axis]} is free and "
                                "the kernel never reads it")
    names = "/".join(AXIS_NAMES[a] for a in free)
    return fallback(f"the kernel reads grid axis {names} itself "
                    "(blockIdx, gridDim, cuda.grid or cuda.gridsize)")


# -- what the compiled code reads --------------------------------------------

# %ctaid.z / %nctaid.y / the vector form %ctaid, and clusters (never used by
# Numba, but they index blocks too).
_PTX_SREG = re.compile(r"%(n?ctaid|cluster_n?ctaid|n?clusterid)(\.[xyz])?\b")


def axes_read_by_ptx(ptx: str) -> frozenset:
    """Grid axes whose block index or count the PTX reads."""
    read = set()
    for m in _PTX_SREG.finditer(ptx):
        if m.group(1).startswith(("ctaid", "nctaid")) and m.group(2):
            read.add("xyz".index(m.group(2)[1]))
        else:
            read.update((0, 1, 2))
    return frozenset(read)


def axes_read_by_compiled(compiled) -> tuple[frozenset | None, str | None]:
    """(axes, None) for a compiled Numba CUDA kernel, or (None, why not)."""
    library = getattr(compiled, "_codelibrary", None)
    if library is None:
        return None, "no code library"
    linked = [p for p in getattr(library, "_linking_files", ())
              if "cooperative" not in str(p) and "cudadevrt" not in str(p)]
    unseen = [p for p in linked if not _linked_code_is_gridless(p)]
    if unseen:
        return None, f"it links external code {sorted(map(_link_name, unseen))}"
    try:
        ptx = library.get_asm_str()
    except Exception as exc:  # LTO-only builds, odd toolkits: be safe
        return None, f"no PTX ({type(exc).__name__}: {exc})"
    if isinstance(ptx, (list, tuple)):
        ptx = "\n".join(map(str, ptx))
    return axes_read_by_ptx(str(ptx)), None


# Linked code is compiled apart from the kernel's PTX, so the PTX scan does
# not see into it. numba-cuda's own libraries are the exception numbax reads
# through: the bf16/fp16/fp8 shims (generated wrappers of NVIDIA's
# arithmetic headers, which numba-cuda bundles) and its reshape helpers.
# Their source is text numbax can read, and is accepted when no token that
# names a block index, a grid extent, a cluster or a grid group appears in
# it (nor in the bundled headers the shims include). Those headers include
# only the toolkit's vector types and their constructors (vector_types.h,
# vector_functions.h, device_types.h), <nv/target>'s target macros and C/C++
# standard headers (assert, string, utility), which numbax takes as read:
# none of them touches a block index. Anything else linked (the user's link= files,
# PTX, cubins, LTO-IR) is counted as reading every axis.
_GRID_TOKENS = re.compile(
    r"\b(blockIdx|gridDim|clusterIdx|clusterDim|this_grid|grid_group|"
    r"cooperative_groups|__cluster_dims__|cluster_ctarank)\b|%n?ctaid|"
    r"%n?clusterid|%cluster_n?ctaid")
_OWN_SHIMS = ("cuda_bf16", "cuda_fp16", "cuda_fp8")
_bundled_headers_clean: bool | None = None


def _reads_grid(text) -> bool:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return bool(_GRID_TOKENS.search(str(text)))


def _numba_cuda_dir() -> str | None:
    import importlib.util
    import os
    spec = importlib.util.find_spec("numba.cuda")
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.abspath(spec.origin))


def _headers_clean() -> bool:
    """numba-cuda's bundled bf16/fp16/fp8 headers name no grid token."""
    global _bundled_headers_clean
    if _bundled_headers_clean is None:
        import glob
        import os
        base = _numba_cuda_dir()
        paths = glob.glob(os.path.join(base, "include", "*", "*")) \
            if base else []
        clean = bool(paths)
        for path in paths:
            with open(path, "rb") as f:
                clean = clean and not _reads_grid(f.read())
        _bundled_headers_clean = clean
    return _bundled_headers_clean


def _link_name(item) -> str:
    """A path as is; an in-memory object as its kind and name."""
    if isinstance(item, str):
        return item
    return f"{type(item).__name__}({getattr(item, 'name', '?')})"


def _linked_code_is_gridless(item) -> bool:
    """True for numba-cuda's own linked code when its text reads no grid."""
    import os
    import sys
    if isinstance(item, str):  # a path: numba-cuda's reshape helpers only
        base = _numba_cuda_dir()
        if base is None or os.path.abspath(item) != os.path.join(
                base, "reshape_funcs.cu"):
            return False
        with open(item, "rb") as f:
            return not _reads_grid(f.read())
    for shim in _OWN_SHIMS:
        module = sys.modules.get(f"numba.cuda._internal.{shim}")
        if module is not None and getattr(module, "shim_obj", None) is item:
            # The shim's source grows with each intrinsic a kernel uses, so
            # it is read now, after the kernel compiled.
            source = getattr(item, "data", None)
            return source is not None and not _reads_grid(source) \
                and _headers_clean()
    return False


# The simulator runs Python: read the bytecode of the kernel and of every
# function it calls. Reading blockIdx.x / gridDim.x / cuda.grid(1) /
# cuda.gridsize(1) touches axis 0 only; anything else touches every axis.
_AXIS_ATTRS = ("blockIdx", "gridDim")
_GRID_CALLS = ("grid", "gridsize")
_SAFE_MODULES = ("numba", "math", "cmath", "numpy", "operator")
_CONST_OPS = ("LOAD_CONST", "LOAD_SMALL_INT")  # the latter: Python 3.14
# Functions of safe modules that reach an attribute by a string
# (operator.attrgetter("blockIdx")(cuda)): counted as unreadable.
_BY_NAME_ATTRS = frozenset(("attrgetter", "methodcaller", "getattr",
                            "getattr_static"))
# Builtins a kernel may use that reach no object by name: any other global
# name that is not in the function's globals (getattr, eval, vars, ...) makes
# the body unreadable.
_PLAIN_BUILTINS = frozenset((
    "range", "len", "min", "max", "abs", "int", "float", "bool", "complex",
    "round", "pow", "divmod", "enumerate", "zip", "print", "tuple", "slice",
    "isinstance", "sum", "any", "all", "reversed", "iter", "next", "map",
    "filter", "ord", "chr", "hash", "True", "False", "None",
    "AssertionError", "ValueError", "IndexError", "RuntimeError",
    "ZeroDivisionError", "TypeError", "Exception", "NotImplementedError"))


def axes_read_by_python(func) -> tuple[frozenset | None, str | None]:
    read: set = set()
    seen: set = set()
    try:
        why = _scan_function(func, read, seen)
    except Exception as exc:  # anything odd: no fold
        return None, f"{type(exc).__name__}: {exc}"
    if why:
        return None, why
    return frozenset(read), None


def _scan_function(func, read: set, seen: set) -> str | None:
    func = getattr(func, "py_func", func)  # a simulated kernel
    if id(func) in seen:
        return None
    seen.add(id(func))
    code = getattr(func, "__code__", None)
    if code is None:
        return f"{func!r} has no Python code"
    scope = dict(getattr(func, "__globals__", {}))
    cells = getattr(func, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, cells):
        try:
            scope[name] = cell.cell_contents
        except ValueError:
            pass
    # Default values (positional and keyword-only) are values the body can
    # call, as a global would be: def k(x, o, f=dev_z) reaches dev_z.
    defaults = list(getattr(func, "__defaults__", None) or ())
    defaults += list((getattr(func, "__kwdefaults__", None) or {}).values())
    for value in defaults:
        why = _scan_value(value, read, seen)
        if why:
            return why
    return _scan_code(code, scope, read, seen)


def _scan_code(code, scope, read: set, seen: set) -> str | None:
    ins = list(dis.get_instructions(code))
    for i, op in enumerate(ins):
        name = op.argval
        nxt = ins[i + 1] if i + 1 < len(ins) else None
        if op.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL",
                         "LOAD_DEREF", "LOAD_NAME"):
            if name in _AXIS_ATTRS:
                if (nxt is not None and nxt.opname == "LOAD_ATTR"
                        and nxt.argval in ("x", "y", "z")):
                    read.add("xyz".index(nxt.argval))
                else:
                    read.update((0, 1, 2))
            elif name in _GRID_CALLS:
                if (nxt is not None and nxt.opname in _CONST_OPS
                        and nxt.argval in (1, 2, 3)):
                    read.update(range(nxt.argval))
                else:
                    read.update((0, 1, 2))
            elif name == "this_grid":
                read.update((0, 1, 2))
        if op.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(
                name, str) and (name.startswith("__")
                                or name in _BY_NAME_ATTRS):
            # cuda.__dict__["blockIdx"], operator.attrgetter("blockIdx"):
            # lookups by a name numbax does not see.
            return f"it reads the attribute {name}, which numbax does not follow"
        if op.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME") \
                and name in scope:
            why = _scan_value(scope[name], read, seen)
            if why:
                return why
        elif op.opname in ("LOAD_GLOBAL", "LOAD_NAME") and \
                name not in _PLAIN_BUILTINS:
            # A builtin that reaches objects by name or by value
            # (getattr(cuda, "blockIdx"), eval, vars), or a name numbax
            # cannot see: whatever it reads may be a block index.
            return (f"it uses {name!r}, through which numbax cannot see what "
                    "the kernel reads")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            why = _scan_code(const, scope, read, seen)
            if why:
                return why
    return None


def _scan_value(value, read: set, seen: set) -> str | None:
    if isinstance(value, types.ModuleType):
        if value.__name__.split(".")[0] in _SAFE_MODULES:
            return None
        return (f"it uses module {value.__name__}, whose functions numbax "
                "does not follow")
    if isinstance(value, types.FunctionType) or hasattr(value, "py_func"):
        return _scan_function(value, read, seen)
    if _plain(value):
        return None  # values and types index no blocks
    # A tuple, list, dict, class or other object may hold a device function
    # (HELPERS[0](), H.z()): numbax does not look inside, so it counts as a
    # read of every axis.
    return (f"it uses a {type(value).__name__}, whose contents numbax does "
            "not follow")


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, complex, str,
                                           bytes, np.generic, np.ndarray,
                                           np.dtype)):
        return True
    if isinstance(value, type) and issubclass(value, np.generic):
        return True  # np.float32(...)
    try:  # Numba's types (float32(...), types.int64): values, no code
        from numba.core import types as numba_types
        return isinstance(value, numba_types.Type)
    except ImportError:  # pragma: no cover
        return False


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
    if isinstance(value, (str, bytes)) or not _plain(value):
        return _UNKNOWN
    return value


def _cells(py_func) -> dict:
    """{name: value} of `py_func`'s closure variables (empty cells left
    out)."""
    code = getattr(py_func, "__code__", None)
    cells = getattr(py_func, "__closure__", None) or ()
    out = {}
    for name, cell in zip(getattr(code, "co_freevars", ()), cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # not yet bound
            pass
    return out


def _user_module_attribute(root, chain):
    """`root.a.b` for chain (a, b) where root is a module of the user's
    (not one of _SAFE_MODULES, whose values do not change), or _UNKNOWN."""
    if not isinstance(root, types.ModuleType) or \
            root.__name__.split(".")[0] in _SAFE_MODULES:
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
    cells = _cells(py_func)
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
    cells = _cells(py_func)
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


# -- the batched kernel --------------------------------------------------------

def batched_source(num_args: int, broadcast: tuple, axis: int,
                   scalars: tuple = ()) -> str:
    """Source of the generated kernel: slice `blockIdx.<axis>` of each array.

    Broadcast inputs (a leading axis of 1 shared by every slice) give slice 0;
    scalar parameters (their positions in `scalars`) are passed as they are.
    """
    params = [f"a{i}" for i in range(num_args)]
    picks = [f"a{i}" if i in scalars
             else f"a{i}[0]" if i < len(broadcast) and broadcast[i]
             else f"a{i}[s]" for i in range(num_args)]
    return (f"def batched({', '.join(params)}):\n"
            f"    s = cuda.blockIdx.{AXIS_NAMES[axis]}\n"
            f"    body({', '.join(picks)})\n")


def make_batched_kernel(kernel, num_args: int, broadcast: tuple, axis: int,
                        frozen: dict | None = None, scalars: tuple = ()):
    """A @cuda.jit kernel running `kernel`'s body on one slice per block
    row, reading `frozen` for the globals the unbatched kernel froze; the
    parameters at `scalars` are scalars, passed to every slice."""
    from numba import cuda
    py_func = with_globals(getattr(kernel, "py_func", kernel), frozen or {})
    options = dict(getattr(kernel, "targetoptions", None) or {})
    options.pop("device", None)
    options.pop("link", None)  # never folded: decide() falls back on links
    if getattr(kernel, "_fastmath", False):  # the simulator's kernels
        options["fastmath"] = True
    return compile_batched(cuda, py_func, options, num_args, broadcast, axis,
                           scalars)


def compile_batched(cuda: Any, py_func, options: dict, num_args: int,
                    broadcast: tuple, axis: int, scalars: tuple = ()):
    """The generated batched kernel (batched_source) around `py_func` as a
    device function, both compiled by `cuda`'s jit (numba-cuda's, or
    numba-cuda-mlir's) with `options`."""
    body = cuda.jit(device=True, **options)(py_func)
    scope = {"cuda": cuda, "body": body}
    exec(compile(batched_source(num_args, broadcast, axis, scalars),
                 f"<numbax batched {getattr(py_func, '__qualname__', '')}>",
                 "exec"), scope)
    batched = scope["batched"]
    batched.__qualname__ = (
        getattr(py_func, "__qualname__", "kernel") + ".batched")
    return cuda.jit(**options)(batched)
