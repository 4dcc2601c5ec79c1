"""Counters and cache control, for tests and for users chasing performance."""

from __future__ import annotations

from . import _core
from .runtime import registry


def bridge_counters() -> dict[str, int]:
    """What the C++ bridge did since the last :func:`reset_bridge_counters`.

    Returns:
      A dict of counters: ``calls`` (calls of a Python ``func`` from XLA),
      ``errors`` (calls that raised), ``resolves`` (call sites resolved when
      XLA instantiated a program), ``alias_copies`` (aliased outputs XLA
      handed a buffer other than their input's, into which the handler
      copied the input first: docs/reliability.md), ``array_hits``/``array_misses`` and
      ``stream_hits``/``stream_misses`` (the caches of Numba arrays and
      streams of plain calls), ``graph_hits``/``graph_misses``/
      ``graph_evictions`` (numbax's own CUDA graphs of ``capture=True``
      calls, and of per-slice ``numba_cuda_kernel`` batches),
      ``graph_rebinds`` (capture-mode calls whose recorded launches were
      re-bound to buffers at new addresses and replayed without Python) and
      ``graph_rebind_refusals`` (capture-mode call sites found not
      re-bindable, recorded again per set of addresses: see
      :func:`rebind_refusals` for why), and
      ``xla_captures`` (capture-mode calls made while XLA was recording a
      command buffer); ``slice_graph_records``/``slice_graph_replays``
      (vmapped ``numba_cuda_kernel`` batches launched slice by slice that
      numbax recorded into a CUDA graph, and calls that replayed one);
      ``fast_launches`` (kernel launches made
      by a plain callable's func that numbax packed and launched from C++),
      ``cached_launch_plans`` (launch plans built from numbax's entry in the
      kernel's Numba cache rather than from a launch through Numba: one per
      plan recorded, docs/warm_start.md),
      ``fast_launch_fallbacks`` (launches made inside numbax calls that went
      through Numba's own launch) and, per reason, ``fallback_disabled``,
      ``fallback_simulator``, ``fallback_other_thread``,
      ``fallback_other_stream``, ``fallback_foreign_argument``,
      ``fallback_unsupported_kernel``, ``fallback_new_plan``,
      ``fallback_launch_error``, ``fallback_numba_error``,
      ``fallback_plan_error`` and ``fallback_signature_mismatch``
      (docs/fast_launch.md says what each means).
      Counters are process-wide.
    """
    return dict(_core.counters())


def rebind_refusals() -> list[tuple[str, str]]:
    """Why capture-mode ops could not be re-bound to new buffer addresses.

    Returns:
      ``(op key, reason)`` for each call site (per device) whose recording
      numbax found it cannot re-bind, the most recent last, at most 64: a
      launch that went through Numba's own launch, work other than kernel
      launches (a copy, a memset), an address passed as an integer, or
      launches that changed when the buffers moved. Such an op is recorded
      again for each new set of addresses (docs/capture.md).
    """
    return [(str(k), str(w)) for k, w in _core.rebind_refusals()]


def reset_bridge_counters() -> None:
    """Sets every counter of :func:`bridge_counters` back to zero."""
    _core.reset_counters()


def clear_caches() -> None:
    """Drops cached Numba streams, every capture-mode CUDA graph, every
    fast-launch plan (with the kernels and launch configurations it keeps)
    and every op key's registry entry (rebuilt from the key when a program
    needs it again; the registry keeps at most 4096 anyway).

    Numba arrays are cached per compiled program and freed with it.

    Safe to call while other threads run ops: a call that needs what was
    dropped (an entry, a kernel op's simulator launcher) makes it again
    from its op.
    """
    registry.clear_entries()
    _core.clear_stream_cache()
    _core.clear_graph_caches()
    _core.clear_launch_plans()


# Far beyond any useful number of CUDA graphs per call site, and within the
# C++ size type on every platform.
MAX_GRAPH_CACHE_SIZE = 2**31 - 1


def set_graph_cache_size(size: int) -> None:
    """How many CUDA graphs each capture-mode call site keeps (LRU, default 16).

    A ``capture=True`` op that XLA does not record into its own command
    buffers keeps one graph per device and set of buffer addresses; beyond
    ``size`` the least recently used is destroyed. Applies to every call
    site, existing and future.

    Args:
      size: the number of graphs per call site, an int from 1 to 2**31 - 1.

    Raises:
      ValueError: ``size`` is not an int in that range.
    """
    if isinstance(size, bool) or not isinstance(size, int) or not (
            1 <= size <= MAX_GRAPH_CACHE_SIZE):
        raise ValueError(
            f"the graph cache size must be an int >= 1 and <= "
            f"{MAX_GRAPH_CACHE_SIZE}, got {size!r}")
    _core.set_graph_cache_size(size)


def graph_cache_size() -> int:
    """The number of CUDA graphs each capture-mode call site keeps (see
    :func:`set_graph_cache_size`)."""
    return int(_core.graph_cache_size())


def registry_size() -> tuple[int, int]:
    """``(callables, kernels)``: how many op registrations this process holds.

    One registration exists per op and call signature (shapes and dtypes);
    it is dropped when the op's function is garbage-collected. A number that
    keeps growing in a steady loop means ops are being re-created per call.
    """
    return registry.registry_size()
