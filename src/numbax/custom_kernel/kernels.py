"""Which kernel an XLACustomKernel call runs: per platform and backend.

Kernel generators are registered per platform (``cpu``, ``gpu``) and
backend name (``numba_cuda``, ...); a call picks the backend given, or the
platform's default. The generator runs once per static arguments and
``outs`` (:meth:`KernelTable.generate`), and what it returns is kept in the
table: the most recently used MAX_GENERATED, each one evicted released once
no compiled program holds it. The op holds one :class:`KernelTable`
(``op.kernels``), which owns all of this under its lock.

A new kind of platform kernel (``def_numba_kernel`` for the CPU, say) is
one more ``def_*`` method on the op, as ``def_numba_cuda_kernel`` is:
``return self.def_kernel("cpu", generator, backend=NAME,
asdefault=asdefault)``, with ``NAME`` a constant here beside ``NUMBA_CUDA``.
A kernel that also serves another platform (as the ``numba_cuda`` one
serves the CPU under the simulator) says so in :meth:`KernelTable.candidates`;
a new platform (one JAX lowers under another name) also needs
``USER_PLATFORMS``, ``PLATFORM_ALIASES`` and primitive.py's
``_LOWERING_PLATFORMS``.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator

from .. import compilers
from ..runtime import numba_bridge
from .outs import outs_str, outs_struct
from .sharding import wrap_error

#: The backend name of kernels registered with ``def_numba_cuda_kernel``
#: (public as ``numbax.custom_kernel.NUMBA_CUDA``).
NUMBA_CUDA = "numba_cuda"
#: The backend name of kernels registered with ``def_numba_kernel`` (a
#: ``numbax.numba_kernel`` op on JAX's CPU backend; public as
#: ``numbax.custom_kernel.NUMBA``).
NUMBA = "numba"

# The platforms users name (the lowering platforms JAX uses for them are in
# primitive.py).
USER_PLATFORMS = ("cpu", "gpu")
PLATFORM_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu"}

# What a generator returned (one per platform, backend, static arguments
# and outs) that each op keeps alive, most recently used last. Each holds a
# compiled kernel (on the GPU), and an op called with ever new static values
# or shapes would grow without bound; an evicted one is released once no
# compiled program holds it, and generated again when a call needs it.
MAX_GENERATED = 256

# {id(table): backends} while a user rule of an op runs: calls of the same
# op inside the rule (a JVP or transpose that applies the op to a tangent)
# use the backends of the call being differentiated or batched, not the
# defaults.
_inherited_backends: contextvars.ContextVar[dict] = contextvars.ContextVar(
    "numbax_inherited_backends", default={})


def canonical_platform(platform: Any, label: str, method: str) -> str:
    """'cpu' or 'gpu' for what users may name; else ValueError naming the op
    (`label`) and its method."""
    if isinstance(platform, str):
        name = platform.lower()
        if name in PLATFORM_ALIASES:
            return PLATFORM_ALIASES[name]
        if name == "rocm":
            raise ValueError(
                f"{label}: {method}: platform 'rocm' is not supported: numbax "
                "runs Numba CUDA kernels on NVIDIA GPUs ('gpu') and, through "
                "Numba's CUDA simulator, on the CPU ('cpu')")
    raise ValueError(
        f"{label}: {method}: platform must be 'cpu' or 'gpu' ('cuda' is "
        f"accepted for 'gpu'), got {platform!r}")


def _is_njit(fn: Any) -> bool:
    """Whether `fn` is a Numba @njit dispatcher (numba not imported here:
    such a kernel exists only once numba is)."""
    import sys
    registry = sys.modules.get("numba.core.registry")
    return registry is not None and isinstance(fn, registry.CPUDispatcher)


class KernelTable:
    """One XLACustomKernel's kernels: the generators per platform and
    backend, each platform's default, and what the generators returned.

    `label` names the op in messages (its repr), `name` is the op's name
    (the profile name of its calls of the numbax ops its generators return:
    primitive.py names each call so, never the op, which may be shared).
    """

    def __init__(self, label: str, name: str):
        self._label = label
        self._name = name
        self._lock = threading.RLock()
        # platform -> {backend: generator}, in registration order.
        self._generators: dict[str, dict[str, Callable]] = {
            p: {} for p in USER_PLATFORMS}
        self._defaults: dict[str, str] = {}
        # What the generators returned, the most recently used
        # MAX_GENERATED kept alive here: a program being compiled names the
        # numbax ops inside by key, and the registry holds their functions
        # only weakly (a compiled one holds its ops itself).
        self._generated: OrderedDict[tuple, Callable] = OrderedDict()
        # All of them while they live (an evicted one a compiled program
        # still holds): found again rather than generated twice.
        self._alive: weakref.WeakValueDictionary[tuple, Callable] = \
            weakref.WeakValueDictionary()

    # -- registration ------------------------------------------------------

    def register(self, platform: str, generator: Callable, *, backend: str,
                 asdefault: bool = False) -> None:
        """Registers `generator` for `platform` (canonical) under `backend`,
        replacing one registered there before (and what it generated)."""
        if not callable(generator):
            raise TypeError(
                f"{self._label}: kernel_generator must be callable, got "
                f"{type(generator).__name__}: {generator!r}")
        if compilers.compiler_of(generator) is not None:
            # A kernel is callable too, but calling it with the op's
            # keyword arguments fails far from here.
            raise TypeError(
                f"{self._label}: kernel_generator is a @cuda.jit kernel "
                f"({type(generator).__name__}), not a generator; pass "
                "a function of the static keyword arguments and outs that "
                "returns numbax.numba_cuda_kernel(kernel, outs, ...) (numba-cuda "
                "and numba-cuda-mlir kernels alike)")
        if not isinstance(backend, str) or not backend:
            raise TypeError(
                f"{self._label}: backend must be a non-empty string, got "
                f"{backend!r}")
        with self._lock:
            self._generators[platform][backend] = generator
            # A replaced generator must not keep serving its old kernels.
            for table in (self._generated, self._alive):
                for key in [k for k in list(table.keys())
                            if k[0] == platform and k[1] == backend]:
                    table.pop(key, None)
            if asdefault or platform not in self._defaults:
                self._defaults[platform] = backend

    def set_default(self, platform: str, backend: str) -> None:
        """Makes `backend` the default of `platform` (canonical)."""
        with self._lock:
            if backend not in self.candidates(platform):
                raise ValueError(
                    f"{self._label}: no '{backend}' kernel for platform "
                    f"'{platform}'; {self.describe()}")
            self._defaults[platform] = backend

    # -- what there is -----------------------------------------------------

    def candidates(self, platform: str) -> dict[str, tuple[str, Callable]]:
        """backend -> (platform it was registered for, generator)."""
        with self._lock:
            found = {b: (platform, g)
                     for b, g in self._generators[platform].items()}
            gpu = self._generators["gpu"]
            if (platform == "cpu" and NUMBA_CUDA in gpu
                    and NUMBA_CUDA not in found
                    and numba_bridge.simulator_enabled()):
                found[NUMBA_CUDA] = ("gpu", gpu[NUMBA_CUDA])
            return found

    def default(self, platform: str) -> str | None:
        """The backend a call on `platform` runs when it names none."""
        with self._lock:
            found = self.candidates(platform)
            chosen = self._defaults.get(platform)
            if chosen in found:
                return chosen
            return next(iter(found), None)

    def describe(self) -> str:
        parts = []
        for p in USER_PLATFORMS:
            names = list(self.candidates(p))
            if names:
                chosen = self.default(p)
                parts.append(f"{p}: " + ", ".join(
                    f"{b} (default)" if b == chosen else b for b in names))
        if not parts:
            return "it has no kernels"
        return "kernels registered: " + "; ".join(parts)

    def _no_kernel_message(self, platform: str) -> str:
        have = [f"{p} (backends: {', '.join(self.candidates(p))})"
                for p in USER_PLATFORMS if self.candidates(p)]
        msg = (f"{self._label} has no kernel for platform '{platform}'; "
               + (f"platforms with a kernel: {'; '.join(have)}" if have
                  else "it has no kernels"))
        if platform == "cpu" and NUMBA_CUDA in self._generators["gpu"]:
            msg += (". Its numba_cuda kernel runs on the CPU only through "
                    "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 before "
                    "numba is imported); or register a CPU kernel with "
                    "def_kernel('cpu', ...)")
        return msg

    # -- one call ----------------------------------------------------------

    def backends(self, backend: str | None
                 ) -> tuple[tuple[str, str | None], ...]:
        """The (platform, backend) pairs a call runs: `backend` on every
        platform, else the backends of the call whose rule is running
        (:meth:`inheriting`), else each platform's default (None where a
        platform has no kernel)."""
        with self._lock:
            if not any(self._generators.values()):
                raise NotImplementedError(
                    f"{self._label} has no kernels: register one with "
                    "def_numba_cuda_kernel(...) or def_kernel(...)")
            if backend is not None:
                known = {b for p in USER_PLATFORMS
                         for b in self.candidates(p)}
                if backend not in known:
                    raise ValueError(
                        f"{self._label}: unknown backend {backend!r}; "
                        f"{self.describe()}")
                return tuple((p, backend) for p in USER_PLATFORMS)
            inherited = _inherited_backends.get().get(id(self))
            if inherited is not None:
                return inherited
            return tuple((p, self.default(p)) for p in USER_PLATFORMS)

    @contextlib.contextmanager
    def inheriting(self, backends) -> Iterator[None]:
        """While a user rule of the op runs (differentiation.py, vmap.py):
        its calls of the op use `backends`."""
        token = _inherited_backends.set(
            {**_inherited_backends.get(), id(self): backends})
        try:
            yield
        finally:
            _inherited_backends.reset(token)

    def generate(self, platform: str, backend: str | None, outs, out_tree,
                 static) -> Callable:
        """What the generator returns for this call, generated once."""
        label = self._label
        with self._lock:
            found = self.candidates(platform)
            if backend is None or not found:
                raise NotImplementedError(self._no_kernel_message(platform))
            if backend not in found:
                raise NotImplementedError(
                    f"{label} has no '{backend}' kernel for platform "
                    f"'{platform}'; {self.describe()}")
            source_platform, generator = found[backend]
            # Types too: 1, 1.0 and True are equal but may generate
            # different kernels.
            key = (source_platform, backend,
                   tuple((k, type(v), v) for k, v in static), outs, out_tree)
            fn = self._known(key)
            if fn is not None:
                return self._keep(key, fn)
        try:
            fn = generator(**dict(static), outs=outs_struct(outs, out_tree))
        except Exception as exc:
            args = ", ".join(f"{k}={v!r}" for k, v in static)
            raise wrap_error(exc, (
                f"{label}: the kernel generator of backend '{backend}' "
                f"(platform '{platform}') raised {type(exc).__name__}: {exc} "
                f"[static arguments: {args or 'none'}; outs: "
                f"{outs_str(outs)}]")) from exc
        if compilers.compiler_of(fn) is not None:
            # Callable too, but tracing it fails inside Numba ("Kernel
            # launch configuration was not specified"), naming neither.
            raise TypeError(
                f"{label}: the kernel generator of backend '{backend}' "
                f"(platform '{platform}') returned the @cuda.jit kernel "
                f"itself ({type(fn).__name__}), which JAX cannot call; "
                "return numbax.numba_cuda_kernel(kernel, outs, "
                "launch_dims=...) (or grid=..., block=...) instead, the op "
                "that launches it on JAX's arrays")
        if _is_njit(fn):
            # Callable too, but Numba cannot type JAX's tracers.
            raise TypeError(
                f"{label}: the kernel generator of backend '{backend}' "
                f"(platform '{platform}') returned the @njit kernel itself, "
                "which JAX cannot call; return numbax.numba_kernel(kernel, "
                "outs) instead, the op that runs it on JAX's arrays")
        if not callable(fn):
            raise TypeError(
                f"{label}: the kernel generator of backend '{backend}' "
                f"returned {type(fn).__name__}, not a function of the inputs "
                "(e.g. numbax.numba_cuda_kernel(...))")
        with self._lock:
            # Another thread may have generated it meanwhile: one wins.
            known = self._known(key)
            return self._keep(key, fn if known is None else known)

    def _known(self, key: tuple) -> Callable | None:
        """What the generator returned for `key`, if it is kept or alive."""
        fn = self._generated.get(key)
        return self._alive.get(key) if fn is None else fn

    def _keep(self, key: tuple, fn: Callable) -> Callable:
        """Keeps `fn` as the most recently used (with the lock held),
        releasing the least recently used beyond MAX_GENERATED."""
        self._generated[key] = fn
        self._generated.move_to_end(key)
        try:
            self._alive[key] = fn
        except TypeError:  # not weak-referenceable: kept while in the LRU
            pass
        while len(self._generated) > max(1, MAX_GENERATED):
            self._generated.popitem(last=False)
        return fn

    def kept(self) -> list[Callable]:
        """What the generators returned that the table keeps alive, least
        recently used first (at most MAX_GENERATED)."""
        with self._lock:
            return list(self._generated.values())
