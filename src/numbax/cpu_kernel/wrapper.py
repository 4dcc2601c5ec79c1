"""The @cfunc wrapper numbax generates around a numba_kernel's @njit kernel.

XLA's CPU handler (csrc/cpu_kernel_handler.cc) calls the wrapper's address
with the buffers' data addresses and extents and a part [begin, end) of the
call's range; the wrapper builds C-contiguous Numba arrays over the buffers
(``numba.carray``, extents read at run time, so a shard of any size works),
and calls the kernel natively: no Python, no GIL. One wrapper is compiled
per kernel, argument types, batch layout and launch range.

A Numba cfunc swallows a Python exception (it prints it and returns as if
nothing happened), so the wrapper catches every exception itself and
returns a status (cpu_kernel_chunks.h, WrapperStatus): the handler makes it
an XLA error, whose text comes from :func:`diagnose`, a re-run in Python.

The loops over a sub-range use ``numba.uint64`` indices: signed ones over a
sub-range stop LLVM vectorising them (measured 4x slower, docs/anchors).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The wrapper's statuses (csrc/cpu_kernel_chunks.h).
OK, RAISED = 0, 1


@dataclass(frozen=True)
class Layout:
    """What a wrapper is compiled for (and what diagnose re-runs).

    Attributes:
      args: per kernel argument before the outputs, in order: ("a", i) for
        input buffer i, ("s", j) for scalar j.
      buffers: per buffer (inputs, then outputs): (dtype, rank as passed).
      batched: per buffer, whether it has the call's `batch_ndim` leading
        batch axes that the wrapper loops over (outputs always do when
        batch_ndim > 0).
      batch_ndim: leading batch axes of a per-slice vmapped call (0: none).
      scalars: the scalars' values, in order: what a call passes (the
        handler's blob, a diagnostic re-run), not what the wrapper is
        compiled for, so they take no part in a layout's equality (one
        wrapper serves every value: it reads them at run time).
      levels: per buffer, the batch levels it carries (a bool per level,
        outermost first) in a per-slice vmapped call; () otherwise. An input
        batched at some levels only has just those leading axes, and the
        wrapper computes its slice from the call's slice index.
      scalar_types: the scalars' dtypes (names), in order: the types the
        kernel is compiled for. By type, not by value: 1, 1.0 and True are
        equal values of three types.
      range_n: the launch range (launch_dims), or -1 for none: the kernel
        then takes no (begin, end) first.
      n_inputs: how many input buffers.
      readonly: per buffer, whether the kernel gets it as a read-only Numba
        array (the inputs no output aliases), so that a kernel writing one
        fails to compile, at trace time, instead of changing a buffer XLA
        may share with other arrays.
      protected: per buffer, whether the kernel must not write it (the
        inputs no output aliases). `readonly` is the same, except for a
        kernel with explicit signatures, whose overloads take writable
        arrays: numbax checks that one's writes by compiling its function
        anew for read-only ones (kernel_audit.audit_fixed_signature).
    """
    args: tuple
    buffers: tuple
    batched: tuple
    batch_ndim: int
    scalars: tuple = field(compare=False, repr=False)
    range_n: int = -1
    n_inputs: int = 0
    readonly: tuple = ()
    protected: tuple = ()
    scalar_types: tuple = ()
    levels: tuple = ()


def scalar_blob(layout: Layout) -> bytes:
    """The scalars' values as the handler keeps them, each in the type the
    wrapper reads it as: 16 bytes each."""
    out = b""
    for v, t in zip(layout.scalars, layout.scalar_types):
        out += np.asarray(v, dtype=np.dtype(t)).tobytes().ljust(16, b"\0")
    return out


def slice_types(layout: Layout) -> tuple:
    """The Numba types the kernel is called with: (begin, end) if it has a
    range, the inputs and scalars in order, then the outputs."""
    import numba
    from numba import types

    def array_type(i):
        dtype, rank = layout.buffers[i]
        if layout.batched[i]:
            rank -= _carried(layout, i)
        return types.Array(numba.from_dtype(np.dtype(dtype)), rank, "C",
                           readonly=_is_readonly(layout, i))
    head = (types.uint64, types.uint64) if layout.range_n >= 0 else ()
    ins = tuple(array_type(i) if kind == "a" else
                numba.from_dtype(np.dtype(layout.scalar_types[i]))
                for kind, i in layout.args)
    outs = tuple(array_type(layout.n_inputs + j) for j in
                 range(len(layout.buffers) - layout.n_inputs))
    return head + ins + outs


def _carried(layout: Layout, i: int) -> int:
    """How many batch levels buffer i carries."""
    if not layout.batch_ndim or not layout.batched[i]:
        return 0
    return sum(layout.levels[i]) if layout.levels else layout.batch_ndim


def _partial(layout: Layout) -> list:
    """The buffers batched at some levels only."""
    return [i for i in range(len(layout.buffers)) if layout.batched[i]
            and layout.levels and not all(layout.levels[i])]


def _slice_of(mask, k: int) -> str:
    """The index of a buffer's slice carrying the levels `mask`, from the
    per-level indices i0..i{k-1} of the call's slice (Horner's rule over
    the levels it carries)."""
    got = ""
    for level in range(k):
        if mask[level]:
            got = f"i{level}" if not got else f"({got}) * e{level} + i{level}"
    return got


def _source(layout: Layout) -> str:
    k = layout.batch_ndim
    # The arrays are built before the try: building one cannot raise, and
    # every statement inside a Numba try adds an edge to its handler, which
    # made the compile time grow with the square of the buffers (29
    # inputs: 19 s).
    lines = ["def numbax_wrapper(ptrs, dims, begin, end):"]
    names = []
    for i, (_, rank) in enumerate(layout.buffers):
        ext = [f"dims[{i}][{d}]" for d in range(rank)]
        carried = _carried(layout, i)
        if carried:
            ext = [" * ".join(ext[:carried])] + ext[carried:]
        shape = _tuple(ext)
        lines.append(f"    b{i} = carray(ptrs[{i}], {shape}, t{i})")
        names.append(f"b{i}")
    nb = len(layout.buffers)
    for j in range(len(layout.scalar_types)):
        lines.append(f"    s{j} = carray(ptrs[{nb + j}], (1,), st{j})[0]")

    partial = _partial(layout)
    if partial:
        # The extents of the levels, from output 0 (which has them all).
        out0 = layout.n_inputs
        lines += [f"    e{d} = uint64(dims[{out0}][{d}])" for d in range(k)]

    def index(i):
        return f"x{i}" if i in partial else "b"

    def arg(i):
        if not (layout.batched[i] and k):
            got = names[i]
        elif layout.buffers[i][1] - _carried(layout, i) == 0:
            # a slice of a 0-d argument
            got = f"{names[i]}[{index(i)}:{index(i)} + one].reshape(())"
        else:
            got = f"{names[i]}[{index(i)}]"
        return f"readonly({got})" if _is_readonly(layout, i) else got

    def slices(indent: str) -> list:
        """Lines that compute the slice of each partially batched buffer
        from b: the per-level indices, innermost last."""
        if not partial:
            return []
        got = [f"{indent}r = b"]
        for d in range(k - 1, 0, -1):
            got += [f"{indent}i{d} = r % e{d}", f"{indent}r = r // e{d}"]
        got.append(f"{indent}i0 = r")
        got += [f"{indent}x{i} = {_slice_of(layout.levels[i], k)}"
                for i in partial]
        return got
    lines.append("    try:")
    call_args = [arg(i) if kind == "a" else f"s{i}"
                 for kind, i in layout.args]
    call_args += [arg(layout.n_inputs + j)
                  for j in range(nb - layout.n_inputs)]
    one = "        one = uint64(1)"
    if layout.range_n < 0 and not k:
        lines.append(f"        kernel({_args(call_args)})")
    elif layout.range_n < 0:
        lines += [one, "        for b in range(begin, end):",
                  *slices("            "),
                  f"            kernel({_args(call_args)})"]
    elif not k:
        lines.append(f"        kernel({_args(['begin', 'end'] + call_args)})")
    else:
        lines += [one, f"        n = uint64({layout.range_n})",
                  "        b = begin // n",
                  "        while b * n < end:",
                  "            lo = max(begin, b * n) - b * n",
                  "            hi = min(end, b * n + n) - b * n",
                  *slices("            "),
                  f"            kernel({_args(['lo', 'hi'] + call_args)})",
                  "            b += one"]
    lines += [f"        return {OK}", "    except Exception:",
              f"        return {RAISED}"]
    return "\n".join(lines) + "\n"


# CPython 3.11 builds a tuple or call of more than 30 items through a list
# (LIST_TO_TUPLE), an op-code Numba rejects: longer ones are built from
# parts of at most this many, added together.
_PART = 16


def _tuple(items: list) -> str:
    """Source of the tuple of `items` that Numba compiles at any length."""
    if len(items) <= 30:
        return "(" + "".join(e + ", " for e in items) + ")"
    return " + ".join(_tuple(items[i:i + _PART])
                      for i in range(0, len(items), _PART))


def _args(items: list) -> str:
    """Source of a call's arguments `items` that Numba compiles at any
    count (past 30, one starred tuple built from parts)."""
    return ", ".join(items) if len(items) <= 30 else f"*({_tuple(items)})"


def _is_readonly(layout: Layout, i: int) -> bool:
    return i < len(layout.readonly) and layout.readonly[i]


_readonly_cast: list = []


def _readonly():
    """A Numba intrinsic: the same array, typed read-only (no copy, no
    code: the two types share one data model)."""
    if _readonly_cast:
        return _readonly_cast[0]
    from numba.core.imputils import impl_ret_borrowed
    from numba.extending import intrinsic

    @intrinsic
    def readonly(typingctx, array):
        result = array.copy(readonly=True)

        def codegen(context, builder, sig, args):
            return impl_ret_borrowed(context, builder, result, args[0])
        return result(array), codegen
    _readonly_cast.append(readonly)
    return readonly


def signature():
    """The wrapper's C signature (cpu_kernel_handler.h, CpuKernelWrapper)."""
    from numba import types
    return types.int32(types.CPointer(types.voidptr),
                       types.CPointer(types.CPointer(types.int64)),
                       types.uint64, types.uint64)


