"""The Numba kernel every Numba-based row launches.

A module of its own, with numba.cuda as a module global, so that Numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1) can swap in its fake `cuda` module.
"""

import numba
from numba import cuda


@cuda.jit
def affine(x, y):
    """y = 2x + 1, one element per thread."""
    i = cuda.grid(1)
    if i < x.size:
        y[i] = numba.float32(2.0) * x[i] + numba.float32(1.0)
