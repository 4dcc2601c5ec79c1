"""The benchmark's kernel (kernels.affine), compiled by numba-cuda-mlir.

Its own module because each compiler reads ``cuda`` from the kernel's
globals; imported only by the numba-cuda-mlir rows (importing
numba_cuda_mlir takes seconds, and it is optional).
"""

from numba_cuda_mlir import cuda


@cuda.jit
def affine(x, y):
    """y = 2x + 1, one element per thread (2x + 1 is exact before the one
    rounding to float32, so it equals kernels.affine's float32 result)."""
    i = cuda.grid(1)  # type: ignore[attr-defined]  # numba-cuda-mlir's own typing
    if i < x.shape[0]:
        y[i] = 2.0 * x[i] + 1.0