def compile_wrapper(kernel: Any, layout: Layout) -> Any:
    """The compiled cfunc (keep it alive while its address is in use).

    For a kernel Numba caches (``@njit(cache=True)``) the wrapper is cached
    too: its source is written into the kernel's cache directory, under a
    name that hashes everything the compiled code depends on (the layout,
    the kernel's source file, its stamp and bytecode, Numba's version), and
    compiled with ``cfunc(cache=True)``, so a later process loads it from
    Numba's cache instead of compiling (docs/warm_start.md)."""
    import numba
    namespace: dict = {"carray": numba.carray, "kernel": kernel,
                       "uint64": numba.uint64, "readonly": _readonly()}
    for i, (dtype, _) in enumerate(layout.buffers):
        namespace[f"t{i}"] = np.dtype(dtype)
    for j, t in enumerate(layout.scalar_types):
        namespace[f"st{j}"] = np.dtype(t)
    source = _source(layout)
    cached = _cached_module(kernel, layout, source, namespace)
    if cached is not None:
        return numba.cfunc(signature(), cache=True)(cached)
    exec(compile(source, "<numbax numba_kernel wrapper>", "exec"), namespace)
    return numba.cfunc(signature())(namespace["numbax_wrapper"])


def cache_slot(kernel: Any, *parts: Any,
               closures: bool = False) -> tuple[str, str] | None:
    """(directory, digest) for a file numbax keeps beside Numba's cache of
    `kernel`, the digest hashing `parts` and everything the kernel's
    compiled code depends on (its source file, that file's stamp, its
    bytecode, Numba's version); None for a kernel Numba does not cache or
    whose source cannot be found. A closure gets one only with `closures`,
    its captured values pickled into the digest (as Numba keys its own
    cache of a closure), and none when they do not pickle."""
    import hashlib
    import inspect
    import os

    import numba
    cache = getattr(kernel, "_cache", None)
    directory = getattr(cache, "_cache_path", None)
    if directory is None or type(cache).__name__ == "NullCache":
        return None
    py_func = kernel.py_func
    cells = b""
    if py_func.__closure__:
        # Two closures of one factory differ in their captured values only.
        if not closures:
            return None
        import pickle
        try:
            cells = pickle.dumps(tuple(c.cell_contents
                                       for c in py_func.__closure__))
        except Exception:  # noqa: BLE001 - anything unpicklable
            return None
    try:
        path = inspect.getfile(py_func)
        stamp = os.stat(path).st_mtime_ns
    except (OSError, TypeError):
        return None
    code = py_func.__code__
    key = (*parts, path, stamp, code.co_code, code.co_consts,
           py_func.__qualname__, numba.__version__)
    if cells:
        key += (hashlib.sha256(cells).hexdigest(),)
    digest = hashlib.sha256(repr(key).encode()).hexdigest()
    return directory, digest


