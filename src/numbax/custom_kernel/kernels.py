"""Which kernel an XLACustomKernel call runs: per platform and backend.

Kernel generators are registered per platform (``cpu``, ``gpu``) and
backend name (``numba_cuda``, ...); a call picks the backend given, or the
platform's default. The generator runs once per static arguments and
``outs`` (:func:`kernel_for`), and what it returns is kept on the op, made
with the op's sharding rule where it has one (sharding.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .. import compilers
from ..runtime import numba_bridge
from . import sharding
from .outs import outs_str, outs_struct

if TYPE_CHECKING:
    from .op import XLACustomKernel

#: The backend name of kernels registered with ``def_numba_cuda_kernel``
#: (public as ``numbax.custom_kernel.NUMBA_CUDA``).
NUMBA_CUDA = "numba_cuda"

# The platforms users name (the lowering platforms JAX uses for them are in
# primitive.py).
USER_PLATFORMS = ("cpu", "gpu")
PLATFORM_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu"}


def canonical_platform(platform: Any, op: XLACustomKernel, method: str) -> str:
    """'cpu' or 'gpu' for what users may name; else ValueError naming the op
    and its method."""
    if isinstance(platform, str):
        name = platform.lower()
        if name in PLATFORM_ALIASES:
            return PLATFORM_ALIASES[name]
        if name == "rocm":
            raise ValueError(
                f"{op!r}: {method}: platform 'rocm' is not supported: numbax "
                "runs Numba CUDA kernels on NVIDIA GPUs ('gpu') and, through "
                "Numba's CUDA simulator, on the CPU ('cpu')")
    raise ValueError(
        f"{op!r}: {method}: platform must be 'cpu' or 'gpu' ('cuda' is "
        f"accepted for 'gpu'), got {platform!r}")


def candidates(op: XLACustomKernel, platform: str
               ) -> dict[str, tuple[str, Callable]]:
    """backend -> (platform it was registered for, generator)."""
    found = {b: (platform, g) for b, g in op._kernels[platform].items()}
    if (platform == "cpu" and NUMBA_CUDA in op._kernels["gpu"]
            and NUMBA_CUDA not in found and numba_bridge.simulator_enabled()):
        found[NUMBA_CUDA] = ("gpu", op._kernels["gpu"][NUMBA_CUDA])
    return found


def default(op: XLACustomKernel, platform: str) -> str | None:
    """The backend a call on `platform` runs when it names none."""
    found = candidates(op, platform)
    chosen = op._defaults.get(platform)
    if chosen in found:
        return chosen
    return next(iter(found), None)


def describe(op: XLACustomKernel) -> str:
    parts = []
    for p in USER_PLATFORMS:
        names = list(candidates(op, p))
        if names:
            chosen = default(op, p)
            parts.append(f"{p}: " + ", ".join(
                f"{b} (default)" if b == chosen else b for b in names))
    if not parts:
        return "it has no kernels"
    return "kernels registered: " + "; ".join(parts)


def _no_kernel_message(op: XLACustomKernel, platform: str) -> str:
    have = [f"{p} (backends: {', '.join(candidates(op, p))})"
            for p in USER_PLATFORMS if candidates(op, p)]
    msg = (f"{op!r} has no kernel for platform '{platform}'; "
           + (f"platforms with a kernel: {'; '.join(have)}" if have
              else "it has no kernels"))
    if platform == "cpu" and NUMBA_CUDA in op._kernels["gpu"]:
        msg += (". Its numba_cuda kernel runs on the CPU only through "
                "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 before "
                "numba is imported); or register a CPU kernel with "
                "def_kernel('cpu', ...)")
    return msg


def kernel_for(op: XLACustomKernel, platform: str, backend: str | None, outs,
               out_tree, static) -> Callable:
    """What the generator returns for this call, generated once."""
    with op._lock:
        found = candidates(op, platform)
        if backend is None or not found:
            raise NotImplementedError(_no_kernel_message(op, platform))
        if backend not in found:
            raise NotImplementedError(
                f"{op!r} has no '{backend}' kernel for platform "
                f"'{platform}'; {describe(op)}")
        source_platform, generator = found[backend]
        # Types too: 1, 1.0 and True are equal but may generate
        # different kernels.
        key = (source_platform, backend,
               tuple((k, type(v), v) for k, v in static), outs, out_tree)
        fn = op._generated.get(key)
        if fn is not None:
            return sharding.with_rule(op, fn, outs, out_tree, static)
    try:
        fn = generator(**dict(static), outs=outs_struct(outs, out_tree))
    except Exception as exc:
        args = ", ".join(f"{k}={v!r}" for k, v in static)
        raise sharding.wrap_error(exc, (
            f"{op!r}: the kernel generator of backend '{backend}' "
            f"(platform '{platform}') raised {type(exc).__name__}: {exc} "
            f"[static arguments: {args or 'none'}; outs: "
            f"{outs_str(outs)}]")) from exc
    if compilers.compiler_of(fn) is not None:
        # Callable too, but tracing it fails inside Numba ("Kernel
        # launch configuration was not specified"), naming neither.
        raise TypeError(
            f"{op!r}: the kernel generator of backend '{backend}' "
            f"(platform '{platform}') returned the @cuda.jit kernel "
            f"itself ({type(fn).__name__}), which JAX cannot call; "
            "return numbax.numba_cuda_kernel(kernel, outs, "
            "launch_dims=...) (or grid=..., block=...) instead, the op "
            "that launches it on JAX's arrays")
    if not callable(fn):
        raise TypeError(
            f"{op!r}: the kernel generator of backend '{backend}' "
            f"returned {type(fn).__name__}, not a function of the inputs "
            "(e.g. numbax.numba_cuda_kernel(...))")
    # A numbax op made without name= takes this op's name in profiles
    # (HLO and NVTX): its kernel is usually a closure of the generator.
    if getattr(fn, "name", "") is None and \
            getattr(fn, "_profile_tag", "") is None:
        fn._profile_tag = op.name
    with op._lock:
        fn = op._generated.setdefault(key, fn)
    return sharding.with_rule(op, fn, outs, out_tree, static)
