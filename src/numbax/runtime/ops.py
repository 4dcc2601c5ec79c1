"""What every numbax op is to the rest of numbax.

``numba_cuda_kernel`` and ``numba_cuda_callable`` return ops of their own
classes (kernel/op.py, callable/op.py); both derive from :class:`Op`, which
says what other parts ask of an op without importing its family: the
registry builds a key's entry through it and drops what it caches,
``XLACustomKernel`` (custom_kernel/) names it in profiles, remakes it with a
sharding rule and vmaps it.
"""

from __future__ import annotations

from typing import Any


def qualified_name(obj: Any) -> str:
    """``obj``'s ``__qualname__`` (a function, a Numba dispatcher's
    ``py_func``), else its name, else its type's."""
    obj = getattr(obj, "py_func", obj)
    return (getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
            or type(obj).__qualname__)


class Op:
    """The base of every numbax op class."""

    #: The op's ``name=`` (None: its function's module and qualified name).
    name: str | None = None
    #: Set by an XLACustomKernel for the ops its generators return (made
    #: without ``name=``): their profile name is the custom kernel's.
    _profile_tag: str | None = None
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
        return self.name or self._profile_tag or qualified_name(self._function)

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
