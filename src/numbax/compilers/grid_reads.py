"""Which grid axes a kernel's code reads: the fold reader's evidence.

A vmapped ``numba_cuda_kernel`` runs its batch in one launch only where the
kernel never reads the grid axis the batch would take (kernel/vmap.py has
the rule). Each compiler reads that from its own form of the kernel
(base.Compiler.grid_reads); the forms it shares are read here: PTX (what
numba-cuda compiles, and inline PTX in numba-cuda-mlir's modules), the code
numba-cuda links in, and, in Numba's simulator, where kernels are Python,
their bytecode. Anything a reader cannot follow counts as a read of every
axis (no fold).
"""

from __future__ import annotations

import dis
import glob
import importlib.util
import os
import re
import sys
import types

import numpy as np

AXIS_NAMES = "xyz"

# %ctaid.z / %nctaid.y / the vector form %ctaid, and clusters (never used by
# Numba, but they index blocks too).
_PTX_SREG = re.compile(r"%(n?ctaid|cluster_n?ctaid|n?clusterid)(\.[xyz])?\b")


def axes_read_by_ptx(ptx: str) -> frozenset:
    """Grid axes whose block index or count the PTX reads."""
    read = set()
    for m in _PTX_SREG.finditer(ptx):
        if m.group(1).startswith(("ctaid", "nctaid")) and m.group(2):
            read.add(AXIS_NAMES.index(m.group(2)[1]))
        else:
            read.update((0, 1, 2))
    return frozenset(read)


def axes_read_by_library(compiled) -> tuple[frozenset | None, str | None]:
    """(axes, None) for a kernel numba-cuda compiled (its code library's PTX
    and the code linked to it), or (None, why not)."""
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
    spec = importlib.util.find_spec("numba.cuda")
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.abspath(spec.origin))


def _headers_clean() -> bool:
    """numba-cuda's bundled bf16/fp16/fp8 headers name no grid token."""
    global _bundled_headers_clean
    if _bundled_headers_clean is None:
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
SAFE_MODULES = ("numba", "math", "cmath", "numpy", "operator")
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
    """(axes, None) for a kernel the simulator runs (its bytecode and that
    of every function it calls), or (None, why not)."""
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
    scope.update(closure_values(func))
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
                    read.add(AXIS_NAMES.index(nxt.argval))
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
        if value.__name__.split(".")[0] in SAFE_MODULES:
            return None
        return (f"it uses module {value.__name__}, whose functions numbax "
                "does not follow")
    if isinstance(value, types.FunctionType) or hasattr(value, "py_func"):
        return _scan_function(value, read, seen)
    if plain_value(value):
        return None  # values and types index no blocks
    # A tuple, list, dict, class or other object may hold a device function
    # (HELPERS[0](), H.z()): numbax does not look inside, so it counts as a
    # read of every axis.
    return (f"it uses a {type(value).__name__}, whose contents numbax does "
            "not follow")


def plain_value(value) -> bool:
    """A value or type that holds no code (a number, an array, a dtype, a
    Numba type), so it indexes no blocks and Numba freezes it as is."""
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


def closure_values(py_func) -> dict:
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
