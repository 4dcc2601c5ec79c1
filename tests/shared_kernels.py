"""The small kernels many test files launch, defined once.

Import them by name (tests/ is on sys.path, for the tests and for the fresh
processes they start): ``from shared_kernels import affine``. A kernel that a
test needs to be distinct (its own compile cache, its own op key, a body a
test inspects) stays in that test file.
"""

import numba
from numba import cuda


@cuda.jit
def affine(x, out):
    """out = 2 * x + 1, one thread per element of a 1-D array."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = 2 * x[i] + 1


def launch_affine(x, out, stream):
    """A numba_cuda_callable func: affine over 32 elements on `stream`."""
    affine[1, 32, stream](x, out)


@cuda.jit
def adds_text(x, out):
    """A kernel Numba cannot type (a float plus a str): its compile fails."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + "text"


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
def matrix_add(a, b, out):
    """out = a + b over out's 2-D extent, one thread per element."""
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = a[i, j] + b[i, j]


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


@cuda.jit
def reverse(x, out):
    """out = x reversed, one thread per element: each reads another's."""
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        out[i] = x[n - 1 - i]


@cuda.jit
def stencil(x, w, out):
    """out = a 3-point stencil of x with weights w (zero outside)."""
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        left = x[i - 1] if i > 0 else 0
        right = x[i + 1] if i < n - 1 else 0
        out[i] = w[0] * left + w[1] * x[i] + w[2] * right


@cuda.jit
def stencil_reads_grid(x, w, out):
    """stencil, plus a read of gridDim.y/z (both 1 in an unbatched launch):
    the kernel reads every grid axis, so vmap launches it once per slice."""
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        left = x[i - 1] if i > 0 else 0
        right = x[i + 1] if i < n - 1 else 0
        out[i] = (w[0] * left + w[1] * x[i] + w[2] * right
                  + cuda.gridDim.y + cuda.gridDim.z - 2)


@cuda.jit
def block_sums(x, out):
    """out[b] = the sum of block b's elements of x, reduced in dynamic
    shared memory (one float32 per thread, sized by the launch)."""
    buf = cuda.shared.array(0, dtype=numba.float32)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    buf[tid] = x[i] if i < x.shape[0] else 0
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            buf[tid] += buf[tid + stride]
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        out[cuda.blockIdx.x] = buf[0]


@cuda.jit
def mirror_sum(x, doubled, out):
    """doubled = 2 * x, then out[i] = doubled[i] + doubled[n - 1 - i]:
    every block must finish phase 1 before any reads phase 2's inputs, so
    only a cooperative launch (grid.sync()) makes it correct."""
    grid = cuda.cg.this_grid()
    i = cuda.grid(1)
    n = x.shape[0]
    if i < n:
        doubled[i] = 2 * x[i]
    grid.sync()
    if i < n:
        out[i] = doubled[i] + doubled[n - 1 - i]
