"""Counters and cache control, for tests and for users chasing performance."""

from __future__ import annotations

from . import _core, _registry


def bridge_counters() -> dict:
    """Calls into Python from XLA, and hits/misses of the array and stream caches."""
    return dict(_core.counters())


def reset_bridge_counters() -> None:
    _core.reset_counters()


def clear_caches() -> None:
    """Drops cached Numba streams and every capture-mode CUDA graph.

    Numba arrays are cached per compiled program and freed with it.
    """
    _core.clear_stream_cache()
    _core.clear_graph_caches()


def set_graph_cache_size(size: int) -> None:
    """How many CUDA graphs each capture-mode call site keeps (LRU, default 16)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"the graph cache size must be an int >= 1, got {size!r}")
    _core.set_graph_cache_size(size)


def graph_cache_size() -> int:
    return int(_core.graph_cache_size())


def registry_size() -> tuple[int, int]:
    """(callables, kernels) currently registered in this process."""
    return _registry.registry_size()
