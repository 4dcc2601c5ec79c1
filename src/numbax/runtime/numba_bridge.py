"""Numba's side of the bridge: imports, and the objects built around XLA's memory.

The C++ handlers call the ``*_hook`` functions below only on cache misses: a
hit hands the same Numba array or stream back without running any Python.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
import traceback
from typing import Any

import numpy as np

_INSTALL_HINT = (
    "install it with `pip install numba numba-cuda cuda-bindings 'numpy<2.5'`; "
    "set NUMBA_ENABLE_CUDASIM=1 (before numba is imported) to run the same "
    "kernels on the CPU through Numba's CUDA simulator"
)


def simulator_enabled() -> bool:
    """True when Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1)."""
    try:
        from numba import config
    except ImportError:
        return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    return bool(config.ENABLE_CUDASIM)


def require_cuda():
    """Returns ``numba.cuda``, or raises ImportError saying what to install."""
    try:
        from numba import cuda
    except Exception as exc:  # numba missing, numba-cuda missing or broken
        raise ImportError(
            f"numbax needs Numba with CUDA support ({type(exc).__name__}: "
            f"{exc}); {_INSTALL_HINT}") from exc
    _check_numpy()
    if not simulator_enabled():
        hold_deallocations_at_exit()
    return cuda


def watch_host_copies(driver: Any = None, note: Any = None) -> bool:
    """Wraps Numba's ``device_to_host`` (which ``copy_to_host()`` and a
    device array's element read go through) so that each copy first tells
    numbax's C++ core (``note``: ``_core.note_device_to_host``). A capture-
    mode call site whose func copies while it is recorded would freeze the
    value it read into the graph; C++ then never captures it again
    (csrc/capture_handler.cc). Outside a recording the note is a no-op.
    `driver`: Numba's driver module (a stand-in in tests). Returns whether
    the wrapper is installed (once per driver module)."""
    if driver is None:
        if simulator_enabled():
            return False  # the simulator has no graphs to freeze values in
        from numba.cuda.cudadrv import driver as numba_driver
        driver = numba_driver
    original = getattr(driver, "device_to_host", None)
    if original is None:
        return False
    if getattr(original, "_numbax_watched", False):
        return True
    if note is None:
        from .. import _core
        note = _core.note_device_to_host

    @functools.wraps(original)
    def device_to_host(*args, **kwargs):
        note()
        return original(*args, **kwargs)

    device_to_host._numbax_watched = True  # type: ignore[attr-defined]
    driver.device_to_host = device_to_host
    return True


_exit_hold_registered = False
_held_deallocations: list = []


def hold_deallocations_at_exit() -> None:
    """Registers (once, after numba.cuda is imported) an exit hook that stops
    Numba flushing its pending deallocations while the process exits.

    numba-cuda 0.30 loads a kernel used on two devices as one library
    wrapped by a module per context, and at exit each module's finalizer
    queues an unload of that one library; a flush of both contexts' queues
    then unloads it twice, a double free inside the driver that aborts the
    process after its work is done (with two GPUs). The driver frees
    everything at exit anyway. atexit runs hooks last-registered first, so
    this one, registered after numba.cuda registered its own, runs before
    the weakref finalizers that queue the unloads."""
    global _exit_hold_registered
    if _exit_hold_registered:
        return
    _exit_hold_registered = True
    import atexit
    atexit.register(_hold_numba_deallocations)


def _hold_numba_deallocations() -> None:
    try:
        from numba.cuda.cudadrv import driver as numba_driver
        # Only devices Numba has already set up: never start CUDA at exit.
        devices = list(numba_driver.driver.devices.values())
    except Exception:  # noqa: BLE001 - nothing to hold
        return
    for device in devices:
        context = getattr(device, "primary_context", None)
        if context is None:
            continue
        queues = [getattr(context, "deallocations", None),
                  getattr(getattr(context, "memory_manager", None),
                          "deallocations", None)]
        for queue in queues:
            if queue is None:
                continue
            try:
                # Entered and never left: flushing stays off through the
                # exit finalizers. The context manager is kept (collecting
                # it would leave it) until the interpreter's own teardown,
                # when those finalizers have run.
                held = queue.disable()
                held.__enter__()
                _held_deallocations.append(held)
            except Exception:  # noqa: BLE001 - another numba-cuda layout
                pass


def loaded_kernel_handles(compiled) -> dict[int, int]:
    """Device ordinal -> kernel handle, for every device on which Numba has
    already loaded `compiled` (numba-cuda 0.30 keeps its loaded functions in
    CUDACodeLibrary._cufunc_cache, keyed by device id). A kernel compiles,
    and so loads, in whatever context is current when it is traced, which
    on a thread JAX has used may be any device's."""
    library = getattr(compiled, "_codelibrary", None)
    cache = getattr(library, "_cufunc_cache", None)
    if not isinstance(cache, dict):
        return {}
    return {int(device_id): int(cufunc.handle)
            for device_id, cufunc in list(cache.items())}


