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
  host, and take numbax's C++ fast path (``install_launch_bridge``).
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

MODULE = "numba_cuda_mlir"
DISTRIBUTION = "numba-cuda-mlir"
_DESCRIPTOR = "numba_cuda_mlir.descriptor"

# numba-cuda-mlir releases whose private launch path (MLIRDispatcher.configure,
# _ArgMarshaller, _sync_cuda_array_interface_stream) install_launch_bridge
# was written against. Other releases keep their own behaviour in callables.
VERIFIED = ((0, 6),)

#: The ``abi`` field of numbax._core.LaunchPlan for memref parameters
#: (csrc/kernel_args.h, ArrayAbi::kMemref).
MEMREF_ABI = 1


def version() -> str | None:
    """The installed numba-cuda-mlir version, or None; never imports it."""
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a broken install reads as absent
        return None


def status() -> str:
    """One line for ``python -m numbax info``."""
    found = version()
    if found is None:
        return ("not installed (optional: pip install numba-cuda-mlir; its "
                "kernels run on GPUs only, it has no simulator)")
    verified = _verified(found)
    bridge = ("numbax's stream accepted in callables" if verified else
              f"callables: its own launch path ({found} not verified; 0.6.x is)")
    return f"{found} (kernels in numba_cuda_kernel; {bridge}; no simulator)"


def _verified(found: str | None) -> bool:
    try:
        major_minor = tuple(int(p) for p in (found or "").split(".")[:2])
    except ValueError:
        return False
    return major_minor in VERIFIED


def is_kernel(obj: Any) -> bool:
    """True for a numba-cuda-mlir ``@cuda.jit`` dispatcher (kernel or device
    function), without importing numba-cuda-mlir when the user has not."""
    descriptor = sys.modules.get(_DESCRIPTOR)
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
            element = numpy_support.from_dtype(np.dtype(dtype))
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


def _capability_of_chip(chip: str | None) -> tuple[int, int] | None:
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
    unsupported = _needs_its_loader(kernel, {})
    if unsupported:
        raise ValueError(
            f"{label}: the numba-cuda-mlir kernel {unsupported}, which its own "
            "launcher sets up when it loads the kernel; launch it from a "
            "numba_cuda_callable instead")
    try:
        result = kernel.compile(tys)
    except Exception as exc:
        message = (f"{label}: numba-cuda-mlir could not compile the kernel "
                   f"for argument types {tys}: {exc}")
        try:
            named = type(exc)(message)
        except Exception:  # noqa: BLE001 - an exception type of its own
            raise exc from None
        raise named from exc
    options = getattr(kernel, "targetoptions", {}) or {}  # now with its chip
    if bool(getattr(result, "cooperative", False)):
        raise ValueError(
            f"{label}: the numba-cuda-mlir kernel synchronises its grid "
            "(cooperative launch), which numba_cuda_kernel does not launch "
            "for numba-cuda-mlir yet; launch it from a numba_cuda_callable, "
            "or use a numba-cuda kernel")
    metadata = getattr(result, "metadata", None) or {}
    unsupported = _needs_its_loader(kernel, metadata)
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
    capability = _capability_of_chip(options.get("chip"))
    if capability is None:
        raise ValueError(
            f"{label}: cannot tell which GPU numba-cuda-mlir compiled for "
            f"(chip={options.get('chip')!r})")
    return _loadable(result, cubin, entry, capability)


def _loadable(result, cubin, entry, capability) -> CompiledKernel:
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


def _needs_its_loader(dispatcher, metadata) -> str | None:
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


def make_batched_kernel(kernel, num_args: int, broadcast: tuple, axis: int):
    """_fold.make_batched_kernel for a numba-cuda-mlir kernel: the same
    generated kernel, compiled by numba-cuda-mlir around the kernel's body
    as a device function (inlined into it)."""
    from numba_cuda_mlir import cuda

    from . import _fold
    py_func = kernel.py_func
    options = getattr(kernel, "targetoptions", {}) or {}
    # Only what changes results: the batched kernel must compute exactly
    # what the kernel does per slice.
    same = {k: options[k] for k in ("fastmath",) if options.get(k)}
    body = cuda.jit(device=True, **same)(py_func)
    scope = {"cuda": cuda, "body": body}
    exec(compile(_fold.batched_source(num_args, broadcast, axis),
                 f"<numbax batched {getattr(py_func, '__qualname__', '')}>",
                 "exec"), scope)
    batched = scope["batched"]
    batched.__qualname__ = (
        getattr(py_func, "__qualname__", "kernel") + ".batched")
    return cuda.jit(**same)(batched)


# -- numba_cuda_callable: numbax's stream in numba-cuda-mlir launches -------

