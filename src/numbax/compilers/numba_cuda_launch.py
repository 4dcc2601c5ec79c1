"""Kernel launches made by a plain callable's func, at C++ speed.

Numba's ``kernel[grid, block, stream](*args)`` costs about 20 us in Python on
every call: typing the arguments, packing them, and the driver call through
cuda.core. numbax replaces ``_LaunchConfiguration.__call__`` (the configured
launcher) with a C++ hook (csrc/fast_launch.h). While numbax runs a func on a
thread, a launch from that thread on the stream numbax gave func, whose
arguments are arrays numbax handed to func and plain scalars, is packed in
C++ and sent to ``cuLaunchKernel`` from a plan recorded per (configuration,
device, argument types). Everything else goes to Numba's own launch,
unchanged: launches outside numbax calls, from other threads, on other
streams, with other arguments, and the first launch of each plan, which
Numba types, compiles and launches itself before numbax records what it did
(where the kernel has ``cache=True`` and numbax's entry in its cache holds
the code for these argument types, that first launch is built from the
entry instead, without Numba: _cached_plan, kernel_cache.py).

The functions here build those plans; they run once per plan, never per
launch. The hook is installed only on numba-cuda versions whose launch path
numbax was checked against (``VERIFIED``).
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import weakref
from typing import Any

from .. import _core
from ..runtime import compat, env, numba_bridge
from . import grid_reads, kernel_cache, signatures
from .base import (BOOLS, COMPLEX, INTS, OTHER, SCALAR_TYPES,
                   VIEW_LAYOUTS)

# numba-cuda releases whose launch path (CUDADispatcher.call,
# _Kernel.launch, _Kernel._prepare_args) the fast path reproduces.
VERIFIED = ((0, 30),)

_log = logging.getLogger("numbax")
_installed = False
_note = "not installed yet (no numbax op created)"
_install_lock = threading.Lock()



def numba_cuda_version() -> str | None:
    return compat.dist_version("numba-cuda")


def _verified(version: str | None) -> bool:
    return compat.release(version)[:2] in VERIFIED


def _launch_path_matches() -> str | None:
    """None if numba-cuda's launch path has the shape numbax relies on, else
    what differs."""
    try:
        from numba.cuda import dispatcher
        from numba.cuda.cext import _dispatcher
    except Exception as exc:
        return f"cannot import numba.cuda.dispatcher ({exc})"
    cfg = getattr(dispatcher, "_LaunchConfiguration", None)
    if cfg is None or not inspect.isfunction(cfg.__dict__.get("__call__")):
        return "_LaunchConfiguration.__call__ is missing"
    call = getattr(dispatcher.CUDADispatcher, "call", None)
    if call is None:
        return "CUDADispatcher.call is missing"
    try:
        params = list(inspect.signature(call).parameters)
    except (TypeError, ValueError):
        params = []
    if params != ["self", "args", "launch_config"]:
        return "CUDADispatcher.call has another signature"
    if not hasattr(_dispatcher.Dispatcher, "_cuda_call") or not hasattr(
            dispatcher, "_LAUNCH_CONFIG_KW"):
        return "the dispatcher's _cuda_call is missing"
    return None


def _is_configure_hook(obj) -> bool:
    kind = type(obj)
    return (kind.__module__, kind.__qualname__) == ("numbax._core",
                                                     "ConfigureHook")


def _configure_path_matches() -> bool:
    """True if CUDADispatcher.__getitem__ is Numba's `self.configure(*key)`
    over an lru_cache (what the configure hook calls directly): its
    parameters, the names it uses (a length check, ValueError, configure:
    nothing else), and plain attribute lookup on the class."""
    try:
        from numba.cuda import dispatcher
        cls = dispatcher.CUDADispatcher
        getitem = cls.__dict__.get("__getitem__")
        configure = cls.__dict__.get("configure")
        if _is_configure_hook(getitem):
            return True
        return (inspect.isfunction(getitem)
                and list(inspect.signature(getitem).parameters)
                == ["self", "args"]
                and set(getitem.__code__.co_names)
                == {"len", "ValueError", "configure"}
                and cls.__getattribute__ is object.__getattribute__
                and callable(configure) and hasattr(configure, "cache_info")
                and inspect.isfunction(getattr(configure, "__wrapped__", None))
                and list(inspect.signature(configure.__wrapped__).parameters)
                == ["self", "griddim", "blockdim", "stream", "sharedmem"])
    except Exception:  # noqa: BLE001 - then Numba's own __getitem__ stays
        return False


def install() -> None:
    """Installs the launch hook once (when the first numbax op is created).
    In the simulator it only counts launches. Never raises: without the
    hook every launch goes through Numba, as before."""
    global _installed, _note
    if _installed:
        return
    with _install_lock:  # ops created on several threads at once
        if _installed:
            return
        try:
            _install()
        except Exception as exc:  # noqa: BLE001 - an optimisation only
            _installed = True
            _note = (f"off: the launch hook could not be installed "
                     f"({type(exc).__name__}: {exc})")


def _install() -> None:
    global _installed, _note
    version = numba_cuda_version()
    if numba_bridge.simulator_enabled():
        _install_simulator_counter()
        _installed = True
        _note = ("off in Numba's CUDA simulator: launches run there and are "
                 "counted as fallback_simulator")
        return
    if not _verified(version):
        _installed = True
        _note = (f"off: numba-cuda {version} is not verified (0.30.x is); "
                 "func's launches go through Numba")
        return
    mismatch = _launch_path_matches()
    if mismatch is not None:
        _installed = True
        _note = f"off: numba-cuda {version}'s launch path differs ({mismatch})"
        return
    from numba.cuda import dispatcher
    cls = dispatcher._LaunchConfiguration
    original = cls.__dict__["__call__"]
    if type(original).__name__ != "LaunchHook":  # never wrap a hook again
        cls.__call__ = _core.make_launch_hook(original, _check, _plan,
                                              _cached_plan)
    _installed = True
    _note = f"on (numba-cuda {version})"
    # `kernel[grid, block, stream]` without Numba's Python frame: the same
    # lru_cache call (csrc/configure_hook.h). Its failure leaves Numba's
    # __getitem__, and the launch hook, as they are.
    disp = dispatcher.CUDADispatcher
    getitem = disp.__dict__.get("__getitem__")
    if _configure_path_matches() and not _is_configure_hook(getitem):
        try:
            disp.__getitem__ = _core.make_configure_hook(
                getitem, disp.__dict__["configure"], disp)
        except Exception as exc:  # noqa: BLE001 - an optimisation only
            _log.warning("numbax: Numba's configuration step stays in "
                         "Python (%s: %s)", type(exc).__name__, exc)


def configure_hook_installed() -> bool:
    """True when ``kernel[grid, block, stream]`` goes through numbax's
    configure hook (Numba's configure, called without its Python frame)."""
    try:
        from numba.cuda import dispatcher
        getitem = dispatcher.CUDADispatcher.__dict__.get("__getitem__")
    except Exception:  # noqa: BLE001
        return False
    return _is_configure_hook(getitem)


def hook_installed() -> bool:
    """True when Numba's configured launches go through numbax's hook."""
    try:
        from numba.cuda import dispatcher
        call = dispatcher._LaunchConfiguration.__dict__.get("__call__")
    except Exception:
        return False
    return type(call).__name__ == "LaunchHook"


def status() -> str:
    """One line for ``python -m numbax info``: is the fast path on, and if
    not, why."""
    if numba_bridge.simulator_enabled():
        return ("off in Numba's CUDA simulator (launches run there, counted "
                "as fallback_simulator)")
    version = numba_cuda_version()
    if not _verified(version):
        return (f"off: numba-cuda {version} is not verified (0.30.x is); "
                "func's launches go through Numba")
    if _installed and not hook_installed():
        return _note
    if not env.fast_launch_enabled():
        return (f"off: {env.FAST_LAUNCH_ENV}="
                f"{os.environ.get(env.FAST_LAUNCH_ENV)}")
    return f"on (numba-cuda {version})"


def _install_simulator_counter() -> None:
    try:
        from numba.cuda.simulator import kernel as sim
    except Exception:
        return
    cls = sim.FakeCUDAKernel
    original = cls.__call__
    if getattr(original, "__numbax_counter__", False):
        return

    def __call__(self, *args):
        # Device functions, and calls made while a kernel runs, are not
        # launches.
        if not self._device and sim._kernel_context is None:
            _core.note_simulator_launch()
            # Views of numbax's read-only inputs, passed without the copy
            # back Numba's simulator makes of numpy arguments (numba_bridge.py).
            args = numba_bridge.simulator_launch_args(args)
        return original(self, *args)

    __call__.__numbax_counter__ = True  # type: ignore[attr-defined]
    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    cls.__call__ = __call__


def _stream_handle(cfg) -> int:
    try:
        return int(cfg.stream.handle)
    except Exception:
        return 0


def _check(cfg, args, ours, device):
    """Before Numba's first launch of a new key: may it be fast?

    Returns (reason or None, whether to remember the verdict, the
    configuration's stream handle)."""
    del device
    stream = _stream_handle(cfg)
    if getattr(cfg, "pre_launch_callbacks", None):
        return "unsupported_kernel", False, stream
    dispatcher = cfg.dispatcher
    options = getattr(dispatcher, "targetoptions", {}) or {}
    if (options.get("debug") or options.get("extensions")
            or getattr(dispatcher, "_launch_config_sensitive", True)):
        return "unsupported_kernel", True, stream
    for value, slot in zip(args, ours):
        if slot == OTHER and type(value) not in SCALAR_TYPES:
            return "foreign_argument", True, stream
    return None, True, stream


def _scalar_packing(ty, value) -> str | None:
    """How C++ packs `value` for a kernel parameter of Numba type `ty`, or
    None where the fast path does not reproduce Numba's packing."""
    from numba.cuda import types
    kind = type(value)
    if ty == types.boolean:
        if kind in BOOLS:
            return "b"
        # Numba hands the value to cuda.core as it is: an int is packed at
        # its own width and the kernel reads its low byte.
        return "i" if kind in INTS else None
    if isinstance(ty, types.Integer):
        return "i" if kind in INTS or kind in BOOLS else None
    if ty == types.float32 or ty == types.float64:
        if kind in COMPLEX:
            return None  # ctypes refuses it: Numba raises
        return "f" if ty == types.float32 else "d"
    if ty == types.complex64:
        return "c"
    if ty == types.complex128:
        return "z"
    return None  # float16, pointers, records, tuples, enums, datetimes


def _plan(cfg, args, ours, device):
    """After Numba's successful first launch: what it launched, as a plan
    tuple for C++, or the reason it cannot be replayed."""
    del device  # the plan is keyed by it; the current context is that device
    from numba.cuda import dispatcher as nd
    from numba.cuda.cext import _dispatcher

    dispatcher = cfg.dispatcher
    if dispatcher._launch_config_sensitive:
        return "unsupported_kernel"
    if dispatcher.specialized:
        kernel = next(iter(dispatcher.overloads.values()))
    else:
        # The same resolution Numba's launch just made (now an exact hit).
        kernel = _dispatcher.Dispatcher._cuda_call(
            dispatcher, *args, **{nd._LAUNCH_CONFIG_KW: cfg})
    if (kernel.debug or kernel.extensions
            or getattr(kernel, "launch_config_sensitive", False)):
        return "unsupported_kernel"
    argtypes = tuple(kernel.argument_types)
    if len(argtypes) != len(args):
        return "unsupported_kernel"
    # A dispatcher compiled for one signature launches it on any arrays,
    # unchecked (float64 code on float32 buffers). Numba keeps launching
    # those itself; numbax replays only launches whose arrays the version
    # takes by Numba's own conversion rules (signatures.py).
    for ty, value, slot in zip(argtypes, args, ours):
        if slot != OTHER and signatures.conversion(
                dispatcher.typingctx, value._numba_type_, ty) is None:
            return "signature_mismatch"
    packing, refused = _packing(argtypes, args, ours)
    if refused is not None:
        return refused
    # The entry the next process's first launch is built from. It reads the
    # current device and writes files; like the rest here it launches and
    # loads nothing, which a graph being recorded would not allow.
    _save_cache_entry(dispatcher, argtypes, args, kernel)
    # The current context is the device numbax bound for this call, the one
    # Numba just launched on. Its handle is the CUkernel Numba launches
    # (through cuda.core); C++ swaps it for that context's CUfunction unless
    # the stream is being captured (fast_launch.cc, ResolveFunction).
    cufunc = kernel._codelibrary.get_cufunc()
    return _plan_tuple(cfg, int(cufunc.handle), bool(kernel.cooperative),
                       packing, kernel)


def _packing(argtypes, args, ours) -> tuple[str, str | None]:
    """(per argument, how C++ packs it for a kernel compiled for `argtypes`
    (fast_launch.cc's Plan::packing), None), or ("", the fallback reason
    why it cannot)."""
    from numba.cuda import types
    packing = []
    for ty, value, slot in zip(argtypes, args, ours):
        if slot != OTHER:
            # The array's Numba type must be what C++ keyed it as: numbax's
            # own arrays are C-contiguous, views have the layout C++
            # computed. A disagreement keeps the key off the fast path.
            layout = "C" if slot >= 0 else VIEW_LAYOUTS.get(slot)
            if (not isinstance(ty, types.Array) or ty.ndim != value.ndim
                    or value._numba_type_.layout != layout):
                return "", "plan_error"
            packing.append("A")
            continue
        how = _scalar_packing(ty, value)
        if how is None:
            return "", "foreign_argument"
        packing.append(how)
    return "".join(packing), None


def _plan_tuple(cfg, function: int, cooperative: bool, packing: str, keep):
    """The plan as C++ reads it (fast_launch.cc, ParsePlan)."""
    grid = tuple(int(v) for v in cfg.griddim)
    block = tuple(int(v) for v in cfg.blockdim)
    return (function, grid, block, int(cfg.sharedmem or 0), cooperative,
            packing, keep, cfg.dispatcher.overloads, cfg.pre_launch_callbacks)


# Dynamic shared memory a kernel may take without an attribute set on its
# function (cuFuncSetAttribute): what a launch from a cached plan, which
# Numba never prepared, may ask for.
_DEFAULT_DYNAMIC_SHARED = 48 * 1024


def _exact_types(dispatcher, args):
    """The types Numba's dispatch types `args` as (and compiles for, where
    the dispatcher has no overload yet)."""
    return tuple(dispatcher.typeof_pyval(a) for a in args)


def _cached_plan(cfg, args, ours, device):
    """A launch no plan covers yet, which _check let through, on a stream
    not being captured: a plan from numbax's entry in the kernel's Numba
    cache (kernel_cache.py), so the first launch in a process skips Numba's
    load (0.6 s, most of it Numba initialising its CUDA target). None
    where Numba's dispatch could pick something else, or no entry exists:
    Numba launches, and _plan records what it did (and writes the entry)."""
    del device  # the entry is per architecture; the context is the device's
    dispatcher = cfg.dispatcher
    # A dispatcher that may compile launches code for the exact types of
    # the arguments (Numba requires an exact match then, and compiles one
    # when it has none); one that may not (explicit signatures) picks among
    # its overloads by conversion rules: Numba's choice.
    if (getattr(dispatcher, "specialized", False)
            or not getattr(dispatcher, "_can_compile", False)):
        return None
    # More dynamic shared memory needs the function's limit raised
    # (cuFuncSetAttribute), which a user sets on Numba's function, not on
    # numbax's copy of the code.
    if int(cfg.sharedmem or 0) > _DEFAULT_DYNAMIC_SHARED:
        return None
    if kernel_cache.cache_of(dispatcher) is None:
        return None
    argtypes = _exact_types(dispatcher, args)
    if argtypes in dispatcher.overloads:
        return None  # Numba has it in this process: its own, as recorded
    cached = kernel_cache.load(dispatcher, (), argtypes)
    if cached is None:
        return None
    packing, refused = _packing(argtypes, args, ours)
    if refused is not None:
        return None
    return _plan_tuple(cfg, cached.kernel_handle(), False, packing, cached)


# dispatcher -> {(argument types, compute capability)}: what _save_cache_entry has
# already handled in this process, written or not. A func that makes a new
# launch configuration per call records a new plan per call; this keeps
# each of those from reading the cache's index again.
_remembered: "weakref.WeakKeyDictionary[Any, set]" = weakref.WeakKeyDictionary()


def _save_cache_entry(dispatcher, argtypes, args, kernel) -> None:
    """After Numba compiled or loaded `kernel` for the exact types of
    `args`: numbax's cache entry for it, unless one exists (the next
    process's _cached_plan reads it; so does a numba_cuda_kernel op).
    The entry holds what Numba produced: the code it loaded from its own
    cache where it did (Numba's key leaves out compiler options)."""
    try:
        if (getattr(dispatcher, "specialized", False)
                or kernel_cache.cache_of(dispatcher) is None):
            return
        seen = _remembered.setdefault(dispatcher, set())
        what = (argtypes, kernel_cache.current_capability())
        if what in seen:
            return
        seen.add(what)
        if (kernel_cache.cachable_reason(kernel) is not None
                or argtypes != _exact_types(dispatcher, args)
                or kernel_cache.has_entry(dispatcher, (), argtypes)):
            return
        kernel_cache.save(dispatcher, (), argtypes, kernel,
                           lambda: grid_reads.axes_read_by_library(kernel))
    except Exception as exc:  # noqa: BLE001 - a cache: the plan stands
        _log.debug("numbax: no cache entry for a launch in func: %s: %s",
                   type(exc).__name__, exc)
