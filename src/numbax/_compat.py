"""Which JAX versions numbax runs on, checked when numbax is imported.

numbax's handlers keep per-op state that XLA creates at the instantiate stage
and destroys with the executable (``ffi::State``), registered as an FFI type
with its deleter (``jax.ffi.register_ffi_type`` and ``XLA_FFI_TypeInfo``).
That arrived with XLA FFI API 0.2, first shipped in jaxlib 0.8.1; older
jaxlibs (FFI 0.1) register types differently and give the state's deleter on
every call, an ABI numbax is not built for. So jax and jaxlib 0.8.1 are the
floor.

The FFI is backward compatible: a handler compiled against API 0.N runs on
every jaxlib whose FFI is 0.N or newer, while a jaxlib refuses a handler
compiled against a newer version than its own ("handler's API version (0.3) is
incompatible with the framework's API version (0.2)"). The wheel is therefore
compiled against jaxlib 0.8.1's headers (pyproject.toml's [build-system]
requires), which makes one binary run on every supported jaxlib. A build
against newer headers (``pip install --no-build-isolation`` next to a newer
jaxlib) runs only on jaxlibs at least that new: :func:`problem` says so
instead of letting XLA fail on the first call.
"""

from __future__ import annotations

import importlib
import os
import re
import sys

#: The oldest jax and jaxlib numbax runs on (see the module docstring).
MIN_JAX = (0, 8, 1)
#: The XLA FFI API (major, minor) that MIN_JAX's jaxlib provides.
MIN_FFI_API = (0, 2)
#: The newest jax the test matrix ran (newer ones are expected to work: the
#: FFI keeps old API versions for at least a year).
TESTED_UP_TO = "0.11.2"

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


def _api(api: tuple[int, int] | None) -> str:
    return "unknown" if api is None else f"{api[0]}.{api[1]}"


def problem(jax_version: str | None, jaxlib_version: str | None,
            built_api: tuple[int, int] | None,
            runtime_api: tuple[int, int] | None,
            built_from: str = "") -> tuple[str, str] | None:
    """(what is wrong, the fix) when this numbax cannot run on this JAX, or
    None when it can (or a version is unknown and nothing can be said).

    ``built_api``: the FFI API numbax._core was compiled against;
    ``runtime_api``: the one the running jaxlib provides.
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
    return None


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
        info = importlib.import_module(f"{__package__}._build_info")
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
