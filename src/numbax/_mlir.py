"""numba-cuda-mlir kernels as numbax ops (an optional dependency).

numba-cuda-mlir (import name ``numba_cuda_mlir``) compiles the same
``@cuda.jit`` kernel language as numba-cuda through MLIR. numbax supports its
kernels in two places:

* ``numba_cuda_kernel``: the kernel is compiled at trace time for the
  current device's compute capability, its cubin is loaded once per process
  as a context-independent CUDA library (``cuLibraryLoadData``), and every
  device's primary context gets its CUfunction when XLA instantiates the
  program (as for numba-cuda kernels). The C++ handler packs each array as
  an MLIR memref (``csrc/kernel_args.h``, ``ArrayAbi::kMemref``): allocated
  pointer, aligned pointer, offset, sizes, strides in elements.
* ``numba_cuda_callable``: func may pass numbax's ``stream`` to a
  numba-cuda-mlir launch; launches on that stream do not synchronise the
  host, and take numbax's C++ fast path (``_mlir_launch.py``).
* ``jax.vmap``: the batch runs in one launch where the kernel's optimised
  MLIR shows it never reads the free grid axis (``axes_read_by_mlir``).

Nothing here imports ``numba_cuda_mlir`` unless the user did: its import
takes seconds, and numbax works without it. A kernel object of its type can
only exist once the user imported it, so recognising one needs only
``sys.modules``.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

import numpy as np

from . import _checks, _compat, _numba

MODULE = "numba_cuda_mlir"
DISTRIBUTION = "numba-cuda-mlir"
DESCRIPTOR = "numba_cuda_mlir.descriptor"

# numba-cuda-mlir releases whose private launch path (MLIRDispatcher.configure,
# _ArgMarshaller, _sync_cuda_array_interface_stream) that _mlir_launch.py
# patches was written against. Other releases keep their own behaviour in
# callables.
VERIFIED = ((0, 6),)

#: The ``abi`` field of numbax._core.LaunchPlan for memref parameters
#: (csrc/kernel_args.h, ArrayAbi::kMemref).
MEMREF_ABI = 1


def version() -> str | None:
    """The installed numba-cuda-mlir version, or None; never imports it."""
    return _compat.dist_version(DISTRIBUTION)


def status() -> str:
    """One line for ``python -m numbax info``."""
    found = version()
    if found is None:
        return ("not installed (optional: pip install numba-cuda-mlir; its "
                "kernels run on GPUs only, it has no simulator)")
    bridge = ("numbax's stream accepted in callables" if verified(found) else
              f"callables: its own launch path ({found} not verified; 0.6.x is)")
    return f"{found} (kernels in numba_cuda_kernel; {bridge}; no simulator)"


def verified(found: str | None) -> bool:
    return _compat.release(found)[:2] in VERIFIED


def is_kernel(obj: Any) -> bool:
    """True for a numba-cuda-mlir ``@cuda.jit`` dispatcher (kernel or device
    function), without importing numba-cuda-mlir when the user has not."""
    descriptor = sys.modules.get(DESCRIPTOR)
    cls = getattr(descriptor, "MLIRDispatcher", None)
    return isinstance(cls, type) and isinstance(obj, cls)


def no_simulator_error(label: str) -> NotImplementedError:
    return NotImplementedError(
        f"{label}: the kernel is a numba-cuda-mlir kernel, and numba-cuda-mlir "
        "has no CPU simulator: run the op on a GPU, or register a numba-cuda "
        "(@numba.cuda.jit) version of the kernel for the CPU "
        "(XLACustomKernel.def_kernel('cpu', ...))")


def argtypes(avals, batch: int, label: str = "numba_cuda_kernel") -> tuple:
    """numba-cuda-mlir's types of C-contiguous arrays of `avals` (the leading
    axis dropped when `batch`), as numbax passes its buffers."""
    from numba_cuda_mlir.numba_cuda import types
    from numba_cuda_mlir.numba_cuda.np import numpy_support
    tys = []
    for shape, dtype in avals:
        ndim = len(shape) - (1 if batch else 0)
        try:
            # A float8 buffer reaches the kernel as uint8 (its bits).
            element = numpy_support.from_dtype(_numba.kernel_dtype(dtype))
        except Exception as exc:  # noqa: BLE001 - its error names no op
            raise TypeError(
                f"{label}: numba-cuda-mlir has no type for dtype "
                f"{np.dtype(dtype)} ({exc}); cast the array to a dtype it "
                "supports, or use a numba-cuda kernel") from exc
        tys.append(types.Array(element, ndim, "C"))  # type: ignore[attr-defined]  # numba-cuda-mlir's own typing
    return tuple(tys)


class CompiledKernel:
    """A numba-cuda-mlir kernel compiled for one signature and one compute
    capability: its cubin, entry name and the CUkernel once loaded.

    The library is loaded once per process and never unloaded: compiled XLA
    programs keep its functions for their lifetime, which numbax does not
    bound, and unloading a library whose functions a captured CUDA graph
    still launches is undefined."""

    cooperative = False  # refused at compile time (see compile)

    def __init__(self, cubin: bytes, entry: str, capability: tuple[int, int],
                 compile_result: Any):
        self.cubin = cubin
        self.entry = entry
        self.capability = capability
        self.compile_result = compile_result  # keeps their metadata alive
        self._kernel: int | None = None
        self._library: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._kernel is not None

    def kernel_handle(self) -> int:
        """The CUkernel (context-independent), loading the cubin once."""
        with self._lock:
            if self._kernel is None:
                from cuda.bindings import driver
                err, library = driver.cuLibraryLoadData(
                    self.cubin, None, None, 0, None, None, 0)
                _check(driver, err, "cuLibraryLoadData")
                err, kernel = driver.cuLibraryGetKernel(
                    library, self.entry.encode())
                _check(driver, err, f"cuLibraryGetKernel({self.entry!r})")
                self._library = library  # owns the kernel: kept alive
                self._kernel = int(kernel)
            return self._kernel


def _check(driver, err, what: str) -> None:
    if int(err) != 0:
        _, name = driver.cuGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else name
        raise RuntimeError(f"{what} failed: {name}")


def capability_of_chip(chip: str | None) -> tuple[int, int] | None:
    if not chip or not chip.startswith("sm_"):
        return None
    digits = "".join(c for c in chip[3:] if c.isdigit())
    if len(digits) < 2:
        return None
    return int(digits[:-1]), int(digits[-1])


def compile_kernel(kernel, tys: tuple, label: str) -> CompiledKernel:
    """Compiles `kernel` for `tys` through numba-cuda-mlir, for the compute
    capability of the current device (as numba-cuda-mlir chooses it)."""
    # What the kernel's options already say is refused before compiling
    # (which takes seconds, and a GPU).
    options = getattr(kernel, "targetoptions", {}) or {}
    if options.get("debug"):
        raise ValueError(
            f"{label}: kernels compiled with debug=True report errors through "
            "numba-cuda-mlir's own launcher; launch them from a "
            "numba_cuda_callable instead, or compile without debug")
    if options.get("lto"):
        raise ValueError(
            f"{label}: the numba-cuda-mlir kernel is compiled with lto=True "
            "(LTO-IR, linked by its own launcher); numba_cuda_kernel loads "
            "cubins: compile without lto, or launch it from a "
            "numba_cuda_callable")
    unsupported = needs_its_loader(kernel, {})
    if unsupported:
        raise ValueError(
            f"{label}: the numba-cuda-mlir kernel {unsupported}, which its own "
            "launcher sets up when it loads the kernel; launch it from a "
            "numba_cuda_callable instead")
    result = _checks.compiled_naming_op(
        lambda: kernel.compile(tys),
        f"{label}: numba-cuda-mlir could not compile the kernel for argument "
        f"types {tys}")
    options = getattr(kernel, "targetoptions", {}) or {}  # now with its chip
    if bool(getattr(result, "cooperative", False)):
        raise ValueError(
            f"{label}: the numba-cuda-mlir kernel synchronises its grid "
            "(cooperative launch), which numba_cuda_kernel does not launch "
            "for numba-cuda-mlir yet; launch it from a numba_cuda_callable, "
            "or use a numba-cuda kernel")
    metadata = getattr(result, "metadata", None) or {}
    unsupported = needs_its_loader(kernel, metadata)
    if unsupported:
        raise ValueError(
            f"{label}: the numba-cuda-mlir kernel {unsupported}, which its own "
            "launcher sets up when it loads the kernel; launch it from a "
            "numba_cuda_callable instead")
    cubin, entry = metadata.get("cubin"), metadata.get("func_name")
    if not cubin or not entry:
        raise ValueError(
            f"{label}: numba-cuda-mlir produced no cubin for the kernel (was "
            "it compiled with output='ltoir' or lto=True?); numba_cuda_kernel "
            "loads cubins: compile without LTO")
    capability = capability_of_chip(options.get("chip"))
    if capability is None:
        raise ValueError(
            f"{label}: cannot tell which GPU numba-cuda-mlir compiled for "
            f"(chip={options.get('chip')!r})")
    return loadable(result, cubin, entry, capability)


def loadable(result, cubin, entry, capability) -> CompiledKernel:
    """The CompiledKernel of numba-cuda-mlir's compile result, one per
    result: every trace, program and fast plan of one compiled kernel shares
    its library (loaded once, never unloaded)."""
    with _loadable_lock:
        kernel = getattr(result, "_numbax_kernel", None)
        if not isinstance(kernel, CompiledKernel):
            kernel = CompiledKernel(bytes(cubin), str(entry), capability,
                                    result)
            result._numbax_kernel = kernel
        return kernel


_loadable_lock = threading.Lock()


def needs_its_loader(dispatcher, metadata) -> str | None:
    """What a kernel needs that numba-cuda-mlir's launcher does when it
    loads the cubin, and numbax's load would not: None if nothing."""
    if getattr(dispatcher, "_module_setup_callbacks", None) or getattr(
            dispatcher, "_module_teardown_callbacks", None):
        return "links code with module setup callbacks"
    if metadata.get("needs_nrt"):
        return "uses the NRT runtime (allocates arrays)"
    return None


