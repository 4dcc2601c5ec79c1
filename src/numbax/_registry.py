"""Stable keys for user functions, and the one-time FFI target registration.

A compiled program names the Python function (or kernel) it calls by a
string key built from the function's module, qualified name and call
signature: no pointer, id or counter of this process. Running the program in
another process works once the same op has been created there.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import jax

from . import _core, _fast_launch, _guard, _numba

CALLABLE_TARGET = "numbax_callable"
CAPTURE_TARGET = "numbax_callable_capture"
KERNEL_TARGET = "numbax_kernel"
# The same handlers under the names of calls declared batch-partitionable
# (numba_cuda_callable(..., batch_partitionable=True)): XLA registers these
# names as partitionable along their leading axis, so they need their own.
CALLABLE_BATCH_TARGET = "numbax_callable_batch"
CAPTURE_BATCH_TARGET = "numbax_callable_capture_batch"
BATCH_TARGETS = {CALLABLE_TARGET: CALLABLE_BATCH_TARGET,
                 CAPTURE_TARGET: CAPTURE_BATCH_TARGET}
ALL_TARGETS = (CALLABLE_TARGET, CAPTURE_TARGET, KERNEL_TARGET,
               CALLABLE_BATCH_TARGET, CAPTURE_BATCH_TARGET)

_lock = threading.RLock()
_targets_registered = False
_platforms_registered: set = set()
_hooks_installed = False
_batch_declared = False
_log = logging.getLogger("numbax")


def _install_python_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _core.set_python_hooks(
        resolve=_resolve_callable,
        device_array=_numba.device_array_hook,
        host_array=_numba.host_array_hook,
        device_stream=_numba.device_stream_hook,
        host_stream=_numba.host_stream_hook,
        format_exception=_numba.format_exception_hook,
    )
    _core.set_kernel_resolver(_resolve_kernel)
    # JAX refuses calls made from inside a func XLA is running.
    _guard.install()
    # At exit, before Python finalises (and before JAX's own atexit clean-up,
    # registered earlier), handlers stop running Python and those in flight
    # finish: a thread that waits for the GIL during finalisation is ended
    # in a way that aborts the process.
    atexit.register(_core.prepare_for_exit)
    _hooks_installed = True


def _register_platform(platform: str) -> None:
    """Registers the state types, then the targets, of one platform (once).

    Called with _lock held, once that platform's backend has started: a
    backend that starts later registers pending FFI targets before pending
    types, and refuses handlers whose state types it has not seen yet.
    """
    global _batch_declared
    if platform in _platforms_registered:
        return
    _install_python_hooks()
    callable_handlers = _core.callable_handlers()
    site_types = _core.call_site_types()
    if platform == "cpu":
        jax.ffi.register_ffi_type(
            "numbax.CpuCallSite", site_types["cpu"], platform="cpu")
        # The simulator has no graphs: capture mode runs plainly on the CPU.
        for target in (CALLABLE_TARGET, CAPTURE_TARGET, CALLABLE_BATCH_TARGET,
                       CAPTURE_BATCH_TARGET):
            jax.ffi.register_ffi_target(
                target, callable_handlers["cpu"], platform="cpu")
    else:
        jax.ffi.register_ffi_type(
            "numbax.CudaCallSite", site_types["cuda"], platform="CUDA")
        jax.ffi.register_ffi_type(
            "numbax.KernelSite", _core.kernel_site_type(), platform="CUDA")
        for target in (CALLABLE_TARGET, CALLABLE_BATCH_TARGET):
            jax.ffi.register_ffi_target(
                target, callable_handlers["cuda"], platform="CUDA")
        for target in (CAPTURE_TARGET, CAPTURE_BATCH_TARGET):
            jax.ffi.register_ffi_target(
                target, callable_handlers["cuda_capture"], platform="CUDA")
        jax.ffi.register_ffi_target(
            KERNEL_TARGET, _core.kernel_handlers()["cuda"], platform="CUDA")
    _platforms_registered.add(platform)
    if not _batch_declared:
        _batch_declared = True
        try:
            for target in BATCH_TARGETS.values():
                jax.ffi.register_ffi_target_as_batch_partitionable(target)
        except Exception as exc:  # partitioning is an optimisation
            _log.warning(
                "numbax: XLA refused the batch-partitionable declaration "
                "(%s: %s); batch_partitionable=True ops still run correctly, "
                "but XLA gathers their inputs", type(exc).__name__, exc)


def ensure_targets() -> None:
    """Registers numbax's fixed FFI targets and state types, once per process."""
    global _targets_registered
    if _targets_registered:
        return
    # Initialise JAX's backends first, outside _lock: a backend starting now
    # calls _on_backend_started (which takes _lock) under JAX's own lock.
    jax.devices()
    with _lock:
        if _targets_registered:
            return
        _register_platform("cpu")
        _register_platform("cuda")
        _targets_registered = True


