"""numbax: Numba CUDA kernels, and Python functions that launch them, as XLA ops."""

from ._version import __version__
from .runtime import compat as _compat

# An unsupported JAX (or an extension built for a newer jaxlib) fails here,
# naming the versions that work, rather than inside XLA on the first call.
# `python -m numbax info` still imports, to report the same problem.
_jax_problem = _compat.current_problem()
if _jax_problem is not None and not _compat.running_cli():
    _compat.check()

from .runtime.numba_bridge import simulator_enabled  # noqa: E402

if _jax_problem is None:
    from .callable import numba_cuda_callable
    from .kernel import numba_cuda_kernel
    from .cpu_kernel import numba_kernel
    from .custom_kernel import XLACustomKernel
    from .export import export_disabled_checks
    from .diagnostics import (bridge_counters, clear_caches, graph_cache_size,
                              registry_size, reset_bridge_counters,
                              set_graph_cache_size)

__all__ = [
    "__version__",
    "numba_cuda_callable",
    "numba_cuda_kernel",
    "numba_kernel",
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