def function_on(compiled: CompiledKernel, ordinal: int, shared_mem: int,
                label: str) -> int:
    """The CUfunction of `compiled` in device `ordinal`'s primary context."""
    from numba import cuda

    from . import _core
    capability = tuple(cuda.gpus[ordinal].compute_capability)
    if capability != compiled.capability:
        raise ValueError(
            f"{label}: the numba-cuda-mlir kernel was compiled for compute "
            f"capability {compiled.capability}, but device {ordinal} has "
            f"{capability}; numbax compiles numba-cuda-mlir kernels for one "
            "capability per process: use devices of one kind (e.g. "
            "CUDA_VISIBLE_DEVICES), or a numba-cuda kernel")
    return _core.kernel_function(compiled.kernel_handle(), ordinal, shared_mem)


# -- vmap in one launch (_fold.py's rule, read from its MLIR) ----------------

# Block indices and counts as the MLIR module reads them once lowered to
# NVVM (numba-cuda-mlir keeps that text as metadata["mlir_module_optimized"]),
# or still in the gpu dialect.
_NVVM_SREG = re.compile(
    r"nvvm\.read\.ptx\.sreg\.(n?ctaid|cluster\w*|n?clusterid)(\.[xyz])?")
_GPU_IDS = re.compile(
    r"gpu\.(block_id|grid_dim|cluster_id|cluster_dim|cluster_block_id)\s+([xyz])")
