"""The implementations of op(x) = 2*x + 1 (float32) that the suite compares.

Each one is an :class:`Impl` whose ``make(n)`` returns a function of one JAX
array, usable inside ``jax.jit``. ``make`` raises :class:`Unavailable` when the
implementation cannot exist in this environment (a missing API, no GPU): the
suite reports those as "n/a" or "skipped", not as failures.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from typing import Any

import jax
import numpy as np

THREADS_PER_BLOCK = 256

# How each row is compared in the chain benchmark: rows that XLA may record
# into a CUDA graph are compared with the native handler that allows it too.
VS_PLAIN = "native"
VS_CMD_BUFFER = "native_cmdbuf"


class Unavailable(Exception):
    """This implementation cannot run here; the message says why."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status  # "n/a" or "skipped"
        self.reason = reason


@dataclass
class Env:
    """What the implementations need to know about this process."""
    on_gpu: bool
    native: object | None = None       # native.NativeTargets
    native_error: str | None = None    # why the native build failed


@dataclass
class Impl:
    name: str                  # key for --only and the JSON
    label: str                 # row label in the table
    make: Callable[[int], Callable]
    compare_to: str            # VS_PLAIN or VS_CMD_BUFFER
    bandwidth: bool            # part of the bandwidth benchmark


def _spec(n: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((n,), np.float32)


def _require_gpu(env: Env):
    if not env.on_gpu:
        raise Unavailable("skipped", "no GPU")


# ---------------------------------------------------------------------------
# The Numba kernel every Numba-based row launches (compiled once per process).

def affine_kernel():
    from .kernels import affine  # imports numba: only once the suite runs
    return affine


def warm_numba_kernel(env: Env) -> None:
    """Compiles and loads the kernel for 1-D float32 arrays before any XLA run,
    so no module load happens while XLA captures a stream into a graph."""
    from numba import cuda
    x = cuda.to_device(np.zeros(THREADS_PER_BLOCK, np.float32))
    y = cuda.device_array_like(x)
    affine_kernel()[1, THREADS_PER_BLOCK](x, y)
    if env.on_gpu:
        cuda.synchronize()


def _launcher():
    """The func the callable and buffer_callback rows run per call, as users
    write it: the kernel bound once, the grid computed from the array. (An
    earlier version imported the kernel inside func on every call, about
    1 us of Python per call that no user code pays.)"""
    kernel = affine_kernel()

    def launch(x, y, stream):
        kernel[(x.size + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK,
               THREADS_PER_BLOCK, stream](x, y)
    return launch


# ---------------------------------------------------------------------------
# Native CUDA C++ FFI handlers.

def _native(env: Env, which: str):
    _require_gpu(env)
    if env.native is None:
        raise RuntimeError(f"native handler build failed: {env.native_error}")
    target = getattr(env.native, which)

    def make(n):
        call = jax.ffi.ffi_call(target, _spec(n))
        return lambda x: call(x)
    return make


# ---------------------------------------------------------------------------
# numbax.

def _numbax_kernel(env: Env):
    # No GPU check: on the CPU backend the kernel runs through the simulator.
    def make(n):
        import numbax
        return numbax.numba_cuda_kernel(affine_kernel(), _spec(n), launch_dims=n,
                                        threads_per_block=THREADS_PER_BLOCK)
    return make


def _numbax_callable(env: Env, capture: bool, fast_launch: bool = True):
    def make(n):
        import numbax
        kwargs: dict[str, Any] = {}
        if not fast_launch:
            # The same callable with every launch through Numba's Python
            # launch: the plain path as it was before fast launches.
            if "fast_launch" not in inspect.signature(
                    numbax.numba_cuda_callable).parameters:
                raise Unavailable("n/a", "numba_cuda_callable has no fast_launch=")
            kwargs["fast_launch"] = False
        if capture:
            params = inspect.signature(numbax.numba_cuda_callable).parameters
            if "capture" not in params and not any(
                    p.kind is p.VAR_KEYWORD for p in params.values()):
                raise Unavailable("n/a", "numba_cuda_callable has no capture=")
            kwargs["capture"] = True
        try:
            return numbax.numba_cuda_callable(_launcher(), _spec(n), **kwargs)
        except TypeError as exc:
            if capture and "capture" in str(exc):
                raise Unavailable("n/a", f"capture=True rejected: {exc}") from exc
            raise
    return make


# ---------------------------------------------------------------------------
# numbax with numba-cuda-mlir's compiler: the same kernel and launches.

def _mlir_kernel(env: Env):
    """kernels_mlir.affine, or Unavailable: GPU only (it has no simulator),
    and an optional dependency."""
    _require_gpu(env)
    from ..compilers import numba_cuda_mlir as _mlir
    if _mlir.version() is None:
        raise Unavailable("n/a", "numba-cuda-mlir is not installed")
    from .kernels_mlir import affine
    return affine


def _numbax_mlir_kernel(env: Env):
    def make(n):
        import numbax
        return numbax.numba_cuda_kernel(_mlir_kernel(env), _spec(n),
                                        launch_dims=n,
                                        threads_per_block=THREADS_PER_BLOCK)
    return make


def _numbax_mlir_callable(env: Env):
    def make(n):
        import numbax
        kernel = _mlir_kernel(env)

        def launch(x, y, stream):  # as _launcher, numbax's stream passed on
            kernel[(x.size + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK,
                   THREADS_PER_BLOCK, stream](x, y)
        return numbax.numba_cuda_callable(launch, _spec(n))
    return make


# ---------------------------------------------------------------------------
# jax.experimental.buffer_callback + Numba's foreign-array interop.

def _buffer_callback(env: Env, command_buffer: bool):
    def make(n):
        _require_gpu(env)
        try:
            from jax.experimental.buffer_callback import buffer_callback
        except ImportError as exc:
            raise Unavailable(
                "n/a", f"no jax.experimental.buffer_callback: {exc}") from exc
        if command_buffer and "command_buffer_compatible" not in \
                inspect.signature(buffer_callback).parameters:
            raise Unavailable("n/a", "buffer_callback has no command_buffer_compatible")
        from numba import cuda
        launch = _launcher()

        def callback(ctx, out, x):
            stream = cuda.external_stream(ctx.stream)
            launch(cuda.as_cuda_array(x), cuda.as_cuda_array(out), stream)

        kwargs = {"command_buffer_compatible": True} if command_buffer else {}
        return buffer_callback(callback, _spec(n), **kwargs)
    return make


# ---------------------------------------------------------------------------
# jax.pure_callback: a host round trip through numpy.

def _pure_callback(env: Env):
    two, one = np.float32(2), np.float32(1)

    def host(x):
        return two * np.asarray(x, np.float32) + one

    def make(n):
        spec = _spec(n)
        return lambda x: jax.pure_callback(host, spec, x)
    return make


def all_impls(env: Env) -> list[Impl]:
    """Every row of the table, in table order (native baselines first)."""
    def native(which):
        # Defer the GPU/build check to make(), so it is reported per row.
        return lambda n: _native(env, which)(n)

    return [
        Impl("native", "native FFI (plain)", native("plain"), VS_PLAIN, True),
        Impl("native_cmdbuf", "native FFI (cmd-buffer)", native("cmd_buffer"),
             VS_CMD_BUFFER, True),
        Impl("numbax_kernel", "numbax kernel", _numbax_kernel(env),
             VS_CMD_BUFFER, True),
        Impl("numbax_callable", "numbax callable", _numbax_callable(env, False),
             VS_PLAIN, True),
        Impl("numbax_callable_numba", "numbax callable (Numba launch)",
             _numbax_callable(env, False, fast_launch=False), VS_PLAIN, False),
        Impl("numbax_capture", "numbax callable capture",
             _numbax_callable(env, True), VS_CMD_BUFFER, True),
        Impl("numbax_kernel_mlir", "numbax kernel (numba-cuda-mlir)",
             _numbax_mlir_kernel(env), VS_CMD_BUFFER, False),
        Impl("numbax_callable_mlir", "numbax callable (numba-cuda-mlir)",
             _numbax_mlir_callable(env), VS_PLAIN, False),
        Impl("buffer_callback", "buffer_callback", _buffer_callback(env, False),
             VS_PLAIN, False),
        Impl("buffer_callback_cmdbuf", "buffer_callback (cmd-buffer)",
             _buffer_callback(env, True), VS_CMD_BUFFER, False),
        Impl("pure_callback", "pure_callback (numpy)", _pure_callback(env),
             VS_PLAIN, False),
    ]
