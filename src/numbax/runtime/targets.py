"""numbax's fixed FFI targets: their names, and their registration with XLA.

Every op lowers to one of a few fixed targets, with a key attribute that
says which Python function (or kernel) the call runs (registry.py resolves
it). The targets and their state types are registered once per platform:
as JAX starts each backend or discovers its plugins, or when the first op is
created or traced (ensure_targets), whichever comes first. Before the first
registration the C++ core gets its Python hooks, the key resolvers among
them (install).
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any, Callable

import jax

from .. import _core
from . import compat, guard, numba_bridge

CALLABLE_TARGET = "numbax_callable"
CAPTURE_TARGET = "numbax_callable_capture"
KERNEL_TARGET = "numbax_kernel"
# numba_kernel: a Numba @njit kernel on JAX's CPU backend (cpu_kernel/).
CPU_KERNEL_TARGET = "numbax_cpu_kernel"
# The same handlers under the names of calls XLA may split (a sharding rule,
# batch_partitionable=True, or jax.vmap's axis: trace/sharding_rules.py): XLA
# registers these names as batch-partitionable, so they need their own.
CALLABLE_BATCH_TARGET = "numbax_callable_batch"
CAPTURE_BATCH_TARGET = "numbax_callable_capture_batch"
KERNEL_BATCH_TARGET = "numbax_kernel_batch"
CPU_KERNEL_BATCH_TARGET = "numbax_cpu_kernel_batch"
BATCH_TARGETS = {CALLABLE_TARGET: CALLABLE_BATCH_TARGET,
                 CAPTURE_TARGET: CAPTURE_BATCH_TARGET,
                 KERNEL_TARGET: KERNEL_BATCH_TARGET,
                 CPU_KERNEL_TARGET: CPU_KERNEL_BATCH_TARGET}
ALL_TARGETS = (CALLABLE_TARGET, CAPTURE_TARGET, KERNEL_TARGET,
               CPU_KERNEL_TARGET, CALLABLE_BATCH_TARGET, CAPTURE_BATCH_TARGET,
               KERNEL_BATCH_TARGET, CPU_KERNEL_BATCH_TARGET)

# Guards the registration state below (the registry's entries have a lock
# of their own).
_lock = threading.RLock()
_targets_registered = False
_platforms_registered: set = set()
_hooks_installed = False
_batch_declared = False
_log = logging.getLogger("numbax")
# What C++ calls at XLA's instantiate stage to resolve a program's key
# (registry.py): set by install(), before any registration can run.
_resolvers: tuple[Callable, Callable, Callable] | None = None


def _install_python_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    assert _resolvers is not None, "runtime/registry.py installs the resolvers"
    resolve_callable, resolve_kernel, resolve_cpu_kernel = _resolvers
    _core.set_python_hooks(
        resolve=resolve_callable,
        device_array=numba_bridge.device_array_hook,
        host_array=numba_bridge.host_array_hook,
        device_stream=numba_bridge.device_stream_hook,
        host_stream=numba_bridge.host_stream_hook,
        format_exception=numba_bridge.format_exception_hook,
    )
    _core.set_kernel_resolver(resolve_kernel)
    _core.set_cpu_kernel_resolver(resolve_cpu_kernel)
    # A capture-mode func that reads device memory on the host while it is
    # recorded is never captured (csrc/capture_handler.cc, kHostRead).
    try:
        numba_bridge.watch_host_copies()
    except Exception as exc:  # Numba internals moved: capture still works
        _log.warning("numbax: cannot watch Numba's device-to-host copies "
                     "(%s: %s); a capture=True func must not read device "
                     "memory on the host", type(exc).__name__, exc)
    # JAX refuses calls made from inside a func XLA is running.
    guard.install()
    # At exit, before Python finalises (and before JAX's own atexit clean-up,
    # registered earlier), handlers stop running Python and those in flight
    # finish: a thread that waits for the GIL during finalisation is ended
    # in a way that aborts the process.
    atexit.register(_core.prepare_for_exit)
    _hooks_installed = True


def _register_platform(platform: str, plugin_c_api: Any = None) -> None:
    """Registers the state types, then the targets, of one platform (once).

    Called with _lock held, once that platform's backend has started: a
    backend that starts later registers pending FFI targets before pending
    types, and refuses handlers whose state types it has not seen yet.
    `plugin_c_api` is set when JAX calls this while it discovers plugins
    (_on_plugins_discovered).
    """
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
        # numba_kernel runs on the CPU only (a GPU program refuses it when
        # it is lowered, cpu_kernel/primitive.py).
        jax.ffi.register_ffi_type(
            "numbax.CpuKernelSite", _core.cpu_kernel_site_type(),
            platform="cpu")
        for target in (CPU_KERNEL_TARGET, CPU_KERNEL_BATCH_TARGET):
            jax.ffi.register_ffi_target(
                target, _core.cpu_kernel_handlers(), platform="cpu")
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
        for target in (KERNEL_TARGET, KERNEL_BATCH_TARGET):
            jax.ffi.register_ffi_target(
                target, _core.kernel_handlers()["cuda"], platform="CUDA")
    _platforms_registered.add(platform)
    _declare_batch_partitionable(plugin_c_api)


def _declare_batch_partitionable(plugin_c_api: Any = None) -> None:
    """Declares the batch targets partitionable along their leading axis
    (once; with _lock held)."""
    global _batch_declared
    if _batch_declared:
        return
    _batch_declared = True
    try:
        if plugin_c_api is None:
            for target in BATCH_TARGETS.values():
                jax.ffi.register_ffi_target_as_batch_partitionable(target)
            return
        # JAX is running its plugin callbacks and holds the lock that
        # jax.ffi.register_ffi_target_as_batch_partitionable takes again to
        # queue a callback for later plugins: calling it here hangs the
        # process (jax 0.11). Declare for XLA and for
        # the plugin being started directly, as that function would.
        for target in BATCH_TARGETS.values():
            compat.declare_batch_partitionable_in_plugin_callback(
                target, plugin_c_api)
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


def backends_started() -> bool:
    return compat.backends_started()


def _handlers_ready(platform: str) -> bool:
    """True when registering on `platform` now reaches XLA at once (not a
    pending list, which a backend started later would replay out of order)."""
    return compat.ffi_handlers_ready(platform)


def _on_backend_started(backend) -> None:
    """Registers the targets on each JAX backend as it starts, so that a
    deserialised or cached program reaches numbax's handlers (and their
    'create the op' error) even in a process that created no op yet."""
    try:
        platform = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}.get(
            str(getattr(backend, "platform", "")).lower())
        # A CUDA backend exists only once its plugin has initialised, which
        # registers the plugin's call and type handlers first: registering
        # now reaches XLA at once, whatever jaxlib names its tables.
        if platform is None or (platform == "cpu" and
                                not _handlers_ready(platform)):
            return
        with _lock:
            _register_platform(platform)
    except Exception as exc:  # never break JAX's backend start-up
        _log.warning("numbax: could not register its FFI targets on the %r "
                     "backend yet (%s: %s); they are registered when the "
                     "first numbax op is created", backend, type(exc).__name__,
                     exc)


def register_ready_platforms(plugin_c_api: Any = None) -> None:
    for platform in ("cpu", "cuda"):
        try:
            if platform not in _platforms_registered and \
                    _handlers_ready(platform):
                with _lock:
                    _register_platform(platform, plugin_c_api)
        except Exception as exc:  # never break op creation or JAX start-up
            _log.warning("numbax: could not register its FFI targets for %s "
                         "yet (%s: %s); they are registered when the first "
                         "numbax op is traced", platform, type(exc).__name__,
                         exc)


def _on_plugins_discovered(*args, c_api: Any = None, **kwargs) -> None:
    """Where JAX has no backend-start hook (jax 0.11): once
    the PJRT plugins are discovered their handlers are registered, and no
    backend has started yet; registering now reaches XLA at once.

    JAX calls this once per plugin (`c_api`) with its plugin locks held:
    nothing here may call back into JAX's xla_bridge."""
    del args, kwargs
    register_ready_platforms(c_api)