_bridge_lock = threading.Lock()
_bridge_note = "not installed"
_bridge_done = False  # decided (installed, or found unverified) once
# The stream of the numba-cuda-mlir launch this thread is making (as an
# int), read by the array-interface sync below.
_launching = threading.local()


def _stream_int(stream) -> Any:
    """numba-cuda's Stream objects (numbax's stream is one) as their raw
    handle, which numba-cuda-mlir's launcher accepts; anything else as is."""
    numba_driver = sys.modules.get("numba.cuda.cudadrv.driver")
    cls = getattr(numba_driver, "Stream", None)
    if isinstance(cls, type) and isinstance(stream, cls):
        handle = getattr(stream, "handle", None)
        return int(handle) if handle is not None else 0
    return stream


# numba-cuda-mlir's configure normalises the dimensions, builds and checks
# its cache key and takes a lock before its cache answers: about 9 us of
# Python on a slow host, paid by every `kernel[grid, block, stream]` in
# func (numba-cuda's costs 0.6). numbax answers repeats first, from the same
# arguments, for a launcher its cache still holds under the key it filed it
# by. The front key has all its key is made of: the arguments as given (the
# normalisation is a function of them), the dispatcher's extensions (by
# identity, as its key) and whether launch configurations are enabled.
_FRONT_ATTR = "_numbax_configured"
_FRONT_SIZE = 64


def _front_key(dispatcher, griddim, blockdim, stream, sharedmem, cluster):
    try:
        key = (griddim, blockdim, stream, sharedmem, cluster,
               tuple(map(id, dispatcher.extensions)),
               bool(dispatcher._launch_config_enabled))
        hash(key)
    except Exception:  # noqa: BLE001 - unhashable or unusual: no front cache
        return None
    return key


def _configured(dispatcher) -> dict:
    front = dispatcher.__dict__.get(_FRONT_ATTR)
    if front is None:
        front = dispatcher.__dict__.setdefault(_FRONT_ATTR, {})
    return front


def _remember(dispatcher, front, marshaller) -> None:
    """Files `marshaller` under `front` with the key numba-cuda-mlir's cache
    holds it by (found by identity; not filed when it holds none)."""
    cache = getattr(dispatcher, "_configure_cache", None)
    if cache is None:
        return
    filed = next((k for k, v in list(cache.items()) if v is marshaller), None)
    if filed is None:
        return
    table = _configured(dispatcher)
    if len(table) >= _FRONT_SIZE:
        table.clear()
    table[front] = (filed, marshaller)


def install_launch_bridge() -> str:
    """Lets func pass numbax's stream to numba-cuda-mlir launches, without a
    host synchronisation per launch. Idempotent; a no-op until the user
    imported numba_cuda_mlir, and on releases not verified.

    Two changes to numba-cuda-mlir's Python launch path, both narrow:

    * ``MLIRDispatcher.configure``: a numba-cuda ``Stream`` (numbax's stream
      object, or any ``numba.cuda`` stream) is replaced by its raw handle.
      numba-cuda-mlir recognises only its own stream class and refuses
      numba-cuda's.
    * ``_sync_cuda_array_interface_stream``: numba-cuda-mlir synchronises the
      stream named in each array's ``__cuda_array_interface__`` before every
      launch, even when that is the launch's own stream. numbax's arrays name
      XLA's stream, so every launch waited on the host for XLA's work. The
      sync is skipped only when the array's stream is the launch's stream
      (the interface's rule: work on one stream is already ordered).
    """
    global _bridge_note, _bridge_done
    if _bridge_done:  # called on every trace of a callable: stay cheap
        return _bridge_note
    descriptor = sys.modules.get(_DESCRIPTOR)
    if descriptor is None:
        return "off until numba_cuda_mlir is imported"
    with _bridge_lock:
        if _bridge_done:
            return _bridge_note
        _bridge_done = True
        dispatcher_cls = descriptor.MLIRDispatcher
        found = version()
        if not _verified(found):
            _bridge_note = (f"off: numba-cuda-mlir {found} is not verified "
                            "(0.6.x is)")
            return _bridge_note
        marshaller = getattr(descriptor, "_ArgMarshaller", None)
        sync = getattr(descriptor, "_sync_cuda_array_interface_stream", None)
        if marshaller is None or sync is None or not hasattr(
                marshaller, "_call_impl"):
            _bridge_note = "off: numba-cuda-mlir's launch path differs"
            return _bridge_note
        _type_numba_cuda_arrays()
        original_configure = dispatcher_cls.configure

        def configure(self, griddim, blockdim, stream=None, sharedmem=None,
                      cluster=None):
            stream = _stream_int(stream)
            front = _front_key(self, griddim, blockdim, stream, sharedmem,
                               cluster)
            if front is not None:
                hit = _configured(self).get(front)
                # Still the launcher numba-cuda-mlir's own cache holds for
                # these arguments: what its configure would return.
                if hit is not None and self._configure_cache.get(hit[0]) is hit[1]:
                    return hit[1]
            marshaller = original_configure(self, griddim, blockdim, stream,
                                            sharedmem, cluster)
            if front is not None:
                _remember(self, front, marshaller)
            return marshaller

        configure.__numbax_bridge__ = True  # type: ignore[attr-defined]
        configure.__wrapped__ = original_configure  # type: ignore[attr-defined]
        dispatcher_cls.configure = configure

        original_call_impl = marshaller._call_impl

        def _call_impl(self, *args):
            # The sync runs while arguments are prepared, before the launch:
            # publish the launch's stream for the whole call.
            previous = getattr(_launching, "stream", None)
            _launching.stream = self._launch_stream
            try:
                return original_call_impl(self, *args)
            finally:
                _launching.stream = previous

        _call_impl.__wrapped__ = original_call_impl  # type: ignore[attr-defined]
        marshaller._call_impl = _call_impl

        def _sync_unless_same_stream(arg):
            if _same_stream(arg, getattr(_launching, "stream", None)):
                return None
            return sync(arg)

        _sync_unless_same_stream.__wrapped__ = sync  # type: ignore[attr-defined]
        descriptor._sync_cuda_array_interface_stream = (  # type: ignore[attr-defined]
            _sync_unless_same_stream)
        _bridge_note = f"on (numba-cuda-mlir {found})"
        _bridge_note += _install_fast_launch(marshaller)
        return _bridge_note