def _handlers_ready(platform: str) -> bool:
    """True when registering on `platform` now reaches XLA at once (not a
    pending list, which a backend started later would replay out of order)."""
    try:
        from jax._src.lib import xla_client
        name = xla_client.xla_platform_names.get(platform, platform)
        return (name in xla_client._custom_callback_handler and
                name in xla_client._custom_type_id_handler)
    except Exception:  # pragma: no cover - internals moved: stay lazy
        return False


def _on_backend_started(backend) -> None:
    """Registers the targets on each JAX backend as it starts, so that a
    deserialised or cached program reaches numbax's handlers (and their
    'create the op' error) even in a process that created no op yet."""
    try:
        platform = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}.get(
            str(getattr(backend, "platform", "")).lower())
        if platform is None or not _handlers_ready(platform):
            return
        with _lock:
            _register_platform(platform)
    except Exception as exc:  # never break JAX's backend start-up
        _log.warning("numbax: could not register its FFI targets on the %r "
                     "backend yet (%s: %s); they are registered when the "
                     "first numbax op is created", backend, type(exc).__name__,
                     exc)


def _install_backend_hook() -> None:
    try:
        from jax._src import xla_bridge
        hook = xla_bridge.register_backend_initialization_hook
    except (ImportError, AttributeError):  # pragma: no cover - older/newer jax
        return
    hook(_on_backend_started)


_install_backend_hook()


@dataclass
class CallableEntry:
    """What a callable key resolves to."""
    key: str
    func_ref: Callable[[], Any]  # weak where the function allows it
    num_inputs: int
    num_outputs: int
    num_scratch: int = 0
    fast_launch: bool = True


@dataclass
class KernelEntry:
    """What a kernel key resolves to; `plan` builds the C++ launch plan."""
    key: str
    plan: Callable[[], tuple]
    # Weak where the owner allows it, like CallableEntry.func_ref: the
    # registry must not keep an op alive (plan must not refer to it strongly
    # either); the C++ call site holds what the plan returns.
    owner_ref: Callable[[], Any] = lambda: None
    extra: dict = field(default_factory=dict)


_callables: dict[str, CallableEntry] = {}
_kernels: dict[str, KernelEntry] = {}
# (id(func), signature) -> key; cleaned when func is collected.
_memo: dict[tuple, str] = {}


def base_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    qualname = getattr(obj, "__qualname__", None) or getattr(
        obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{qualname}"


def signature_digest(signature: Any) -> str:
    return hashlib.sha256(repr(signature).encode()).hexdigest()[:16]


def _func_ref(func):
    try:
        return weakref.ref(func)
    except TypeError:  # not weak-referenceable: keep it alive
        return lambda: func


def _forget(func_id: int) -> None:
    with _lock:
        for memo_key in [k for k in _memo if k[0] == func_id]:
            key = _memo.pop(memo_key)
            _callables.pop(key, None)
            _kernels.pop(key, None)


def _unique_key(base: str, taken: dict) -> str:
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}#{n}"
    return key


