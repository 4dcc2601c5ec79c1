"""numba_kernel: the op family of a Numba @njit kernel on JAX's CPU backend.

op.py is the op and the public function; wrapper.py the generated @cfunc
wrapper the C++ handler calls; primitive.py the primitive its calls bind;
vmap.py its batching rule.
"""

from .op import NumbaKernel, numba_kernel

__all__ = ["NumbaKernel", "numba_kernel"]
