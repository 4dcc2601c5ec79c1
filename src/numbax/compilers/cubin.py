"""A kernel as a cubin, loaded by the driver as a context-independent library.

numba-cuda-mlir's kernels (numba_cuda_mlir.py) and numba-cuda kernels from
numbax's warm-start entries (kernel_cache.py) reach C++ this way: the cubin
is loaded once per process (``cuLibraryLoadData``) and each device gets its
CUfunction from the CUkernel (``_core.kernel_function``).
"""

from __future__ import annotations

import threading
from typing import Any

from .. import _core


class CubinKernel:
    """A kernel compiled for one signature and one compute capability: its
    cubin, entry name and the CUkernel once loaded.

    The library is loaded once per process and never unloaded: compiled XLA
    programs keep its functions for their lifetime, which numbax does not
    bound, and unloading a library whose functions a captured CUDA graph
    still launches is undefined."""

    # numba-cuda-mlir's cooperative kernels are refused when compiled; a
    # warm-start entry is never written for one (kernel_cache.py).
    cooperative = False

    def __init__(self, cubin: bytes, entry: str, capability: tuple[int, int],
                 compile_result: Any):
        self.cubin = cubin
        self.entry = entry
        self.capability = capability
        self.compile_result = compile_result  # keeps its metadata alive
        self._kernel: int | None = None
        self._library: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._kernel is not None

    def kernel_handle(self) -> int:
        """The CUkernel (context-independent), loading the cubin once."""
        with self._lock:
            if self._kernel is None:
                from cuda.bindings import driver
                err, library = driver.cuLibraryLoadData(
                    self.cubin, None, None, 0, None, None, 0)
                _check(driver, err, "cuLibraryLoadData")
                err, kernel = driver.cuLibraryGetKernel(
                    library, self.entry.encode())
                _check(driver, err, f"cuLibraryGetKernel({self.entry!r})")
                self._library = library  # owns the kernel: kept alive
                self._kernel = int(kernel)
            return self._kernel

    def function_on(self, ordinal: int, shared_mem: int) -> int:
        """The CUfunction in device `ordinal`'s primary context."""
        return _core.kernel_function(self.kernel_handle(), ordinal,
                                     shared_mem)


def _check(driver, err, what: str) -> None:
    if int(err) != 0:
        _, name = driver.cuGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else name
        raise RuntimeError(f"{what} failed: {name}")
