"""numba-cuda-mlir launches inside a numba_cuda_callable (numba_cuda_mlir.py
has the compiler itself).

func may pass numbax's ``stream`` to a numba-cuda-mlir launch:
:func:`install_launch_bridge` makes such launches accept numba-cuda's
stream, skips the host synchronisation numba-cuda-mlir makes before each
launch when the arrays already live on the launch's stream, and puts
numbax's C++ launch hook (``csrc/fast_launch.h``) on its configured
launcher, with the plan builders it asks (:func:`_fast_check`,
:func:`_fast_plan`). Nothing here imports ``numba_cuda_mlir`` unless the
user did. What it needs of the compiler (numba_cuda_mlir.py) comes in as a
:class:`Needs`, so the two modules do not import each other (as
numba_cuda_launch.py needs nothing of numba_cuda.py).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, NamedTuple

from .. import _core
from ..runtime import numba_bridge
from .base import FLOATS, INTS, OTHER


class Needs(NamedTuple):
    """What the bridge needs of numba_cuda_mlir.py, handed in by it."""

    descriptor: str  # the module numba-cuda-mlir's dispatcher lives in
    version: Callable[[], str | None]
    verified: Callable[[str | None], bool]
    needs_its_loader: Callable[[Any, dict], str | None]
    loadable: Callable[..., Any]
    capability_of_chip: Callable[[str | None], tuple[int, int] | None]


# Set by the first install_launch_bridge, read by the plan builders it
# installs (which run only after it).
_needs: Needs | None = None

_bridge_lock = threading.Lock()
_bridge_note = "not installed"
_bridge_done = False  # decided (installed, or found unverified) once
# The stream of the numba-cuda-mlir launch this thread is making (as an
# int), read by the array-interface sync below.
_launching = threading.local()


def _stream_int(stream) -> Any:
    """numba-cuda's Stream objects (numbax's stream is one) as their raw
    handle, which numba-cuda-mlir's launcher accepts; anything else as is."""
    if stream is None or type(stream) is int:
        return stream
    numba_driver = sys.modules.get("numba.cuda.cudadrv.driver")
    cls = getattr(numba_driver, "Stream", None)
    if isinstance(cls, type) and isinstance(stream, cls):
        handle = getattr(stream, "handle", None)
        return int(handle) if handle is not None else 0
    return stream


# numba-cuda-mlir's configure normalises the dimensions, builds and checks
# its cache key and takes a lock before its cache answers: microseconds of
# Python, paid by every `kernel[grid, block, stream]` in func (about 15
# times numba-cuda's). numbax answers repeats first, from the same
# arguments, for a launcher its cache still holds under the key it filed it
# by. The front key has all its key is made of: the arguments as given (the
# normalisation is a function of them), the dispatcher's extensions (by
# identity, as its key) and whether launch configurations are enabled.
_FRONT_ATTR = "_numbax_configured"
_FRONT_SIZE = 64


def _front_key(dispatcher, griddim, blockdim, stream, sharedmem, cluster):
    try:
        return (griddim, blockdim, stream, sharedmem, cluster,
                tuple(map(id, dispatcher.extensions)),
                bool(dispatcher._launch_config_enabled))
    except Exception:  # noqa: BLE001 - an unusual dispatcher: no front cache
        return None


def _configured(dispatcher) -> dict:
    front = dispatcher.__dict__.get(_FRONT_ATTR)
    if front is None:
        front = dispatcher.__dict__.setdefault(_FRONT_ATTR, {})
    return front


def _file_front(dispatcher, front, marshaller) -> None:
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


def install_launch_bridge(needs: Needs) -> str:
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
    global _bridge_note, _bridge_done, _needs
    if _bridge_done:  # called on every trace of a callable: stay cheap
        return _bridge_note
    _needs = needs
    descriptor = sys.modules.get(needs.descriptor)
    if descriptor is None:
        return "off until numba_cuda_mlir is imported"
    with _bridge_lock:
        if _bridge_done:
            return _bridge_note
        _bridge_done = True
        dispatcher_cls = descriptor.MLIRDispatcher
        found = needs.version()
        if not needs.verified(found):
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
                try:
                    hit = _configured(self).get(front)
                except TypeError:  # unhashable dimensions: no front cache
                    front = hit = None
                # Still the launcher numba-cuda-mlir's own cache holds for
                # these arguments: what its configure would return.
                if hit is not None and self._configure_cache.get(hit[0]) is hit[1]:
                    return hit[1]
            marshaller = original_configure(self, griddim, blockdim, stream,
                                            sharedmem, cluster)
            if front is not None:
                _file_front(self, front, marshaller)
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
    if numba_bridge.simulator_enabled():
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
    assert _needs is not None  # the bridge that installed this set it
    descriptor = sys.modules.get(_needs.descriptor)
    planners = getattr(descriptor, "_planner_registry", None)
    return planners is not None and not planners.has_planners


def _fast_check(cfg, args, ours, device):
    """Before numba-cuda-mlir's first launch of a plan: may it be fast?
    (reason or None, remember the verdict, the launch's stream)."""
    del device
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
# whose parameter is an 8-byte word (or its low bytes): ints and floats,
# grouped as for numba-cuda's fast path (base.py).
_SCALARS = frozenset(INTS + FLOATS)


def _scalar_packing(ty, value) -> str | None:
    from numba_cuda_mlir.numba_cuda import types
    if isinstance(ty, types.Integer) and type(value) in INTS:  # type: ignore[attr-defined]  # numba-cuda-mlir's own typing
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
            or _needs is None or _needs.needs_its_loader(dispatcher, metadata)):
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
    kernel = _needs.loadable(
        compiled, metadata["cubin"], metadata["func_name"],
        _needs.capability_of_chip(options.get("chip")) or (0, 0))
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
