"""Which JAX versions numbax runs on, checked when numbax is imported.

numbax's handlers keep per-op state that XLA creates at the instantiate stage
and destroys with the executable (``ffi::State``), registered as an FFI type
with its deleter (``jax.ffi.register_ffi_type`` and ``XLA_FFI_TypeInfo``).
That arrived with XLA FFI API 0.2, first shipped in jaxlib 0.8.1; older
jaxlibs (FFI 0.1) register types differently and give the state's deleter on
every call, an ABI numbax is not built for. So jax and jaxlib 0.8.1 are the
floor.

One binary for the whole range. The wheel is compiled against jaxlib 0.8.1's
headers (pyproject.toml's [build-system] requires): a jaxlib refuses a
handler compiled against a newer FFI than its own, and newer jaxlibs keep
the C structs of older versions readable. Keeping the structs is not the
whole contract, though: newer runtimes also call handlers differently. From
FFI 0.3 on, XLA's GPU runtime passes the call's buffers at the instantiate
stage, and a handler whose 0.2-compiled binding bound none refused every GPU
call ("Wrong number of arguments"), while the CPU runtime, which passes none,
hid it. numbax's handlers accept every calling convention seen so far
(csrc/ffi_binding.h), and the range they are known to serve is
:data:`SERVED_FFI_API`: a jaxlib whose FFI is newer than that is refused at
import with the reason (``NUMBAX_ALLOW_UNTESTED_FFI=1`` tries it anyway),
instead of failing inside XLA on every call. A build against newer headers
(``pip install --no-build-isolation`` next to a newer jaxlib) runs only on
jaxlibs at least that new: :func:`problem` says so too.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from functools import cache, partial
from typing import Any, Callable

from . import env

#: The oldest jax and jaxlib numbax runs on (see the module docstring).
MIN_JAX = (0, 8, 1)
#: The XLA FFI API (major, minor) that MIN_JAX's jaxlib provides.
MIN_FFI_API = (0, 2)
#: The XLA FFI API versions (major, minor) the wheel, compiled against
#: MIN_FFI_API's headers, is known to serve: the oldest and newest run. Ran
#: on the GPU: 0.4 (jaxlib 0.11.2); on the CPU in CI: 0.2 (0.8.1), 0.3
#: (0.10.2), 0.4 (0.11.2), 0.5 (0.12.0.1). Raise it only after the GPU suite
#: has passed on a jaxlib with the newer version (docs/install.md).
SERVED_FFI_API = ((0, 2), (0, 5))
#: The newest jax the test matrix ran; pyproject.toml's range stops before
#: the next minor release (tests/test_versions.py keeps them in step).
TESTED_UP_TO = "0.12.0.1"
#: Set to 1 (or true, yes, on: env.py) to run on a jaxlib whose FFI is
#: newer than SERVED_FFI_API.
ALLOW_UNTESTED_ENV = "NUMBAX_ALLOW_UNTESTED_FFI"

SUPPORTED = f"jax and jaxlib >= {'.'.join(map(str, MIN_JAX))}"
_PIP_JAX = f"pip install -U 'jax>={'.'.join(map(str, MIN_JAX))}'"


def release(version: str | None) -> tuple[int, ...]:
    """(major, minor, patch) of a version string, ignoring suffixes."""
    if not version:
        return ()
    parts = []
    for piece in version.split(".")[:3]:
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def dist_version(name: str) -> str | None:
    """The installed version of distribution `name`, or None (absent, or a
    broken install); never imports it."""
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - absent or unreadable: unknown
        return None


def jax_upper_bound() -> str:
    """The first jax release past the tested range ("0.13" after 0.12.x):
    pyproject.toml's dependency range stops before it."""
    major, minor = release(TESTED_UP_TO)[:2]
    return f"{major}.{minor + 1}"


def _api(api: tuple[int, int] | None) -> str:
    return "unknown" if api is None else f"{api[0]}.{api[1]}"