def _check_numpy() -> None:
    major_minor = tuple(int(p) for p in np.__version__.split(".")[:2])
    if major_minor >= (2, 5):
        try:
            from importlib.metadata import version
            nc = tuple(int(p) for p in version("numba-cuda").split(".")[:2])
        except Exception:
            nc = (0, 0)
        if nc <= (0, 30):
            raise ImportError(
                f"numpy {np.__version__} is too new for numba-cuda "
                f"{'.'.join(map(str, nc))}: it cannot compile kernels "
                "(np.row_stack was removed in numpy 2.5). Fix: "
                "pip install 'numpy<2.5'")


# The 8-bit float types of ml_dtypes that JAX has, each an XLA element type
# the C++ bridge maps (csrc/call_frame.cc, LookupDType): kernels and funcs
# get their bits as uint8 arrays of the same shape, zero copy. Names an
# installed ml_dtypes lacks are skipped.
FLOAT8_NAMES = (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3b11fnuz", "float8_e4m3", "float8_e8m0fnu", "float8_e3m4")
# Types narrower than a byte: XLA may pack several elements into one byte,
# which no Numba array can address. Refused, naming the fix.
SUB_BYTE_BITS = {"int1": 1, "uint1": 1, "int2": 2, "uint2": 2, "int4": 4,
                 "uint4": 4, "float4_e2m1fn": 4}
_UINT8 = np.dtype(np.uint8)
_float8: frozenset | None = None


def float8_dtypes() -> frozenset:
    """The float8 dtypes numbax accepts (those the installed ml_dtypes has)."""
    global _float8
    if _float8 is None:
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - jax depends on ml_dtypes
            _float8 = frozenset()
        else:
            _float8 = frozenset(np.dtype(getattr(ml_dtypes, n))
                                for n in FLOAT8_NAMES if hasattr(ml_dtypes, n))
    return _float8


def is_float8(dtype) -> bool:
    try:
        return np.dtype(dtype) in float8_dtypes()
    except TypeError:
        return False


def kernel_dtype(dtype) -> np.dtype:
    """The dtype of the array a kernel (or func) gets for a buffer of
    `dtype`: uint8 for a float8 buffer (its bits), else `dtype` itself."""
    dt = np.dtype(dtype)
    return _UINT8 if dt in float8_dtypes() else dt


def numba_type_for(dtype: np.dtype):
    """The Numba scalar type for a numpy dtype, or None if Numba lacks one.

    numba-cuda's own numpy support comes first: it types
    ``ml_dtypes.bfloat16`` (as ``types.bfloat16``), which core Numba's does
    not. Core Numba's is the fallback for numba-cuda releases without it.
    A float8 dtype is typed as uint8: kernels get its bits.
    """
    dt = kernel_dtype(dtype)
    try:
        from numba.cuda.np import numpy_support as cuda_support
        return cuda_support.from_dtype(dt)
    except Exception:
        pass
    from numba.np import numpy_support
    try:
        return numpy_support.from_dtype(dt)
    except Exception:
        return None


# bfloat16 arithmetic needs compute capability 8.0 (Ampere) or newer.
BFLOAT16_MIN_CC = (8, 0)


def has_bfloat16(dtypes) -> bool:
    return any(np.dtype(d).name == "bfloat16" for d in dtypes)


def bfloat16_problem(capabilities: dict) -> str | None:
    """Why bfloat16 cannot run on these devices ({ordinal: (major, minor)}),
    or None when every one can."""
    old = {d: cc for d, cc in capabilities.items()
           if tuple(cc) < BFLOAT16_MIN_CC}
    if not old:
        return None
    listed = ", ".join(f"GPU {d} (compute capability {cc[0]}.{cc[1]})"
                       for d, cc in sorted(old.items()))
    return (f"bfloat16 needs compute capability >= "
            f"{BFLOAT16_MIN_CC[0]}.{BFLOAT16_MIN_CC[1]} (Ampere or newer), "
            f"but {listed} is older; convert the bfloat16 arrays with "
            ".astype(jnp.float32) (or float16) before the op, or run on a "
            "newer GPU")


def check_bfloat16_devices(op: str) -> None:
    """ValueError naming `op` if a visible GPU cannot run bfloat16 code."""
    if simulator_enabled():
        return
    from numba import cuda
    caps = {}
    for ordinal in range(len(cuda.gpus)):
        caps[ordinal] = tuple(cuda.gpus[ordinal].compute_capability)
    why = bfloat16_problem(caps)
    if why is not None:
        raise ValueError(f"{op}: {why}")


# ---------------------------------------------------------------------------
# Hooks called from C++ (cache misses only).

def device_array_hook(ptr: int, shape: tuple, dtype: str, device: int):
    """A Numba device array over XLA's buffer: zero copy, never freed by Numba."""
    from numba import cuda
    from numba.cuda.cudadrv import driver

    dt = np.dtype(dtype) if dtype != "bfloat16" else _bfloat16()
    # The C++ handler made the primary context of `device` current.
    ctx = cuda.current_context()
    nbytes = math.prod(shape) * dt.itemsize
    memory = driver.MemoryPointer(ctx, driver.binding.CUdeviceptr(ptr), nbytes)
    strides = _c_strides(shape, dt.itemsize)
    # Every view Numba makes of the array refers to `memory` strongly (a
    # reshape shares it; a slice's MemoryPointer keeps it as its owner), so
    # its reference count tells numbax whether func kept one. C++ sets the
    # array's stream to func's on every call (call_site.cc, BindStream).
    return _xla_array_type()(shape, strides, dt, gpu_data=memory), memory


_XlaArray = None
_XLA_ARRAY_LOCK = threading.Lock()


def _xla_array_type():
    """DeviceNDArray for the arrays numbax hands func, whose views all keep
    the array's stream. Numba's array methods that do device work (a 2-D
    ``.T``, ``copy_to_host``, scalar assignment) run on the array's stream;
    numbax binds func's arrays to func's stream so that work is ordered with
    XLA's. Slices, ``ravel``, ``view`` and ``squeeze`` keep the stream in
    Numba already (the last two as plain DeviceNDArrays, which the fast
    launch path accepts too); ``reshape`` drops it, and keeps it here."""
    global _XlaArray
    if _XlaArray is not None:
        return _XlaArray
    # One class for the process, even if XLA threads make their first
    # arrays at once: the fast launch path compares the arrays' type.
    with _XLA_ARRAY_LOCK:
        if _XlaArray is not None:
            return _XlaArray
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        class XlaDeviceArray(DeviceNDArray):
            """A Numba device array over one of XLA's buffers (numbax)."""

            def reshape(self, *newshape, **kws):
                view = super().reshape(*newshape, **kws)
                view.stream = self.stream
                return view

        _XlaArray = XlaDeviceArray
    return _XlaArray


class _ReadOnlyInput(np.ndarray):
    """An input in the simulator: XLA's input buffers are immutable values.

    Being a subclass also stops numpy's base collapsing here, so every view
    of the input refers to this array (numbax's kept-view check counts its
    references).
    """

    numbax_input = -1

    def __array_finalize__(self, obj):
        self.numbax_input = getattr(obj, "numbax_input", -1)

    def __setitem__(self, index, value):
        if self.flags.writeable:
            # A copy of the input (copy_to_host, astype): func's own.
            return super().__setitem__(index, value)
        raise ValueError(
            f"func wrote to input {self.numbax_input}, which is read-only: "
            "an input is an immutable JAX value that other ops (and the "
            "caller) may still read. Write results into an output, or alias "
            "the input to an output with input_output_aliases={"
            f"{self.numbax_input}: output index}} to update it in place")


def _viewed_input(arg):
    """The index of the read-only input `arg` is a numpy view of, or None.

    Slicing a reshaped input (``y.reshape(n)[:8]``), ``np.asarray(y)`` and
    the like give bare numpy arrays, not simulator arrays."""
    if (not isinstance(arg, np.ndarray) or arg.flags.writeable
            or arg.ndim == 0):
        return None
    obj: object = arg
    for _ in range(64):  # numpy's base chains are short
        if isinstance(obj, _ReadOnlyInput):
            return obj.numbax_input
        if isinstance(obj, np.ndarray):
            obj = obj.base
        elif isinstance(obj, tuple):
            # np.asarray(input) (numpy reads the simulator array's
            # __array_struct__): its base is (the simulator array, capsule).
            obj = obj[0] if obj else None
        else:
            # A simulator array (FakeCUDAArray): the numpy array it wraps.
            obj = getattr(obj, "__dict__", {}).get("_ary")
    return None


def simulator_launch_args(args):
    """The arguments of a kernel launch in the simulator, with every bare
    numpy view of a read-only input made a simulator array over the same
    memory.

    Numba's simulator copies a numpy argument to a device array and back
    after the launch: back into the read-only input, which failed with
    "assignment destination is read-only" even when the kernel only read
    it. As a simulator array it is passed as it is (as a device array's
    view is on a GPU), and a write by the kernel raises numbax's error
    naming the input."""
    if not any(_viewed_input(a) is not None for a in args):
        return args
    out = []
    for a in args:
        index = _viewed_input(a)
        if index is not None:
            view = a.view(_ReadOnlyInput)
            view.numbax_input = index
            a = _input_array_type()(view)
        out.append(a)
    return tuple(out)


def host_array_hook(ptr: int, shape: tuple, dtype: str, read_only_input=-1):
    """A simulator array over XLA's host buffer: zero copy, written in place.

    ``read_only_input`` >= 0: the buffer is that (non-aliased) input, handed
    out read-only. Returns (array, root) as device_array_hook does.
    """
    if not simulator_enabled():
        raise RuntimeError(
            "this numbax op runs on JAX's CPU backend, which needs Numba's "
            "CUDA simulator: set NUMBA_ENABLE_CUDASIM=1 before numba is "
            "imported, or run the program on a GPU")
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    dt = np.dtype(dtype) if dtype != "bfloat16" else _bfloat16()
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes == 0:
        array = np.empty(shape, dt)
    else:
        raw = (ctypes.c_char * nbytes).from_address(ptr)
        array = np.frombuffer(raw, dtype=dt).reshape(shape)
    if read_only_input >= 0:
        view = array.view(_ReadOnlyInput)
        view.numbax_input = read_only_input
        view.flags.writeable = False
        return _input_array_type()(view), view
    # Every view of `array` refers to its base (numpy collapses view chains
    # to the array over the foreign buffer): the root numbax counts.
    root = array if array.base is None else array.base
    return FakeCUDAArray(array), root


_InputArray = None


def _input_array_type():
    """FakeCUDAArray for read-only inputs, whose slices stay simulator
    arrays (FakeCUDAArray wraps only exact ndarrays, not subclasses)."""
    global _InputArray
    if _InputArray is None:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        class InputArray(FakeCUDAArray):
            def __getitem__(self, idx):
                ret = self._ary[idx]
                if isinstance(ret, np.ndarray):
                    return InputArray(ret, stream=self.stream)
                return ret

        _InputArray = InputArray
    return _InputArray


def device_stream_hook(ptr: int, device: int):
    from numba import cuda
    return cuda.external_stream(ptr)


def host_stream_hook():
    from numba import cuda
    return cuda.stream()


def format_exception_hook(exc: BaseException) -> str:
    text = "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__))
    # C++ needs UTF-8: a lone surrogate in the message would otherwise make
    # the whole text (and its traceback) unprintable.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _c_strides(shape, itemsize):
    strides = []
    stride = itemsize
    for d in reversed(shape):
        strides.append(stride)
        stride *= d
    return tuple(reversed(strides))


def _bfloat16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)