def _cached_module(kernel: Any, layout: Layout, source: str,
                   namespace: dict) -> Any:
    """The wrapper function loaded from a source file in the kernel's cache
    directory (written now if missing), or None: the kernel is not cached,
    or the directory is not writable (the wrapper is then compiled as
    always)."""
    import importlib.util
    import os
    import sys

    slot = cache_slot(kernel, layout, source, closures=True)
    if slot is None:
        return None
    directory, digest = slot
    py_func = kernel.py_func
    try:
        name = f"numbax_cpu_wrapper_{py_func.__name__}_{digest[:20]}"
        file = os.path.join(directory, name + ".py")
        if not os.path.exists(file):
            os.makedirs(directory, exist_ok=True)
            tmp = f"{file}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(source)
            os.replace(tmp, file)  # atomic: readers see all or nothing
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        module.__dict__.update(namespace)
        # Numba's cache finds a function's module by name. Executed anew
        # for each wrapper: its globals are this kernel object's.
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module.numbax_wrapper
    except OSError:
        return None


def _array(address: int, shape: tuple, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n == 0:
        return np.zeros(shape, dtype)
    buf = (ctypes.c_char * n).from_address(address)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def rerun(kernel: Any, layout: Layout, addresses, shapes) -> None:
    """Runs the call again from Python over the same buffers (the kernel's
    exception, if any, propagates): what the wrapper did, slice by slice."""
    k = layout.batch_ndim
    arrays = []
    for i, (address, shape) in enumerate(zip(addresses, shapes)):
        shape = tuple(shape)
        carried = _carried(layout, i)
        if carried:
            shape = (int(np.prod(shape[:carried], dtype=np.int64)),) + \
                shape[carried:]
        arrays.append(_array(address, shape, layout.buffers[i][0]))
    n_batch = arrays[layout.n_inputs].shape[0] if k else 1
    extents = tuple(int(e) for e in shapes[layout.n_inputs][:k])

    def args_of(b):
        def arg(i):
            # [b, ...]: a 0-d array for a batch of 0-d slices, as the
            # wrapper passes ([b] would be a NumPy scalar).
            if not (layout.batched[i] and k):
                return arrays[i]
            if not layout.levels or all(layout.levels[i]):
                return arrays[i][b, ...]
            at = np.unravel_index(b, extents)
            flat = np.ravel_multi_index(
                tuple(a for a, on in zip(at, layout.levels[i]) if on),
                tuple(e for e, on in zip(extents, layout.levels[i]) if on))
            return arrays[i][int(flat), ...]
        ins = [arg(i) if kind == "a" else layout.scalars[i]
               for kind, i in layout.args]
        return ins + [arg(layout.n_inputs + j)
                      for j in range(len(arrays) - layout.n_inputs)]
    for b in range(n_batch):
        if layout.range_n >= 0:
            kernel(np.uint64(0), np.uint64(layout.range_n), *args_of(b))
        else:
            kernel(*args_of(b))


def diagnose(kernel: Any, layout: Layout, label: str):
    """The function the handler calls, with the GIL, when a call failed:
    (addresses, shapes) -> the error's text."""
    def run(addresses, shapes) -> str:
        try:
            rerun(kernel, layout, addresses, shapes)
        except Exception as exc:  # noqa: BLE001 - the kernel's own error
            return (f"the kernel raised {type(exc).__name__}: {exc} "
                    f"({label}; re-run in Python to show it)")
        return (f"the kernel raised an exception in the compiled run "
                f"({label}), but not when re-run in Python over the same "
                "buffers")
    return run
