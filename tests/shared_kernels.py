"""The small kernels many test files launch, defined once.

Import them by name (tests/ is on sys.path, for the tests and for the fresh
processes they start): ``from shared_kernels import affine``. A kernel that a
test needs to be distinct (its own compile cache, its own op key, a body a
test inspects) stays in that test file.
"""

from numba import cuda


@cuda.jit
def affine(x, out):
    """out = 2 * x + 1, one thread per element of a 1-D array."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = 2 * x[i] + 1


@cuda.jit
def add_one(x, out):
    """out = x + 1, one thread per element of a 1-D array."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 1


@cuda.jit
def copy_2d(a, out):
    """out = a over out's 2-D extent, one thread per element."""
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = a[i, j]


@cuda.jit
def row_scale(m, s, out):
    """out[i, j] = m[i, j] * s[i] + j, one thread per row."""
    i = cuda.grid(1)
    if i < m.shape[0]:
        for j in range(m.shape[1]):
            out[i, j] = m[i, j] * s[i] + j


@cuda.jit
def matvec(m, v, out):
    """out = m @ v, one thread per row."""
    i = cuda.grid(1)
    if i < m.shape[0]:
        acc = 0.0
        for j in range(m.shape[1]):
            acc += m[i, j] * v[j]
        out[i] = acc


# Compiled for one explicit signature each (Numba compiles them at import):
# any other argument type is refused, never launched.

@cuda.jit("void(float32[:], float32[:])")
def affine_f32(x, out):
    """out = 2 * x + 1 for float32[:] alone."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 2 + 1


@cuda.jit("void(float32[:,:], float32[:,:])")
def affine_cols_f32(x, out):
    """out[i, j] = 2 * x[i, j] + j for float32[:,:] alone, one thread per element."""
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        out[i, j] = x[i, j] * 2 + j