def callable_key(func, signature, *, name: str | None, num_inputs: int,
                 num_outputs: int, num_scratch: int,
                 fast_launch: bool = True) -> str:
    """The key of (func, signature), registering it on first use."""
    ensure_targets()
    memo_key = (id(func), signature, name)
    with _lock:
        key = _memo.get(memo_key)
        if key is not None and key in _callables:
            return key
        base = f"{name or base_name(func)}/{signature_digest(signature)}"
        key = _unique_key(base, _callables)
        _callables[key] = CallableEntry(key, _func_ref(func), num_inputs,
                                        num_outputs, num_scratch,
                                        bool(fast_launch))
        _memo[memo_key] = key
        try:
            weakref.finalize(func, _forget, id(func))
        except TypeError:
            pass
        return key


def kernel_key(owner, signature, plan, *, name: str | None) -> str:
    ensure_targets()
    memo_key = (id(owner), signature, name)
    with _lock:
        key = _memo.get(memo_key)
        if key is not None and key in _kernels:
            return key
        base = f"{name or base_name(owner)}/{signature_digest(signature)}"
        key = _unique_key(base, _kernels)
        _kernels[key] = KernelEntry(key, plan, _func_ref(owner))
        _memo[memo_key] = key
        try:
            weakref.finalize(owner, _forget, id(owner))
        except TypeError:
            pass
        return key


def _missing(key: str, kind: str) -> KeyError:
    if ".simulator/" in key:  # a numba_cuda_kernel run through the simulator
        kind = "kernel"
    return KeyError(
        f"numbax {kind} '{key}' is not registered in this process. Create the "
        f"same op (numbax.{'numba_cuda_callable' if kind == 'callable' else 'numba_cuda_kernel'}"
        "(...) with the same function and signature) and call it once, or "
        "trace it, before running a compiled or deserialised program that "
        "uses it; an op whose function was garbage-collected must be "
        "recreated too (docs/export.md)")


def _resolve_callable(key: str, platform: str):
    """Called by C++ at XLA's instantiate stage."""
    with _lock:
        entry = _callables.get(key)
    if entry is None:
        raise _missing(key, "callable")
    func = entry.func_ref()
    if func is None:
        raise _missing(key, "callable")
    if platform == "cpu" and not _numba.simulator_enabled():
        raise RuntimeError(
            f"numbax op '{key}' was placed on JAX's CPU backend, which runs "
            "Numba kernels only through Numba's CUDA simulator: set "
            "NUMBA_ENABLE_CUDASIM=1 before numba is imported, or run the "
            "program on a GPU")
    if platform == "cpu":
        func = _one_simulated_launch_at_a_time(func)
    return (func, entry.num_inputs, entry.num_outputs, entry.num_scratch,
            _fast_launch.enabled_for(entry.fast_launch))


# Numba's simulator runs one kernel launch at a time in the whole process
# (it swaps module globals and keeps the launch configuration on the kernel
# object), while XLA calls handlers from several threads at once: several
# CPU devices, or several Python threads. On the CPU every func therefore
# runs under this lock; on a GPU nothing is serialised.
_simulator_lock = threading.RLock()


def _one_simulated_launch_at_a_time(func):
    def run_in_simulator(*args):
        with _simulator_lock:
            return func(*args)
    run_in_simulator.__wrapped__ = func
    return run_in_simulator


def _resolve_kernel(key: str):
    """Called by C++ at XLA's instantiate stage: the launch plan."""
    with _lock:
        entry = _kernels.get(key)
    if entry is None or entry.owner_ref() is None:
        raise _missing(key, "kernel")
    return entry.plan()


def registry_size() -> tuple[int, int]:
    """(callables, kernels) registered now: for tests and diagnostics."""
    with _lock:
        return len(_callables), len(_kernels)
