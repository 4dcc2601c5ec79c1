"""numbax: Numba CUDA kernels, and Python functions that launch them, as XLA ops."""

from ._version import __version__
from ._numba import simulator_enabled
from .callable import numba_cuda_callable
from .kernel import numba_cuda_kernel
from .custom_kernel import XLACustomKernel
from .export import export_disabled_checks
from .diagnostics import (bridge_counters, clear_caches, graph_cache_size,
                          registry_size, reset_bridge_counters,
                          set_graph_cache_size)

__all__ = [
    "__version__",
    "numba_cuda_callable",
    "numba_cuda_kernel",
    "export_disabled_checks",
    "XLACustomKernel",
    "bridge_counters",
    "clear_caches",
    "graph_cache_size",
    "registry_size",
    "reset_bridge_counters",
    "set_graph_cache_size",
    "simulator_enabled",
]
