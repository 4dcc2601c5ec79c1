"""What every numbax op is to the rest of numbax.

``numba_cuda_kernel`` and ``numba_cuda_callable`` return ops of their own
classes (kernel/op.py, callable/op.py); both derive from :class:`Op`, which
says what other parts ask of an op without importing its family: the
registry builds a key's entry through it and drops what it caches,
``XLACustomKernel`` (custom_kernel/) names it in profiles, remakes it with a
sharding rule and vmaps it.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import Any, Iterator


def qualified_name(obj: Any) -> str:
    """``obj``'s ``__qualname__`` (a function, a Numba dispatcher's
    ``py_func``), else its name, else its type's."""
    obj = getattr(obj, "py_func", obj)
    return (getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
            or type(obj).__qualname__)


# (op, name) while an XLACustomKernel traces the op its generator returned:
# that use of the op is named after the XLACustomKernel (use_name).
_use: contextvars.ContextVar[tuple[Any, str] | None] = contextvars.ContextVar(
    "numbax_op_use", default=None)


@contextlib.contextmanager
def named_use(op: Any, name: str) -> Iterator[None]:
    """While it lasts, the calls of `op` traced (on this thread) are named
    `name` in profiles, where `op` has no ``name=`` of its own: an
    XLACustomKernel names the op its generator returned so (custom_kernel/
    primitive.py, vmap.py). The name belongs to the use, not to the op: the
    same op, interned and shared by two XLACustomKernels or used plainly
    too, is named after each in its own calls."""
    token = _use.set((op, name))
    try:
        yield
    finally:
        _use.reset(token)


# Ops by value (each family's identity tuple, with its class); an entry
# goes with its op.
_interned: "weakref.WeakValueDictionary[tuple, Any]" = \
    weakref.WeakValueDictionary()


def interned(op: Any, identity: tuple | None) -> Any:
    """The live op equal to `op` (same class and `identity`), else `op`.

    An op is a static parameter of its primitive, so JAX's caches key
    compiled programs on it: ops re-created with the same function, outs
    and options (a helper that builds the op per call) must be one object,
    or every call compiles, and keeps, a new program and its own compiled
    kernels (measured on numba_kernel: 290 ms and 2 MiB per re-creation).
    `identity` is None where it is unhashable: the op is then its own."""
    if identity is None:
        return op
    return _interned.setdefault((type(op), identity), op)


class ByValue:
    """Equal and hashed by an identity tuple (what :func:`interned` keys
    on): ops re-created with the same configuration compare equal."""

    _identity: tuple | None = None
    _hash: int = 0

    def _set_identity(self, identity: tuple | None) -> None:
        """Keeps `identity`, or None where it is unhashable (the op is then
        equal only to itself). Hashed once: JAX hashes the op, a primitive
        parameter, on every eager bind."""
        try:
            self._hash = hash(identity)
        except TypeError:
            identity, self._hash = None, id(self)
        self._identity = identity

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self) or self._identity is None:
            return False
        return self._identity == other._identity  # type: ignore[attr-defined]


def outs_identity(outs_fn: Any, out_specs: Any) -> Any:
    """An op's outs in its identity: a shape function by object, else each
    output's shape and dtype name (keys.dtype_name, not .str: seven float8
    types share '<V1', and an op of one returned for another read every
    value wrongly)."""
    from . import keys
    if outs_fn is not None:
        return outs_fn
    return tuple((tuple(s.shape), keys.dtype_name(s.dtype)) for s in out_specs)


def aliases_identity(aliases: Any) -> Any:
    """input_output_aliases in an identity: a dict as sorted pairs."""
    if isinstance(aliases, dict):
        return tuple(sorted(aliases.items(), key=repr))
    return aliases


class Op:
    """The base of every numbax op class."""

    #: The op's ``name=`` (None: its function's module and qualified name).
    name: str | None = None
    #: The op's own sharding rule (a sharding_rules.Rule), or None.
    sharding_rule: Any = None
    batch_partitionable: bool = False
    #: Whether ``jax.vmap`` of the op launches the whole batch from one call
    #: of its own, deciding per call whether the slices share one launch
    #: (a kernel's): XLACustomKernel then vmaps it rather than loop.
    vmap_launches_batch: bool = False

    def __call__(self, *args: Any) -> Any:
        """The op applied to its inputs (JAX arrays, and scalars)."""
        raise NotImplementedError

    @property
    def _function(self) -> Any:
        """The user's function the op runs: a kernel, or a callable's func."""
        raise NotImplementedError

    @property
    def profile_name(self) -> str:
        """The op's name in profiles: its ``name=``, else its kernel's or
        func's qualified name. HLO names the op's custom calls after it
        (JAX's profiler, TensorBoard, XLA dumps) and, on a GPU, each call is
        an NVTX range with this name (docs/profiling.md,
        trace/profile_names.py)."""
        return self.name or qualified_name(self._function)

    def use_name(self) -> str | None:
        """The name of the call being traced where it is not the op's own
        :attr:`profile_name`: the XLACustomKernel's whose generator returned
        this op (:func:`named_use`), for an op without ``name=``; else None.
        A call spells it in its key (keys.profile_spec), so that its
        registry entry, and the NVTX range C++ pushes, carry it too."""
        use = _use.get()
        if use is None or use[0] is not self or self.name is not None:
            return None
        return use[1]

    def entry_for_call(self, key: str, call: str, platform: str) -> Any:
        """The registry entry of `key`, a key this process did not trace (a
        deserialised or cached program), built from its `call` part."""
        raise NotImplementedError

    def forget_cached(self) -> None:
        """numbax.clear_caches(): drop what the op caches per call (made
        again from the op when a program needs it)."""

    def with_sharding_rule(self, rule: str) -> Op:
        """The same op made with sharding rule `rule`."""
        raise NotImplementedError
