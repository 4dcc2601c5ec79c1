"""numba-cuda-mlir: the compiler of ``numba_cuda_mlir.cuda.jit`` kernels (optional).

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
  host, and take numbax's C++ fast path (``numba_cuda_mlir_launch.py``).
* ``jax.vmap``: the batch runs in one launch where the kernel's optimised
  MLIR shows it never reads the free grid axis (``axes_read_by_mlir``).

:class:`NumbaCudaMlir` is the compiler as ops use it (base.Compiler).

Nothing here imports ``numba_cuda_mlir`` unless the user did: its import
takes seconds, and numbax works without it. A kernel object of its type can
only exist once the user imported it, so recognising one needs only
``sys.modules``.
"""

from __future__ import annotations

import re
import sys
import threading

import numpy as np

from ..runtime import compat, numba_bridge
from ..trace import checks
from . import fold, grid_reads, numba_cuda_mlir_launch, signatures
from .base import MEMREF_ABI, Compiler
from .cubin import CubinKernel

MODULE = "numba_cuda_mlir"
DISTRIBUTION = "numba-cuda-mlir"
DESCRIPTOR = "numba_cuda_mlir.descriptor"

# numba-cuda-mlir releases whose private launch path (MLIRDispatcher.configure,
# _ArgMarshaller, _sync_cuda_array_interface_stream) that numba_cuda_mlir_launch.py
# patches was written against. Other releases keep their own behaviour in
# callables.
VERIFIED = ((0, 6),)

def version() -> str | None:
    """The installed numba-cuda-mlir version, or None; never imports it."""
    return compat.dist_version(DISTRIBUTION)


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
    return compat.release(found)[:2] in VERIFIED


def capability_of_chip(chip: str | None) -> tuple[int, int] | None:
    if not chip or not chip.startswith("sm_"):
        return None
    digits = "".join(c for c in chip[3:] if c.isdigit())
    if len(digits) < 2:
        return None
    return int(digits[:-1]), int(digits[-1])