_LLVM_DECL = re.compile(r"^\s*llvm\.func\s+@([\w.$]+)\(")
# Declarations whose code reads no block index: libdevice, LLVM intrinsics,
# printf and assert.
_KNOWN_DECLS = ("__nv_", "llvm.", "vprintf", "__assertfail")


def axes_read_by_mlir(text: str) -> tuple[frozenset | None, str | None]:
    """(grid axes whose block index or count the module reads, None), or
    (None, why not). Device functions are inlined into the kernel's module,
    so it holds every read; a call into code it only declares cannot be
    followed."""
    from . import _fold
    read: set = set()
    for m in _NVVM_SREG.finditer(text):
        if m.group(1) in ("ctaid", "nctaid") and m.group(2):
            read.add("xyz".index(m.group(2)[1]))
        else:
            read.update((0, 1, 2))
    for m in _GPU_IDS.finditer(text):
        if m.group(1) in ("block_id", "grid_dim"):
            read.add("xyz".index(m.group(2)))
        else:
            read.update((0, 1, 2))
    read |= _fold.axes_read_by_ptx(text)  # inline PTX (asm strings)
    external = []
    for line in text.splitlines():
        decl = _LLVM_DECL.match(line)
        if (decl and not line.rstrip().endswith("{")
                and not decl.group(1).startswith(_KNOWN_DECLS)):
            external.append(decl.group(1))
    external.sort()
    if external:
        return None, f"it calls code numbax cannot read ({', '.join(external)})"
    return frozenset(read), None


def axes_read_by_compiled(compiled: CompiledKernel, kernel
                          ) -> tuple[frozenset | None, str | None]:
    """axes_read_by_mlir of a compiled kernel's optimised module."""
    options = getattr(kernel, "targetoptions", {}) or {}
    if options.get("link"):
        return None, "it links external code"
    metadata = getattr(compiled.compile_result, "metadata", None) or {}
    text = metadata.get("mlir_module_optimized")
    if not isinstance(text, str) or not text:
        return None, "numba-cuda-mlir kept no optimised MLIR module"
    return axes_read_by_mlir(text)


def make_batched_kernel(kernel, num_args: int, broadcast: tuple, axis: int,
                        frozen: dict | None = None):
    """_fold.make_batched_kernel for a numba-cuda-mlir kernel: the same
    generated kernel, compiled by numba-cuda-mlir around the kernel's body
    as a device function (inlined into it)."""
    from numba_cuda_mlir import cuda

    from . import _fold
    py_func = _fold.with_globals(kernel.py_func, frozen or {})
    options = getattr(kernel, "targetoptions", {}) or {}
    # Only what changes results: the batched kernel must compute exactly
    # what the kernel does per slice.
    same = {k: options[k] for k in ("fastmath",) if options.get(k)}
    return _fold.compile_batched(cuda, py_func, same, num_args, broadcast, axis)
