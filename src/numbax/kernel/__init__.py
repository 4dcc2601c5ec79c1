"""numba_cuda_kernel: the op family of one compiled kernel launched from C++.

op.py is the op and the public function; the other modules are what the
op does with a call (op.py's docstring lists them).
"""

from .op import NumbaCudaKernel, numba_cuda_kernel
from .vmap import FoldDecision

__all__ = ["FoldDecision", "NumbaCudaKernel", "numba_cuda_kernel"]