def _install_backend_hook(bridge: Any = None) -> str:
    """Arranges for numbax's targets to be registered as JAX starts its
    backends (`bridge`: JAX's xla_bridge module, or a stand-in in tests);
    returns which mechanism was used."""
    return compat.install_backend_start_hook(
        _on_backend_started, _on_plugins_discovered, bridge)


#: The scalar JAX records as it starts compiling (or loading from its
#: persistent cache) an XLA program: BACKEND_COMPILE_EVENT of JAX's private dispatch module.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: Whether numbax registers its targets at the first XLA compile
#: (_on_compile_event): on JAX without the backend-start hook.
COMPILE_LISTENER = False


def _on_compile_event(event: str, value: Any = None, **kwargs: Any) -> None:
    """Registers numbax's targets as JAX starts compiling its first program,
    where no backend-start hook did (jax 0.8, 0.9, 0.11).

    Why: jax 0.10's xla_bridge called register_backend_initialization_hook's
    hooks as each backend started; jax 0.11 removed that hook (its
    xla_bridge keeps only register_plugin_callbacks, which runs for PJRT
    plugins such as CUDA, never for the CPU). And jaxlib installs the CPU's
    FFI handler tables only in xla_client.make_cpu_client, when the CPU
    backend starts: before that a registration is queued, and the queue is
    replayed targets first, types second, so the CPU refuses numbax's
    handlers (their state types unseen yet); numbax therefore waits
    (register_ready_platforms). So in a process that created its ops before
    JAX started, then deserialised and called an exported program (the
    recipe in docs/export.md), nothing registered the targets and XLA said
    "No FFI handler registered for numbax_callable". JAX records this
    scalar (jax.monitoring, public) on entering every XLA compile or cache
    load, when the program's backend has started and before XLA looks up a
    custom call's handler: registering here reaches XLA in time."""
    del value, kwargs
    if event != COMPILE_EVENT or _targets_registered:
        return
    try:
        ensure_targets()
    except Exception as exc:  # never break JAX's compile with our own error
        _log.warning("numbax: could not register its FFI targets as JAX "
                     "compiles (%s: %s); start JAX (jax.devices()) before "
                     "creating numbax ops", type(exc).__name__, exc)


def _install_compile_listener() -> bool:
    global COMPILE_LISTENER
    register = getattr(getattr(jax, "monitoring", None),
                       "register_scalar_listener", None)
    if register is None:  # pragma: no cover - old JAX
        return False
    register(_on_compile_event)
    COMPILE_LISTENER = True
    return True


def install(resolve_callable: Callable, resolve_kernel: Callable,
            resolve_cpu_kernel: Callable) -> str:
    """Takes the resolvers C++ calls at XLA's instantiate stage (a callable's
    key -> its func, a kernel's key -> its LoadedKernel, a numba_kernel's key
    -> its site tuple), then arranges for
    the targets to be registered as JAX starts its backends; returns which
    mechanism was used (registry.BACKEND_REGISTRATION).

    Called once, last in registry.py's import: JAX calls the hook at once
    when a backend has already started (numbax imported after
    jax.devices()), and the hook reaches both resolvers."""
    global _resolvers
    _resolvers = (resolve_callable, resolve_kernel, resolve_cpu_kernel)
    mechanism = _install_backend_hook()
    if mechanism != "backend hook":
        _install_compile_listener()
    return mechanism