def problem(jax_version: str | None, jaxlib_version: str | None,
            built_api: tuple[int, int] | None,
            runtime_api: tuple[int, int] | None,
            built_from: str = "",
            allow_untested: bool | None = None) -> tuple[str, str] | None:
    """(what is wrong, the fix) when this numbax cannot run on this JAX, or
    None when it can (or a version is unknown and nothing can be said).

    ``built_api``: the FFI API numbax._core was compiled against;
    ``runtime_api``: the one the running jaxlib provides;
    ``allow_untested``: accept a runtime FFI newer than SERVED_FFI_API
    (default: the NUMBAX_ALLOW_UNTESTED_FFI environment variable).
    """
    for name, version in (("jax", jax_version), ("jaxlib", jaxlib_version)):
        v = release(version)
        if v and v < MIN_JAX:
            return (
                f"{name} {version} is too old for numbax: numbax needs "
                f"{SUPPORTED} (its ops keep per-op state registered through "
                f"XLA FFI API {_api(MIN_FFI_API)}, which jaxlib "
                f"{'.'.join(map(str, MIN_JAX))} introduced)",
                f"{_PIP_JAX} (or jax[cuda12]/jax[cuda13] on a GPU machine); "
                f"numbax is tested with jax {'.'.join(map(str, MIN_JAX))} to "
                f"{TESTED_UP_TO}")
    if built_api is None or runtime_api is None:
        return None
    source = f", the headers of {built_from}" if built_from else ""
    upgrade = (f"{built_from.split()[1]} or newer" if built_from.startswith("jaxlib ")
               else f"a version whose FFI API is {_api(built_api)}")
    if built_api[0] != runtime_api[0] or built_api[1] > runtime_api[1]:
        return (
            f"numbax's extension was compiled against XLA FFI API "
            f"{_api(built_api)}{source}, but the running jaxlib "
            f"{jaxlib_version or '(unknown version)'} provides FFI API "
            f"{_api(runtime_api)} and refuses handlers built for a newer "
            f"version, so every numbax op would fail",
            f"install the numbax wheel (compiled against FFI API "
            f"{_api(MIN_FFI_API)}, it runs on every jaxlib >= "
            f"{'.'.join(map(str, MIN_JAX))}), or rebuild numbax with build "
            f"isolation, which compiles against those headers: pip install "
            f"--force-reinstall . (without --no-build-isolation); or upgrade "
            f"jax and jaxlib to {upgrade}")
    if allow_untested is None:
        allow_untested = env.flag(ALLOW_UNTESTED_ENV, False)
    newest = SERVED_FFI_API[1]
    if runtime_api > newest and not allow_untested:
        below = jax_upper_bound()
        return (
            f"the running jaxlib {jaxlib_version or '(unknown version)'} "
            f"provides XLA FFI API {_api(runtime_api)}, newer than any this "
            f"numbax was checked against ({_api(SERVED_FFI_API[0])} to "
            f"{_api(newest)}, jax {'.'.join(map(str, MIN_JAX))} to "
            f"{TESTED_UP_TO}); newer XLA runtimes have changed how they call "
            f"handlers before, and then every numbax op failed inside XLA",
            f"pip install 'jax<{below}' 'jaxlib<{below}' "
            f"(or a numbax release that lists FFI API {_api(runtime_api)}); "
            f"to try this jaxlib anyway, set {ALLOW_UNTESTED_ENV}=1")
    return None


