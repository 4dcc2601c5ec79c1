"""Stable keys for user functions, and the one-time FFI target registration.

A compiled program names the Python function (or kernel) it calls by a
string key built from the function's module, qualified name and call
signature: no pointer, id or counter of this process. Running the program in
another process works once the same op has been created there.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import jax

from . import _core, _numba

CALLABLE_TARGET = "numbax_callable"
CAPTURE_TARGET = "numbax_callable_capture"
KERNEL_TARGET = "numbax_kernel"

_lock = threading.RLock()
_targets_registered = False


def ensure_targets() -> None:
    """Registers numbax's fixed FFI targets and state types, once per process."""
    global _targets_registered
    with _lock:
        if _targets_registered:
            return
        # Initialise JAX's backends first: a backend that starts later
        # registers pending FFI targets before pending types, and refuses
        # handlers whose state types it has not seen yet.
        jax.devices()
        _core.set_python_hooks(
            resolve=_resolve_callable,
            device_array=_numba.device_array_hook,
            host_array=_numba.host_array_hook,
            device_stream=_numba.device_stream_hook,
            host_stream=_numba.host_stream_hook,
            format_exception=_numba.format_exception_hook,
        )
        _core.set_kernel_resolver(_resolve_kernel)
        callable_handlers = _core.callable_handlers()
        kernel_handlers = _core.kernel_handlers()
        site_types = _core.call_site_types()
        jax.ffi.register_ffi_type(
            "numbax.CpuCallSite", site_types["cpu"], platform="cpu")
        jax.ffi.register_ffi_type(
            "numbax.CudaCallSite", site_types["cuda"], platform="CUDA")
        jax.ffi.register_ffi_type(
            "numbax.KernelSite", _core.kernel_site_type(), platform="CUDA")
        jax.ffi.register_ffi_target(
            CALLABLE_TARGET, callable_handlers["cpu"], platform="cpu")
        jax.ffi.register_ffi_target(
            CALLABLE_TARGET, callable_handlers["cuda"], platform="CUDA")
        # The simulator has no graphs: capture mode runs plainly on the CPU.
        jax.ffi.register_ffi_target(
            CAPTURE_TARGET, callable_handlers["cpu"], platform="cpu")
        jax.ffi.register_ffi_target(
            CAPTURE_TARGET, callable_handlers["cuda_capture"], platform="CUDA")
        jax.ffi.register_ffi_target(
            KERNEL_TARGET, kernel_handlers["cuda"], platform="CUDA")
        _targets_registered = True


@dataclass
class CallableEntry:
    """What a callable key resolves to."""
    key: str
    func_ref: Callable[[], Any]  # weak where the function allows it
    num_inputs: int
    num_outputs: int
    num_scratch: int = 0


@dataclass
class KernelEntry:
    """What a kernel key resolves to; `plan` builds the C++ launch plan."""
    key: str
    plan: Callable[[], tuple]
    owner: Any = None
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
                 num_outputs: int, num_scratch: int) -> str:
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
                                        num_outputs, num_scratch)
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
        _kernels[key] = KernelEntry(key, plan, owner)
        _memo[memo_key] = key
        try:
            weakref.finalize(owner, _forget, id(owner))
        except TypeError:
            pass
        return key


def _missing(key: str, kind: str) -> KeyError:
    return KeyError(
        f"numbax {kind} '{key}' is not registered in this process. Create the "
        f"same op (numbax.{'numba_cuda_callable' if kind == 'callable' else 'numba_cuda_kernel'}"
        "(...) with the same function and signature) and call it once, or "
        "trace it, before running a compiled or deserialised program that "
        "uses it; an op whose function was garbage-collected must be "
        "recreated too")


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
    return (func, entry.num_inputs, entry.num_outputs, entry.num_scratch)


def _resolve_kernel(key: str):
    """Called by C++ at XLA's instantiate stage: the launch plan."""
    with _lock:
        entry = _kernels.get(key)
    if entry is None:
        raise _missing(key, "kernel")
    return entry.plan()


def registry_size() -> tuple[int, int]:
    """(callables, kernels) registered now: for tests and diagnostics."""
    with _lock:
        return len(_callables), len(_kernels)
