"""numba_cuda_callable: the op family of a Python function that launches kernels.

op.py is the op and the public function; primitive.py the primitive its
traced calls bind, vmap.py what ``vmap_method`` means, inputcheck.py
NUMBAX_CHECK_INPUTS.
"""

from .op import NumbaCudaCallable, numba_cuda_callable

__all__ = ["NumbaCudaCallable", "numba_cuda_callable"]
