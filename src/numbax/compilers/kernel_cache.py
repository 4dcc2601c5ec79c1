"""numbax's entries in Numba's on-disk cache: a warm start without Numba.

Loading a kernel from Numba's cache (``@cuda.jit(cache=True)``) costs most
of a second in the first call of each process, nearly all of it
Numba initialising its CUDA target (``load_overload`` refreshes the target
context: every lowering registry, and a BLAS probe that imports SciPy),
before it reads the cached code. A ``numba_cuda_kernel`` op needs none of
that: it launches the kernel's cubin from C++, and neither does a plain
callable's fast launch (numba_cuda_launch.py). So when a ``numba_cuda_kernel``
compiles a kernel that Numba caches, or Numba compiles one for a launch
inside a plain callable's func, numbax writes an entry of its own beside
Numba's: the cubin Numba built (for the same
architecture, e.g. sm_90a), its entry point, the architecture, and the
fold analysis that ``jax.vmap`` reads. The generated kernels that fold a
vmapped call into one launch, which Numba cannot cache (they have no source
file), get entries there too, keyed by what generated them.

The entries live in the kernel's cache directory, in an index of numbax's
own (``<Numba's file name>.numbax.nbi`` and its ``.nbc`` data files, written
by Numba's own index class under a file lock, waited for at most
LOCK_WAIT_S; an index that is garbage is rebuilt), stamped with the kernel's
source file like Numba's index, so an edit of that file drops them. A key
holds numbax's entry format, what was compiled (the kernel or a generated
one) for which argument types and compiler options, the kernel's bytecode
hash and closure (Numba's own key), numba-cuda's and NVRTC's versions and
the architecture; each data file holds its key again and is used only when
they match. A later process finds the entry at trace time, checks that the
driver loads its cubin, and never asks Numba to compile or load: XLA's
instantiate stage takes the function from that library.

No entry is written for kernels that Numba sets up when loading them (NRT,
``link=`` files, referenced device arrays, numba-cuda's bfloat16 shims),
cooperative, launch-configuration-sensitive or debug kernels, kernels with
a shared-memory carveout or argument extensions, and closures (a kernel
made per call of a factory: its libraries would pile up, as a loaded
library is never unloaded; see CachedKernel). Like Numba's own, an entry is
not keyed by device functions the kernel calls from other files, nor by
globals it froze from other modules: after changing those, clear the cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import threading
import types
import weakref
from typing import Any

from .. import _version
from .cubin import CubinKernel

_log = logging.getLogger("numbax")
_lock = threading.RLock()
# Bumped when an entry's layout or meaning changes, the fold analysis
# stored in it included.
FORMAT = 1
# dispatcher -> {where: CachedKernel}: an entry is read and its library
# loaded once per dispatcher however often its ops are traced, and dropped
# with the dispatcher (a kernel redefined, a module reloaded, is another).
_loaded: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
# dispatcher -> {key}: entries known to exist on disk (has_entry, save).
_present: "weakref.WeakKeyDictionary[Any, set]" = weakref.WeakKeyDictionary()
# (cubin digest, entry point, capability) -> its loaded library, for every
# dispatcher, for the life of the process (a loaded library is never
# unloaded: CachedKernel): a kernel made by a factory on each call (not a closure: the
# same code) is a new dispatcher each time, and its code is loaded once, not
# once per call. Keyed by the code itself: equal entry keys do not mean
# equal code (a kernel reading a module global, the same in two modules).
_images: dict = {}


class CachedKernel:
    """A kernel as numbax's cache entry holds it: enough to launch it from
    C++ on devices of its compute capability, and to decide how vmap folds
    it. ``numba_kernel()`` compiles it through Numba after all (a device of
    another capability). Holds its dispatcher weakly.

    Its library is loaded once and never unloaded (cubin.CubinKernel):
    compiled XLA programs keep its functions for their lifetime, which
    numbax does not bound."""

    cooperative = False
    debug = False

    def __init__(self, image, capability: tuple, axes_read, why, target,
                 argtypes):
        self._image = image  # a CubinKernel, shared (_images)
        self.capability = capability
        self.axes_read = axes_read
        self.why = why
        self._target = weakref.ref(target)
        self._argtypes = argtypes
        self._numba: Any = None
        self._numba_lock = threading.Lock()

    def kernel_handle(self) -> int:
        return self._image.kernel_handle()

    def function_on(self, ordinal: int, shared_mem: int) -> int:
        return self._image.function_on(ordinal, shared_mem)

    def numba_kernel(self):
        """The kernel compiled through Numba (in the current context)."""
        with self._numba_lock:
            if self._numba is None:
                target = self._target()
                if target is None:
                    raise RuntimeError(
                        "numbax: the kernel behind a cached launch plan was "
                        "collected; trace the op again")
                self._numba = target.compile(self._argtypes)
            return self._numba


def cache_of(dispatcher):
    """The dispatcher's enabled Numba disk cache, or None where numbax keeps
    no entries for it."""
    try:
        from numba.cuda.dispatcher import CUDACache
    except Exception:  # noqa: BLE001 - another numba-cuda layout
        return None
    cache = getattr(dispatcher, "_cache", None)
    if not isinstance(cache, CUDACache) or not getattr(cache, "_enabled", False):
        return None
    if getattr(dispatcher, "_launch_config_sensitive", True):
        return None
    py_func = getattr(dispatcher, "py_func", None)
    if py_func is None or py_func.__closure__:
        return None
    options = getattr(dispatcher, "targetoptions", None) or {}
    if options.get("extensions") or options.get("link"):
        return None
    return cache


def current_capability() -> tuple:
    from numba import cuda
    return tuple(cuda.get_current_device().compute_capability)


def architecture(capability) -> tuple:
    """The target Numba compiles for on a device of `capability`
    (CUDACodeLibrary._ensure_cc: sm_90a and up are arch-specific)."""
    major, minor = capability[:2]
    return (major, minor, "a" if (major, minor) >= (9, 0) else "")


@functools.cache
def _toolkit_version() -> tuple:
    from numba.cuda.cudadrv import runtime
    return tuple(runtime.get_version())


class _Codegen:
    """What Numba's index key asks of a codegen: the target's description."""

    def __init__(self, arch):
        self._arch = arch

    def magic_tuple(self):
        return ("numbax", FORMAT, _toolkit_version(), self._arch)


def _constant_text(value) -> str:
    """A code constant as text that is the same in every process (a
    frozenset's order follows string hashing, randomised per process)."""
    if isinstance(value, (tuple, frozenset)):
        items = [_constant_text(v) for v in value]
        if isinstance(value, frozenset):
            items.sort()
        return f"{type(value).__name__}({', '.join(items)})"
    return f"{type(value).__name__}:{value!r}"


def code_digest(code) -> str:
    """A hash of a whole code object: bytecode, names, constants and nested
    code, where Numba's key hashes the bytecode alone (marshal's bytes are
    no use: they follow reference counts)."""
    h = hashlib.sha256()

    def feed(c):
        h.update(c.co_code)
        h.update(repr((c.co_names, c.co_varnames, c.co_freevars,
                       c.co_cellvars)).encode())
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                feed(const)
            else:
                h.update(_constant_text(const).encode())
    feed(code)
    return h.hexdigest()


def _key(dispatcher, cache, kind: tuple, argtypes, arch) -> tuple:
    options = sorted((k, repr(v)) for k, v in
                     (getattr(dispatcher, "targetoptions", None) or {}).items())
    what = repr((kind, tuple(str(t) for t in argtypes), options,
                 _version.__version__, code_digest(dispatcher.py_func.__code__)))
    digest = hashlib.sha256(what.encode()).hexdigest()
    # Numba's own key (bytecode and closure hashes, numba-cuda's version),
    # with numbax's codegen, and without the launch-configuration part
    # Numba may add while it compiles a sensitive kernel.
    key = cache._index_key(("numbax", digest), _Codegen(arch))
    return tuple(part for part in key
                 if not (isinstance(part, tuple) and part[:1] == ("launch_config",)))


def _index(cache):
    """numbax's own index beside Numba's, under the same source stamp."""
    from numba.cuda.core.caching import IndexDataCacheFile
    numba_index = cache._cache_file
    return IndexDataCacheFile(
        cache_path=cache.cache_path,
        filename_base=cache._impl.filename_base + ".numbax",
        source_stamp=numba_index._source_stamp)


#: Seconds a save waits for another process's lock on the index before it
#: skips writing (the kernel still runs; the entry is written another time).
LOCK_WAIT_S = 5.0
# How often the lock is tried meanwhile.
_LOCK_POLL_S = 0.02
# Lock files a save gave up on in this process: later saves try them once,
# without waiting again, until one gets the lock.
_busy_locks: set = set()
# Lock files warned about (once each per process).
_warned: set = set()


class _LockBusy(Exception):
    """Another process held the index's lock for LOCK_WAIT_S."""


def _lock_path(cache) -> str:
    return os.path.join(cache.cache_path,
                        cache._impl.filename_base + ".numbax.lock")


def _warn_once(what: str, message: str) -> None:
    if what not in _warned:
        _warned.add(what)
        _log.warning(message)


@contextlib.contextmanager
def _file_lock(cache):
    """Other processes writing the same index wait (the index is read,
    updated and rewritten per save, its data files numbered from it), for
    at most LOCK_WAIT_S: then _LockBusy (a process that holds the lock and
    never lets go must not stall every compile of the kernel)."""
    import fcntl
    import time
    path = _lock_path(cache)
    with open(path, "a") as f:
        wait = 0.0 if path in _busy_locks else max(0.0, float(LOCK_WAIT_S))
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    _busy_locks.add(path)
                    raise _LockBusy(path) from None
                time.sleep(min(_LOCK_POLL_S, left))
        _busy_locks.discard(path)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _readable_index(index) -> bool:
    """Whether numbax's index file is an index (missing, stale or of
    another Numba version counts: Numba's index class starts it anew)."""
    try:
        return isinstance(index._load_index(), dict)
    except OSError:
        raise  # unreadable, not garbage: the save fails as it would
    except Exception:  # noqa: BLE001 - garbage: unpickling fails any way
        return False


def load(dispatcher, kind: tuple, argtypes, target=None) -> CachedKernel | None:
    """numbax's entry for `dispatcher` compiled for `argtypes` (`kind`: ()
    for the kernel itself, else what generated the compiled kernel, then
    `target`, the generated dispatcher), or None. Its cubin is loaded
    here: an entry the driver refuses is a miss. Never raises."""
    cache = cache_of(dispatcher)
    if cache is None:
        return None
    try:
        capability = current_capability()
        arch = architecture(capability)
        key = _key(dispatcher, cache, kind, argtypes, arch)
        with _lock:
            memo = _loaded.setdefault(dispatcher, {})
            hit = memo.get(key)
            if hit is not None:
                if target is not None and hit._target() is None:
                    hit._target = weakref.ref(target)  # regenerated
                return hit
            data = _index(cache).load(key)
            if not (isinstance(data, dict) and data.get("format") == FORMAT
                    and data.get("key") == key
                    and isinstance(data.get("cubin"), bytes)
                    and isinstance(data.get("entry"), str)
                    and tuple(data.get("arch", ())) == arch):
                return None
            code = (hashlib.sha256(data["cubin"]).hexdigest(), data["entry"],
                    tuple(capability))
            image = _images.get(code)
            if image is None:
                image = CubinKernel(data["cubin"], data["entry"], capability,
                                    None)
                image.kernel_handle()  # refused by this driver: a miss
                _images[code] = image
            axes = data.get("axes_read")
            hit = CachedKernel(image, capability,
                               None if axes is None else frozenset(axes),
                               data.get("why"),
                               dispatcher if target is None else target,
                               argtypes)
            memo[key] = hit
            return hit
    except Exception as exc:  # noqa: BLE001 - a cache, never an error
        _log.debug("numbax: kernel cache not read: %s: %s",
                   type(exc).__name__, exc)
        return None


def has_entry(dispatcher, kind: tuple, argtypes) -> bool:
    """Whether numbax's entry for `dispatcher` compiled for `argtypes`
    exists, without loading its cubin. The disk is read once per key and
    dispatcher in a process (a func launching with a new configuration per
    call asks per launch). Never raises."""
    cache = cache_of(dispatcher)
    if cache is None:
        return False
    try:
        key_arch = architecture(current_capability())
        key = _key(dispatcher, cache, kind, argtypes, key_arch)
        with _lock:
            known = _present.setdefault(dispatcher, set())
            if key in known or key in _loaded.get(dispatcher, {}):
                return True
            data = _index(cache).load(key)
            found = (isinstance(data, dict) and data.get("key") == key
                     and data.get("format") == FORMAT
                     and tuple(data.get("arch", ())) == key_arch)
            if found:
                known.add(key)
            return found
    except Exception as exc:  # noqa: BLE001 - a cache, never an error
        _log.debug("numbax: kernel cache not read: %s: %s",
                   type(exc).__name__, exc)
        return False


def _name(dispatcher) -> str:
    func = getattr(dispatcher, "py_func", dispatcher)
    return (f"{getattr(func, '__module__', '?')}."
            f"{getattr(func, '__qualname__', repr(func))}")


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
    if getattr(compiled, "shared_memory_carveout", None) is not None:
        return "a shared-memory carveout (set by Numba when it loads)"
    if getattr(compiled, "extensions", None):
        return "argument extensions"
    if (getattr(library, "_setup_functions", None)
            or getattr(library, "_linking_files", None)
            or getattr(library, "referenced_objects", None)):
        return "set up by Numba when loaded"
    return None


def save(dispatcher, kind: tuple, argtypes, compiled, fold=None) -> bool:
    """Adds numbax's entry for `compiled` (what `dispatcher` compiled for
    `argtypes`, or a kernel generated from it: `kind`) beside `dispatcher`'s
    Numba cache; `fold()` gives the fold analysis (axes read, why not) to
    store. True if written. Never raises."""
    cache = cache_of(dispatcher)
    if cache is None or cachable_reason(compiled) is not None:
        return False
    try:
        capability = current_capability()
        library = compiled._codelibrary
        arch = library._ensure_cc(None)  # what Numba compiled and loaded
        if tuple(arch) != architecture(capability):
            return False
        cubin = library.get_cubin(cc=arch)  # Numba's own, already built
        # numba-cuda 0.30 returns cuda.core's ObjectCode; its code is bytes.
        cubin = getattr(cubin, "code", cubin)
        if isinstance(cubin, (bytearray, memoryview)):
            cubin = bytes(cubin)
        entry = library._entry_name
        if not isinstance(cubin, bytes) or not isinstance(entry, str):
            return False
        axes_read, why = fold() if fold is not None else (None, None)
        key = _key(dispatcher, cache, kind, argtypes, arch)
        data = {"format": FORMAT, "key": key, "cubin": cubin, "entry": entry,
                "arch": tuple(arch),
                "axes_read": None if axes_read is None else sorted(axes_read),
                "why": why}
        with _lock:
            cache._impl.locator.ensure_cache_path()
            with _file_lock(cache):
                index = _index(cache)
                if not _readable_index(index):
                    # Garbage (a crash mid-write by another tool, a disk
                    # error): every save failed on it, and no load hit,
                    # for good. Its entries are lost anyway: start anew.
                    _log.warning(
                        "numbax: the warm-start index of kernel %s, %s, was "
                        "not a readable index; rebuilt it (its earlier "
                        "entries are compiled again when needed)",
                        _name(dispatcher), index._index_path)
                    index._save_index({})
                index.save(key, data)
            _present.setdefault(dispatcher, set()).add(key)
        return True
    except _LockBusy as busy:
        _warn_once(str(busy), (
            f"numbax: kernel {_name(dispatcher)}: not writing its warm-start "
            f"entry: another process has held the cache's lock file {busy} "
            f"for more than {LOCK_WAIT_S:g} s "
            "(numbax.compilers.kernel_cache.LOCK_WAIT_S). The kernel still runs, "
            "compiled by Numba; this process tries again at its next save "
            "without waiting. If that process is stuck, stop it, or give "
            "this one a cache of its own with NUMBA_CACHE_DIR "
            "(docs/warm_start.md)"))
        return False
    except Exception as exc:  # noqa: BLE001 - a cache, never an error
        _log.debug("numbax: kernel cache not written: %s: %s",
                   type(exc).__name__, exc)
        return False
