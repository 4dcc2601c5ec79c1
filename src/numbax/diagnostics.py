"""Counters and cache control, for tests and for users chasing performance."""

from __future__ import annotations

from . import _core, _registry


def bridge_counters() -> dict:
    """Calls into Python from XLA, and hits/misses of the array and stream caches."""
    return dict(_core.counters())


def reset_bridge_counters() -> None:
    _core.reset_counters()


def clear_caches() -> None:
    """Drops cached Numba streams (arrays are cached per compiled program)."""
    _core.clear_stream_cache()


def registry_size() -> tuple[int, int]:
    """(callables, kernels) currently registered in this process."""
    return _registry.registry_size()