def _compile(kernel, tys: tuple, label: str) -> CubinKernel:
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
    result = checks.compiled_naming_op(
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


def loadable(result, cubin, entry, capability) -> CubinKernel:
    """The CubinKernel of numba-cuda-mlir's compile result, one per
    result: every trace, program and fast plan of one compiled kernel shares
    its library (loaded once, never unloaded)."""
    with _loadable_lock:
        kernel = getattr(result, "_numbax_kernel", None)
        if not isinstance(kernel, CubinKernel):
            kernel = CubinKernel(bytes(cubin), str(entry), capability, result)
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


# -- the fold reader: grid axes read in its MLIR ------------------------------

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
    read: set = set()
    for m in _NVVM_SREG.finditer(text):
        if m.group(1) in ("ctaid", "nctaid") and m.group(2):
            read.add(grid_reads.AXIS_NAMES.index(m.group(2)[1]))
        else:
            read.update((0, 1, 2))
    for m in _GPU_IDS.finditer(text):
        if m.group(1) in ("block_id", "grid_dim"):
            read.add(grid_reads.AXIS_NAMES.index(m.group(2)))
        else:
            read.update((0, 1, 2))
    read |= grid_reads.axes_read_by_ptx(text)  # inline PTX (asm strings)
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


class NumbaCudaMlir(Compiler):
    name = DISTRIBUTION
    cuda_module = "numba_cuda_mlir.cuda"
    abi = MEMREF_ABI
    takes_scalars = False

    def owns(self, kernel) -> bool:
        """Without importing numba-cuda-mlir when the user has not."""
        descriptor = sys.modules.get(DESCRIPTOR)
        cls = getattr(descriptor, "MLIRDispatcher", None)
        return isinstance(cls, type) and isinstance(kernel, cls)

    def check_simulated(self, label):
        raise NotImplementedError(
            f"{label}: the kernel is a numba-cuda-mlir kernel, and "
            "numba-cuda-mlir has no CPU simulator: run the op on a GPU, or "
            "register a numba-cuda (@numba.cuda.jit) version of the kernel "
            "for the CPU (XLACustomKernel.def_kernel('cpu', ...))")

    def argtypes(self, avals, batch, scalars, label):
        """numba-cuda-mlir's types of C-contiguous arrays of `avals`, as
        numbax passes its buffers (it takes no scalars)."""
        del scalars
        from numba_cuda_mlir.numba_cuda import types
        from numba_cuda_mlir.numba_cuda.np import numpy_support
        tys = []
        for shape, dtype in avals:
            ndim = len(shape) - (1 if batch else 0)
            try:
                # A float8 buffer reaches the kernel as uint8 (its bits).
                element = numpy_support.from_dtype(
                    numba_bridge.kernel_dtype(dtype))
            except Exception as exc:  # noqa: BLE001 - its error names no op
                raise TypeError(
                    f"{label}: numba-cuda-mlir has no type for dtype "
                    f"{np.dtype(dtype)} ({exc}); cast the array to a dtype it "
                    "supports, or use a numba-cuda kernel") from exc
            tys.append(types.Array(element, ndim, "C"))  # type: ignore[attr-defined]  # numba-cuda-mlir's own typing
        return tuple(tys)

    def compile(self, kernel, argtypes, label, n_in=None):
        """For the compute capability of the current device (as
        numba-cuda-mlir chooses it)."""
        argtypes = tuple(argtypes)
        # Explicit signatures: the one Numba's launch would choose, or a
        # TypeError (its compile() would build code for any types).
        chosen = signatures.select_signature(kernel, argtypes, label, n_in)
        if chosen is not None:
            fold.note_compiled_elsewhere(kernel, argtypes)
            return _compile(kernel, tuple(chosen), label)
        fold.note_compile(kernel, argtypes)
        return _compile(kernel, argtypes, label)

    def grid_reads(self, kernel, compile):
        """It has no simulator: read its compiled, optimised MLIR module."""
        compiled = compile()
        options = getattr(kernel, "targetoptions", {}) or {}
        if options.get("link"):
            return bool(compiled.cooperative), None, "it links external code"
        metadata = getattr(compiled.compile_result, "metadata", None) or {}
        text = metadata.get("mlir_module_optimized")
        if not isinstance(text, str) or not text:
            return (bool(compiled.cooperative), None,
                    "numba-cuda-mlir kept no optimised MLIR module")
        return (bool(compiled.cooperative), *axes_read_by_mlir(text))

    def batched_kernel(self, kernel, num_args, broadcast, axis, frozen,
                       scalars, traced=()):
        """The generated kernel, made by numba-cuda-mlir around the
        kernel's body as a device function (inlined into it)."""
        from numba_cuda_mlir import cuda
        py_func = fold.with_globals(kernel.py_func, frozen or {})
        options = getattr(kernel, "targetoptions", {}) or {}
        # Only what changes results: the batched kernel must compute exactly
        # what the kernel does per slice.
        same = {k: options[k] for k in ("fastmath",) if options.get(k)}
        # Never traced scalars: the op refuses them (takes_scalars).
        assert not traced, traced
        return fold.batched_kernel(cuda, py_func, same, num_args, broadcast,
                                   axis, scalars)

    def compile_batched(self, kernel, batched, argtypes, label):
        del kernel
        return _compile(batched, argtypes, label)

    def function_on(self, compiled, ordinal, *, grid, block, shared_mem,
                    label, shared):
        del grid, block, shared
        from numba import cuda
        capability = tuple(cuda.gpus[ordinal].compute_capability)
        if capability != compiled.capability:
            raise ValueError(
                f"{label}: the numba-cuda-mlir kernel was compiled for compute "
                f"capability {compiled.capability}, but device {ordinal} has "
                f"{capability}; numbax compiles numba-cuda-mlir kernels for "
                "one capability per process: use devices of one kind (e.g. "
                "CUDA_VISIBLE_DEVICES), or a numba-cuda kernel")
        return compiled.function_on(ordinal, shared_mem)

    def install_launch_hook(self):
        numba_cuda_mlir_launch.install_launch_bridge(LAUNCH_NEEDS)


COMPILER = NumbaCudaMlir()
# What the launch bridge needs of this module, handed to it (it imports
# nothing of this module, so the two form no circle).
LAUNCH_NEEDS = numba_cuda_mlir_launch.Needs(
    DESCRIPTOR, version, verified, needs_its_loader, loadable,
    capability_of_chip)