def _type_numba_cuda_arrays() -> None:
    """numba-cuda-mlir types numba-cuda's device arrays (numbax's arrays and
    their views, as func receives them) through the CUDA Array Interface.

    Its typeof takes any object's ``_numba_type_`` first, and a numba-cuda
    array's is numba-cuda's own Array type, which numba-cuda-mlir's compiler
    refuses ("invalid type in signature: expected a type instance"). The
    interface gives the type in its own namespace, and its launcher reads
    the interface's pointer already."""
    try:
        from numba.cuda.cudadrv.devicearray import DeviceNDArrayBase
    except ImportError:  # Numba's simulator: no device arrays to type
        return
    from numba_cuda_mlir.numba_cuda.typing import typeof as mlir_typeof

    @mlir_typeof.typeof_impl.register(DeviceNDArrayBase)
    def _typeof_numba_cuda_array(val, c):
        return mlir_typeof._typeof_cuda_array_interface(
            val.__cuda_array_interface__, c, val.dtype)


def _install_fast_launch(marshaller) -> str:
    """numbax's C++ launch hook (csrc/fast_launch.h) on numba-cuda-mlir's
    configured launcher: after its first launch of a (configuration, device,
    argument types) plan, launches from func are packed in C++ (arrays as
    memrefs) and sent to cuLaunchKernel, as numba-cuda's are. What the plan
    builders below refuse goes through numba-cuda-mlir's launch."""
    from . import _core, _numba
    if _numba.simulator_enabled():
        return "; fast path off in the simulator"
    original = marshaller.__dict__.get("__call__")
    if original is None:
        return "; fast path off (its launcher has no __call__)"
    if type(original).__name__ != "LaunchHook":
        marshaller.__call__ = _core.make_launch_hook(
            original, _fast_check, _fast_plan)
    # NUMBAX_FAST_LAUNCH and fast_launch=False still apply, per call site.
    return "; fast path on"


def _marshaller_stream(cfg) -> int:
    stream = getattr(cfg, "_launch_stream", None)
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    try:
        return int(getattr(stream, "handle", stream))
    except Exception:  # noqa: BLE001 - an object numbax cannot read
        return 0


def _launch_is_plain(cfg) -> bool:
    """No launch-time machinery numbax would skip: extensions, planners,
    launch-config or literal specialisation, clusters, debug."""
    dispatcher = getattr(cfg, "_dispatcher", None)
    if dispatcher is None or getattr(cfg, "_extensions", None):
        return False
    if getattr(cfg, "_launch_config", None) is not None:
        return False
    config = getattr(cfg, "_available_launch_config", None) or {}
    if config.get("cluster") is not None:
        return False
    options = getattr(dispatcher, "targetoptions", {}) or {}
    if options.get("debug") or options.get("extensions"):
        return False
    if getattr(dispatcher, "_requires_launch_config", False) or getattr(
            dispatcher, "_literal_arg_positions", ()):
        return False
    descriptor = sys.modules.get(_DESCRIPTOR)
    planners = getattr(descriptor, "_planner_registry", None)
    return planners is not None and not planners.has_planners