def served_ffi_api(built_api: tuple[int, int] | None
                   ) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(oldest, newest) XLA FFI API a build compiled against ``built_api``
    serves, as :func:`problem` decides: a jaxlib older than the headers
    refuses the handlers, and SERVED_FFI_API's newest is the last checked.
    None when ``built_api`` is unknown, or newer than any checked."""
    if built_api is None:
        return None
    built = (int(built_api[0]), int(built_api[1]))
    oldest, newest = max(built, SERVED_FFI_API[0]), SERVED_FFI_API[1]
    if oldest[0] != newest[0] or oldest > newest:
        return None
    return oldest, newest


def runtime_ffi_api() -> tuple[int, int] | None:
    """The XLA FFI API version of the running jaxlib, read from the headers
    it ships (the C API offers no query from Python); None if unreadable."""
    try:
        import jaxlib
        header = os.path.join(os.path.dirname(jaxlib.__file__), "include",
                              "xla", "ffi", "api", "c_api.h")
        with open(header) as f:
            text = f.read()
    except (ImportError, OSError):
        return None
    major = re.search(r"#define\s+XLA_FFI_API_MAJOR\s+(\d+)", text)
    minor = re.search(r"#define\s+XLA_FFI_API_MINOR\s+(\d+)", text)
    if not (major and minor):
        return None
    return int(major.group(1)), int(minor.group(1))


def built_ffi_api() -> tuple[tuple[int, int] | None, str]:
    """(the FFI API numbax._core was compiled against, where its headers came
    from), recorded by CMake at build time; (None, "") for a source tree that
    was never built."""
    try:
        # Generated by CMake into the installed package only (not in src/).
        info = importlib.import_module("numbax._build_info")
    except ImportError:
        return None, ""
    major, minor = info.XLA_FFI_API
    return (int(major), int(minor)), str(info.XLA_FFI_HEADERS_FROM)


def current_problem() -> tuple[str, str] | None:
    """:func:`problem` for the running process."""
    try:
        import jax
        jax_version: str | None = jax.__version__
    except ImportError:
        return None  # importing numbax's modules raises the clearer error
    try:
        from jaxlib import version as jaxlib_version_module
        jaxlib_version: str | None = jaxlib_version_module.__version__
    except ImportError:
        jaxlib_version = None
    built, built_from = built_ffi_api()
    return problem(jax_version, jaxlib_version, built, runtime_ffi_api(),
                   built_from)


def running_cli() -> bool:
    """True while ``python -m numbax`` (or the ``numbax`` script) imports
    numbax: ``info`` must still run to report the problem."""
    argv0 = sys.argv[0] if sys.argv else ""
    # runpy sets argv[0] to "-m" while it imports the package it runs.
    return argv0 == "-m" or os.path.basename(argv0) == "numbax"


def check() -> None:
    """Raises ImportError when this numbax cannot run on the installed JAX."""
    found = current_problem()
    if found is not None:
        what, fix = found
        raise ImportError(f"numbax cannot run here: {what}. Fix: {fix}. "
                          f"(python -m numbax info shows the versions)")


# -- JAX shims -----------------------------------------------------------------
# Each is the code that sat in the module using it, moved here unchanged, so
# it runs where that did (the wheel matrix: jax 0.8.1 and 0.10.2; the GPU
# box: 0.11.2). What is said below about public alternatives was read in jax
# 0.10.2's sources. "Keep" marks what no released jax lets go yet.


def eager_primitive(name: str) -> Any:
    """A new multiple-results ``jax.extend.core.Primitive`` whose eager calls
    compile it alone, as jax does for its own primitives."""
    # jax.extend.core.Primitive is public since jax 0.4.36, below the floor
    # (the old jax.core fallback was dead code and is gone).
    from jax.extend.core import Primitive
    # jax._src, keep: apply_primitive (what jax's own primitives, e.g.
    # jax.experimental.rnn's, run eagerly) is public only as a re-export in
    # jax.interpreters.xla, a module of legacy aliases.
    from jax._src import dispatch
    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_impl(partial(dispatch.apply_primitive, prim))
    return prim


def source_location(ctx: Any) -> Any:
    """The MLIR location of the user's source line that a lowering rule's
    equation came from (as JAX locates it: a file line, or a call-site
    chain under jax_include_full_tracebacks_in_locations), without JAX's
    names around it; None where this jax lays its lowering out otherwise."""
    # jax._src, keep: source_info_to_location is what JAX's lowering uses
    # for every equation; it is not exported.
    try:
        from jax._src import source_info_util
        from jax._src.interpreters import mlir as jax_mlir
        return jax_mlir.source_info_to_location(
            ctx.module_context, None, source_info_util.new_name_stack(),
            ctx.traceback)
    except Exception:  # noqa: BLE001 - another jax's internals
        return None


def keep_alive(ctx: Any, owner: Any) -> None:
    """The program being lowered keeps `owner` alive as long as its
    compiled executable lives (JAX's keepalives, as its Python callbacks
    use). numbax's registry refers to ops weakly, and the C++ call site
    builds what it runs from the op at XLA's instantiate stage, after
    lowering: an op created while tracing and dropped after it (inside a
    jitted function, or inside the function an XLACustomKernel's
    generator returned, the reference's own style) would be gone by then.
    Not for jax.export, which refuses a lowering with keepalives and keeps
    no Python object anyway: a deserialised program finds its ops by key."""
    context = ctx.module_context
    if owner is not None and not getattr(context.lowering_parameters,
                                         "for_export", False):
        context.add_keepalive(owner)


def shaped_array(shape: tuple[int, ...], dtype: Any) -> Any:
    """``jax.core.ShapedArray(shape, dtype)``, an abstract eval's result."""
    return _shaped_array_class()(shape, dtype)


@cache
def _shaped_array_class() -> type:
    try:
        from jax.core import ShapedArray
    except ImportError:  # pragma: no cover
        # For a jax that takes ShapedArray out of jax.core (jax 0.10
        # deprecates most of that module); jax._src.core keeps it. Every
        # jax from the floor to 0.11.2 has jax.core.ShapedArray.
        from jax._src.core import ShapedArray
    return ShapedArray


def ffi_effect() -> Any:
    """The effect ``jax.ffi.ffi_call(..., has_side_effect=True)`` gives its
    calls (XLA neither merges nor drops them), or None if it moved."""
    # jax._src, keep: jax.ffi exports ffi_call but not its effect.
    try:
        from jax._src.ffi import _FfiEffect
        return _FfiEffect
    except ImportError:  # pragma: no cover - moved in a later jax
        return None


def shardy_on() -> bool:
    """Whether jit partitions with Shardy (else GSPMD)."""
    try:
        # jax._src, keep: the config holder reads the thread-local value
        # that jax.config.update and the context managers set.
        from jax._src import config as jax_config
        return bool(jax_config.use_shardy_partitioner.value)
    except (ImportError, AttributeError):  # pragma: no cover
        import jax
        return bool(getattr(jax.config, "jax_use_shardy_partitioner", True))


def lowering_device_count(ctx: Any) -> int:
    """How many devices the program being lowered runs on (1 where it is
    not a program jit partitions: inside shard_map, pmap, or unknown)."""
    # jax._src, keep: the lowering's axis context has no public name.
    try:
        from jax._src.sharding_impls import ShardingContext
    except ImportError:  # pragma: no cover - moved in a later jax
        return 1
    axis_context = getattr(ctx.module_context, "axis_context", None)
    if isinstance(axis_context, ShardingContext):
        return int(axis_context.num_devices)
    return 1


def reshape_value(ctx: Any, value: Any, aval: Any) -> Any:
    """A lowering's ``stablehlo.reshape`` of `value` to `aval`'s shape."""
    # jax._src, keep: jax.interpreters.mlir does not re-export reshape
    # (jax 0.8 to 0.12 all have it in jax._src.interpreters.mlir).
    from jax._src.interpreters import mlir as mlir_internal
    return mlir_internal.reshape(ctx, value, aval)


def sdy_sharding_rule_api() -> tuple[Callable, Callable]:
    """(str_to_sdy_sharding_rule, sdy_sharding_rule_to_mlir): an einsum-like
    Shardy rule parsed, and its MLIR ``sdy.sharding_rule`` attribute."""
    # jax._src, keep: jax.experimental.custom_partitioning exports the rule
    # class (SdyShardingRule) but neither function.
    from jax._src.custom_partitioning_sharding_rule import (
        sdy_sharding_rule_to_mlir, str_to_sdy_sharding_rule)
    return str_to_sdy_sharding_rule, sdy_sharding_rule_to_mlir


def backends_started() -> bool:
    """Whether JAX has started its backends (without starting them)."""
    try:
        # jax._src, keep: no public query; jax.devices() would start them.
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # pragma: no cover - internals moved: stay lazy
        return False


def ffi_handlers_ready(platform: str) -> bool:
    """True when a ``jax.ffi`` registration on `platform` ("cpu", "cuda")
    reaches XLA at once, not a pending list that a backend started later
    would replay out of order."""
    try:
        # jax._src, keep: the handler tables of the PJRT plugins are private.
        from jax._src.lib import xla_client
        # numbax registers on "cpu" and "CUDA"; XLA keys its handlers by
        # its own platform names ("Host", "CUDA"). xla_platform_names maps
        # "gpu" but not "cuda", so "cuda" must be spelled as registered.
        registered_as = {"cpu": "cpu", "cuda": "CUDA"}.get(platform, platform)
        name = xla_client.xla_platform_names.get(registered_as, registered_as)
        if name not in xla_client._custom_callback_handler:
            return False
        # The state-type handler's table has been renamed across jaxlib
        # releases; the plugin registers it together with the call handler.
        for table in ("_custom_type_id_handler", "_custom_type_handler"):
            handlers = getattr(xla_client, table, None)
            if isinstance(handlers, dict):
                return name in handlers
        return True
    except Exception:  # pragma: no cover - internals moved: stay lazy
        return False


def install_backend_start_hook(on_backend_started: Callable,
                               on_plugins_discovered: Callable,
                               bridge: Any = None) -> str:
    """Has JAX call back as it starts its backends; returns the mechanism:
    "backend hook" (each backend as it starts), "plugin callback" (once the
    PJRT plugins are discovered) or "none". `bridge`: jax._src.xla_bridge,
    or a stand-in in tests."""
    if bridge is None:
        try:
            # jax._src, keep: neither hook has a public name.
            bridge = importlib.import_module("jax._src.xla_bridge")
        except ImportError:  # pragma: no cover - internals moved
            return "none"
    # jax 0.10 only (0.8, 0.9 and 0.11 lack it): drop when jax>=0.11 is the
    # floor (then the plugin callback below is all there is).
    hook = getattr(bridge, "register_backend_initialization_hook", None)
    if hook is not None:
        hook(on_backend_started)
        return "backend hook"
    callbacks = getattr(bridge, "register_plugin_callbacks", None)
    if callbacks is not None:  # jax 0.11 has no backend-start hook
        callbacks(on_plugins_discovered)
        return "plugin callback"
    return "none"  # registered when the first op is traced or created


def declare_batch_partitionable_in_plugin_callback(target: str,
                                                   c_api: Any) -> None:
    """What jax.ffi.register_ffi_target_as_batch_partitionable does, for XLA
    and for the plugin whose callback is running, without queueing a plugin
    callback: that takes JAX's plugin-callback lock, which JAX holds while
    it runs the callbacks (a hang on jax 0.11)."""
    # jax._src, keep: xla_client's registration has no public name.
    from jax._src.lib import xla_client
    xla_client.register_custom_call_as_batch_partitionable(target)
    xla_client.register_custom_call_as_batch_partitionable(target, c_api)


def trace_base() -> type:
    """JAX's ``Trace`` class, for a trace that refuses every operation."""
    # jax._src, keep: jax.core.Trace is the same class, but the trace-state
    # swaps below need jax._src.core anyway; one module for both.
    from jax._src import core
    return core.Trace


def current_trace_swaps(trace: Any) -> tuple:
    """(swap, value, ...) pairs that make `trace` the current JAX trace of
    the calling thread: ``old = swap(value)`` installs it, ``swap(old)``
    restores. C++ runs them around each func call (guard.py)."""
    from jax._src import core  # jax._src, keep: the trace state is private
    if hasattr(core, "trace_state_strong_ref"):
        # jax >= 0.10: the current trace lives in two thread-local configs
        # whose C++ swap_local needs no Python frame.
        return (core.trace_state.swap_local, trace._weakref,
                core.trace_state_strong_ref.swap_local, trace)
    # jax 0.8 - 0.9 (drop when jax>=0.10 is the floor): a thread-local
    # TracingContext, whose set_trace also updates the jit cache key; one
    # Python frame per swap.
    ctx = core.trace_ctx

    def swap_trace(new):
        old = ctx.trace
        ctx.set_trace(new)
        return old

    return (swap_trace, trace)
