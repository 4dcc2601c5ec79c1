"""numbax's entries in Numba's on-disk cache: a warm start without Numba.

Loading a kernel from Numba's cache (``@cuda.jit(cache=True)``) costs about
0.7 s in the first call of each process on an H200 host, nearly all of it
Numba initialising its CUDA target (``load_overload`` refreshes the target
context: every lowering registry, and a BLAS probe that imports SciPy),
before it reads the cached code. A ``numba_cuda_kernel`` op needs none of
that: it launches the kernel's cubin from C++. So when a
``numba_cuda_kernel`` compiles a kernel that Numba caches, numbax adds an
entry of its own to that kernel's cache, through Numba's cache object (same
directory, same index, invalidated with it when the kernel's source file
changes): the cubin, its entry point, the compute capability, and the
fold analysis that ``jax.vmap`` reads. The generated kernels that fold a
vmapped call into one launch, which Numba cannot cache (they have no source
file), get entries there too, keyed by what generated them.

A later process finds the entry at trace time and never asks Numba to
compile or load: the kernel's library is loaded through the driver when
XLA instantiates the program. Kernels that Numba would set up when loading
(NRT, linked files, referenced device arrays), cooperative,
launch-configuration-sensitive or debug kernels get no entry and go
through Numba as before. Like Numba's own, an entry is keyed by the
kernel's bytecode and closure, not by the device functions it calls from
other files: after changing those, clear Numba's cache (``NUMBA_CACHE_DIR``
or the ``__pycache__`` next to the kernel's file).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Callable

from . import _version

_log = logging.getLogger("numbax")
# Numba's index file is read, updated and rewritten per save.
_lock = threading.Lock()
# Bumped when an entry's layout or meaning changes.
FORMAT = 1
# Entries read in this process, by where and under which key: each loads
# its library once (a library is never unloaded, see CachedKernel), however
# often programs using it are traced.
_loaded: dict = {}


class CachedKernel:
    """A kernel as numbax's cache entry holds it: enough to launch it from
    C++ on devices of its compute capability, and to decide how vmap folds
    it. ``numba_kernel()`` compiles it through Numba after all (a device of
    another capability)."""

    cooperative = False
    debug = False

    def __init__(self, cubin: bytes, entry: str, capability: tuple,
                 axes_read, why, recompile: Callable[[], Any]):
        from . import _mlir
        # numba-cuda-mlir's compiled kernel loads a cubin the same way:
        # once per process, as a context-independent library.
        self._image = _mlir.CompiledKernel(cubin, entry, capability, None)
        self.capability = capability
        self.axes_read = axes_read
        self.why = why
        self._recompile = recompile
        self._numba: Any = None
        self._numba_lock = threading.Lock()

    def kernel_handle(self) -> int:
        return self._image.kernel_handle()

    def numba_kernel(self):
        with self._numba_lock:
            if self._numba is None:
                self._numba = self._recompile()
            return self._numba


class _Codegen:
    """What Numba's index key asks of a codegen: the target's description
    (numbax's entries are for one compute capability)."""

    def __init__(self, capability):
        self._capability = capability

    def magic_tuple(self):
        return ("numbax", FORMAT, self._capability)


def cache_of(dispatcher):
    """The dispatcher's enabled Numba disk cache, or None."""
    try:
        from numba.cuda.dispatcher import CUDACache
    except Exception:  # noqa: BLE001 - another numba-cuda layout
        return None
    cache = getattr(dispatcher, "_cache", None)
    if not isinstance(cache, CUDACache) or not getattr(cache, "_enabled", False):
        return None
    if getattr(dispatcher, "_launch_config_sensitive", True):
        return None
    return cache


def current_capability():
    from numba import cuda
    return tuple(cuda.get_current_device().compute_capability)


def _key(dispatcher, cache, kind: tuple, argtypes, capability) -> tuple:
    options = sorted((k, repr(v)) for k, v in
                     (getattr(dispatcher, "targetoptions", None) or {}).items())
    what = repr((kind, tuple(str(t) for t in argtypes), options,
                 _version.__version__))
    digest = hashlib.sha256(what.encode()).hexdigest()
    # Numba's own key: the kernel's bytecode and closure hashes, numba-cuda's
    # version, and our 'codegen' in place of its own.
    return cache._index_key(("numbax", digest), _Codegen(capability))


def load(dispatcher, kind: tuple, argtypes,
         recompile: Callable[[], Any]) -> CachedKernel | None:
    """numbax's entry for `dispatcher` compiled for `argtypes` (`kind`: ()
    for the kernel itself, else what generated the compiled kernel), or
    None. Never raises."""
    cache = cache_of(dispatcher)
    if cache is None:
        return None
    try:
        capability = current_capability()
        key = _key(dispatcher, cache, kind, argtypes, capability)
        where = (cache.cache_path, cache._cache_file._index_name, key)
        with _lock:
            hit = _loaded.get(where)
            if hit is not None:
                return hit
            data = cache._cache_file.load(key)
            if not (isinstance(data, dict) and data.get("format") == FORMAT
                    and isinstance(data.get("cubin"), bytes)
                    and isinstance(data.get("entry"), str)
                    and tuple(data.get("capability", ())) == capability):
                return None
            axes = data.get("axes_read")
            hit = CachedKernel(data["cubin"], data["entry"], capability,
                               None if axes is None else frozenset(axes),
                               data.get("why"), recompile)
            _loaded[where] = hit
            return hit
    except Exception as exc:  # noqa: BLE001 - a cache, never an error
        _log.debug("numbax: kernel cache not read: %s: %s",
                   type(exc).__name__, exc)
        return None


def cachable_reason(compiled) -> str | None:
    """None if `compiled` (a Numba kernel) can launch from its cubin alone,
    else why not."""
    library = getattr(compiled, "_codelibrary", None)
    if library is None:
        return "no code library"
    if getattr(compiled, "cooperative", False):
        return "cooperative"
    if getattr(compiled, "debug", False):
        return "debug"
    if getattr(compiled, "launch_config_sensitive", False):
        return "launch-configuration sensitive"
    if (getattr(library, "_setup_functions", None)
            or getattr(library, "_linking_files", None)
            or getattr(library, "referenced_objects", None)):
        return "set up by Numba when loaded"
    return None


def save(dispatcher, kind: tuple, argtypes, compiled, axes_read=None,
         why=None) -> bool:
    """Adds numbax's entry for `compiled` (what `dispatcher` compiled for
    `argtypes`, or a kernel generated from it: `kind`) to `dispatcher`'s
    Numba cache. True if written. Never raises."""
    cache = cache_of(dispatcher)
    if cache is None or cachable_reason(compiled) is not None:
        return False
    try:
        capability = current_capability()
        library = compiled._codelibrary
        cubin = library.get_cubin(cc=capability)
        # numba-cuda 0.30 returns cuda.core's ObjectCode; its code is bytes.
        cubin = getattr(cubin, "code", cubin)
        if isinstance(cubin, (bytearray, memoryview)):
            cubin = bytes(cubin)
        entry = library._entry_name
        if not isinstance(cubin, bytes) or not isinstance(entry, str):
            return False
        data = {"format": FORMAT, "cubin": cubin, "entry": entry,
                "capability": capability,
                "axes_read": None if axes_read is None else sorted(axes_read),
                "why": why}
        key = _key(dispatcher, cache, kind, argtypes, capability)
        with _lock:
            cache._impl.locator.ensure_cache_path()
            cache._cache_file.save(key, data)
        return True
    except Exception as exc:  # noqa: BLE001 - a cache, never an error
        _log.debug("numbax: kernel cache not written: %s: %s",
                   type(exc).__name__, exc)
        return False
