"""The compilers numbax takes kernels from: numba-cuda and numba-cuda-mlir.

Each is one module implementing base.Compiler (numba_cuda.py,
numba_cuda_mlir.py), listed in :data:`ALL`; a ``numba_cuda_kernel`` op asks
:func:`compiler_of` once for its kernel's. Beside them: what both share
(the generated kernel of a folded vmap: fold.py; the fold reader's PTX and
bytecode scans: grid_reads.py; explicit signatures: signatures.py; a cubin
loaded by the driver: cubin.py), numba-cuda's warm start (kernel_cache.py)
and each compiler's launches from a callable's func at C++ speed
(numba_cuda_launch.py, numba_cuda_mlir_launch.py).
"""

from __future__ import annotations

from typing import Any

from . import numba_cuda, numba_cuda_mlir
from .base import Compiler

#: Every compiler, in the order :func:`compiler_of` asks them.
ALL: tuple[Compiler, ...] = (numba_cuda_mlir.COMPILER, numba_cuda.COMPILER)


def compiler_of(kernel: Any) -> Compiler | None:
    """The compiler whose ``@cuda.jit`` dispatcher `kernel` is, or None."""
    return next((c for c in ALL if c.owns(kernel)), None)


def install_launch_hooks() -> None:
    """Puts numbax's C++ launch path on every compiler's launches from a
    callable's func (each a no-op once done, or until its compiler is
    imported)."""
    for compiler in ALL:
        compiler.install_launch_hook()
