"""Refuses JAX calls made from inside a func that XLA is running.

A numba_cuda_callable's func runs inside XLA's execution of a program. If it
dispatched JAX work there (an eager jnp call, a jitted function,
jax.device_put...), that work would queue behind the very program that is
waiting for func, and on a GPU it can deadlock; on any backend its results
would live outside the buffers XLA gave func. So while func runs, the C++
bridge makes a trace that raises the current JAX trace of that thread.

Every JAX operation binds a primitive through the current trace, and the
jit C++ fast path keys its cache on the trace too (``trace_state`` is part
of the jit key), so eager calls and jitted calls both reach
``process_primitive`` below and fail with a message that says what to do.

The swap is done from C++ (``_core.set_call_guard``): two thread-local
swaps in and two out per call, no Python frame. If a JAX version moves these
internals, the guard turns itself off rather than break numbax.
"""

from __future__ import annotations

import logging

from .. import _core
from . import compat

_log = logging.getLogger("numbax")

HINT = (
    "a numba_cuda_callable func runs inside XLA's execution of the program, "
    "where dispatching JAX work can deadlock and its results would not land "
    "in func's output buffers. Do the JAX work outside func (before or after "
    "the op, in the same jax.jit), or pass the arrays func needs in as "
    "inputs; inside func use only Numba kernels on the arrays it is given")


def _message(what) -> str:
    return (f"numbax: func called JAX ({what}) while XLA is running it: "
            f"{HINT}")


def _make_trace():
    class NoJaxInsideFuncTrace(compat.trace_base()):  # type: ignore[misc]
        """The current trace while func runs: every JAX operation fails."""

        def _refuse(self, what):
            raise RuntimeError(_message(getattr(what, "name", what)))

        def process_primitive(self, primitive, tracers, params, /):
            self._refuse(primitive)

        def process_call(self, primitive, f, tracers, params, /):
            self._refuse(primitive)

        def process_map(self, primitive, f, tracers, params, /):
            self._refuse(primitive)

        def process_custom_jvp_call(self, primitive, *args, **kwargs):
            self._refuse(primitive)

        def process_custom_vjp_call(self, primitive, *args, **kwargs):
            self._refuse(primitive)

        def process_custom_transpose(self, primitive, *args, **kwargs):
            self._refuse(primitive)

        def stage_value(self, val):
            self._refuse("a constant")

        def __getattr__(self, name):
            # Any other process_* hook a newer JAX adds refuses too.
            if name.startswith("process_"):
                return lambda *args, **kwargs: self._refuse(name[8:])
            raise AttributeError(name)

    return NoJaxInsideFuncTrace()


_pairs: tuple = ()


def guard_pairs() -> tuple:
    """(swap, value, ...): what C++ swaps in around each func call (two
    pairs on jax >= 0.10, one before; compat.current_trace_swaps)."""
    global _pairs
    if not _pairs:
        _pairs = compat.current_trace_swaps(_make_trace())
    return _pairs


def install() -> bool:
    """Turns the guard on for every func call. False if JAX lacks the hooks."""
    try:
        pairs = guard_pairs()
    except Exception as exc:  # pragma: no cover - JAX internals moved
        _log.warning(
            "numbax: cannot guard funcs against calling JAX on this JAX "
            "version (%s: %s); a func that calls JAX may deadlock",
            type(exc).__name__, exc)
        _core.set_call_guard(None)
        return False
    _core.set_call_guard(pairs)
    return True


def uninstall() -> None:
    """Turns the guard off (for measuring its cost)."""
    _core.set_call_guard(None)
