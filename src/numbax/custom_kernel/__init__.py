"""XLACustomKernel: the op family of Numba kernels as JAX primitives of their own.

op.py is the public class; op.py's docstring lists what lives beside it.
"""

from .kernels import NUMBA, NUMBA_CUDA
from .op import XLACustomKernel
from .differentiation import is_undefined_primal

__all__ = ["XLACustomKernel", "is_undefined_primal", "NUMBA", "NUMBA_CUDA"]