def _fast_check(cfg, args, ours, device):
    """Before numba-cuda-mlir's first launch of a plan: may it be fast?
    (reason or None, remember the verdict, the launch's stream)."""
    del device
    from ._fast_launch import OTHER
    stream = _marshaller_stream(cfg)
    if not _launch_is_plain(cfg):
        return "unsupported_kernel", True, stream
    for value, slot in zip(args, ours):
        if slot == OTHER and type(value) not in _SCALARS:
            return "foreign_argument", True, stream
        if slot < OTHER:  # a view: its layout is numba-cuda's guess
            return "foreign_argument", True, stream
    return None, True, stream


# Scalars whose numba-cuda-mlir type depends on the Python type alone and
# whose parameter is an 8-byte word (or its low bytes): ints and floats.
_INTS = (int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
         np.uint32, np.uint64)
_SCALARS = frozenset(_INTS + (float, np.float32, np.float64))


def _scalar_packing(ty, value) -> str | None:
    from numba_cuda_mlir.numba_cuda import types
    if isinstance(ty, types.Integer) and type(value) in _INTS:  # type: ignore[attr-defined]  # numba-cuda-mlir's own typing
        return "i"
    if ty == types.float64 and type(value) in _SCALARS:
        return "d"
    if ty == types.float32 and type(value) in _SCALARS:
        return "f"
    return None


def _fast_plan(cfg, args, ours, device):
    """After numba-cuda-mlir's successful first launch: the plan tuple C++
    replays (fast_launch.cc, ParsePlan), or why it cannot."""
    del device
    from numba_cuda_mlir.numba_cuda import types
    from numba_cuda_mlir.numba_cuda.typing.typeof import typeof
    dispatcher = cfg._dispatcher
    try:
        argtypes = tuple(typeof(a) for a in args)
    except Exception:  # noqa: BLE001 - a value it types another way
        return "foreign_argument"
    # The overload its launch just chose: the first compiled one that takes
    # these types, in its overloads' order (descriptor.py, _compile_impl).
    reusable = getattr(dispatcher, "_can_reuse_overload", None)
    compiled = sig_args = None
    for candidate, result in tuple(dispatcher.overloads.items()):
        if reusable is not None and len(candidate) == len(argtypes) and all(
                reusable(s, r) for s, r in zip(candidate, argtypes)):
            compiled, sig_args = result, candidate
            break
    if compiled is None or sig_args is None:
        return "plan_error"  # its dispatch works otherwise: keep it
    metadata = getattr(compiled, "metadata", None) or {}
    if (metadata.get("cubin") is None or metadata.get("func_name") is None
            or _needs_its_loader(dispatcher, metadata)):
        return "unsupported_kernel"
    packing = []
    for ty, value, slot in zip(sig_args, args, ours):
        if slot >= 0:
            # Any layout: a memref carries its strides, numbax passes the
            # buffer's own (C-contiguous).
            if not isinstance(ty, types.Array) or ty.ndim != value.ndim:  # type: ignore[attr-defined]  # numba-cuda-mlir's own typing
                return "plan_error"
            packing.append("M")
            continue
        how = _scalar_packing(ty, value)
        if how is None:
            return "foreign_argument"
        packing.append(how)
    options = getattr(dispatcher, "targetoptions", {}) or {}
    kernel = _loadable(compiled, metadata["cubin"], metadata["func_name"],
                       _capability_of_chip(options.get("chip")) or (0, 0))
    if not kernel.loaded and _stream_capturing(_marshaller_stream(cfg)):
        # Loading the library is a driver call a capture must not see. A
        # capture-mode op's first call runs plainly, on another stream: its
        # plan loads the library, and plans recorded while capturing find it
        # loaded. Only a kernel first launched under capture stays on
        # numba-cuda-mlir's launch.
        return "plan_error"
    config = cfg._available_launch_config
    grid = tuple(int(v) for v in config["grid"])
    block = tuple(int(v) for v in config["block"])
    shared = config.get("sharedmem") or 0
    return (kernel.kernel_handle(), grid, block, int(shared),
            bool(getattr(compiled, "cooperative", False)), "".join(packing),
            (compiled, kernel), dispatcher.overloads, cfg._callbacks)


def _stream_capturing(stream: int) -> bool:
    try:
        from cuda.bindings import driver
        err, status = driver.cuStreamIsCapturing(driver.CUstream(stream))
        return int(err) != 0 or int(status) != 0
    except Exception:  # noqa: BLE001 - unsure: treat as capturing
        return True


def _same_stream(arg, launch_stream) -> bool:
    """Whether `arg`'s array-interface stream is the launch's stream."""
    if launch_stream is None or isinstance(launch_stream, bool):
        return False
    try:
        launch = int(launch_stream)
        stream = arg.__cuda_array_interface__.get("stream")
    except Exception:  # noqa: BLE001 - unknown objects: keep the sync
        return False
    # 1 and 2 name the legacy and per-thread default streams; 0 is not
    # allowed in the interface. A nonzero handle equal to the launch's is
    # the same stream.
    return stream is not None and stream not in (1, 2) and int(stream) == launch
